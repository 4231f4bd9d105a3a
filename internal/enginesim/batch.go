package enginesim

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Batch is one KVEventBatch as vLLM publishes it: msgpack
// [ts, events, data_parallel_rank] (DESIGN "Event wire format").
type Batch struct {
	// TS is the batch timestamp in seconds since the Unix epoch (vLLM's
	// time.time()); encoded as a float64.
	TS float64
	// Events are encoded in order.
	Events []Event
	// Rank is the data_parallel_rank; encoded only when HasRank, else nil.
	Rank uint32
	// HasRank says whether Rank is set (vLLM sends nil without data
	// parallelism).
	HasRank bool
}

// Event is a KV event that a Batch can carry: *BlockStored, *BlockRemoved or
// *AllBlocksCleared (or their values).
type Event interface {
	// Tag is the event's wire type tag ("BlockStored", ...).
	Tag() string
	encode(e *encoder) error
}

// BlockStored reports blocks that became present on a tier.
type BlockStored struct {
	// BlockHashes are the stored blocks in prefix order, 64-bit form.
	BlockHashes []uint64
	// ParentHash is the block before BlockHashes[0]; encoded only when
	// HasParent, else nil.
	ParentHash uint64
	// HasParent says whether ParentHash is set.
	HasParent bool
	// TokenIDs are the tokens of the blocks (BlockSize per block); nil for
	// an offload placeholder.
	TokenIDs []int64
	// BlockSize is the block size in tokens; 0 for an offload placeholder.
	BlockSize int
	// Medium is the tier's medium string ("GPU", "CPU", "DISK", ...); ""
	// encodes nil, which means GPU.
	Medium string
	// LoraName is the adapter name; "" encodes nil.
	LoraName string
	// GroupIdx is the KV-cache group; 0 for the only group of a plain
	// model.
	GroupIdx int
}

// Tag returns "BlockStored".
func (BlockStored) Tag() string { return "BlockStored" }

// BlockRemoved reports blocks evicted from a tier.
type BlockRemoved struct {
	// BlockHashes are the removed blocks, 64-bit form.
	BlockHashes []uint64
	// Medium is the tier's medium string; "" encodes nil (GPU).
	Medium string
	// GroupIdx is the KV-cache group.
	GroupIdx int
}

// Tag returns "BlockRemoved".
func (BlockRemoved) Tag() string { return "BlockRemoved" }

// AllBlocksCleared reports that the engine dropped every block of every
// tier.
type AllBlocksCleared struct{}

// Tag returns "AllBlocksCleared".
func (AllBlocksCleared) Tag() string { return "AllBlocksCleared" }

// EncodeOptions selects among the encodings real engines use.
type EncodeOptions struct {
	// Arrays selects the tagged-array event encoding of older vLLM
	// (["BlockStored", block_hashes, ...]); false selects the tagged map
	// of newer vLLM ({"type": "BlockStored", "block_hashes": ...}).
	Arrays bool
	// Digests encodes every block hash as a 32-byte digest whose last 8
	// bytes, big-endian, are the 64-bit hash (vLLM's sha256 hashes before
	// their conversion to int); false encodes msgpack integers.
	Digests bool
}

// Encode returns the batch in vLLM's newer tagged-map encoding with integer
// hashes.
func (b Batch) Encode() ([]byte, error) { return b.EncodeWith(EncodeOptions{}) }

// EncodeWith returns the batch in the encoding opts selects. It fails only
// for an event type this package does not define.
func (b Batch) EncodeWith(opts EncodeOptions) ([]byte, error) {
	var buf bytes.Buffer
	e := &encoder{Encoder: msgpack.NewEncoder(&buf), opts: opts}
	if err := e.batch(b); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// MustEncode is Encode for tests and benchmarks whose batches are built in
// code: it panics on an error, which only a foreign Event type causes.
func (b Batch) MustEncode() []byte {
	p, err := b.Encode()
	if err != nil {
		panic(err)
	}
	return p
}

type encoder struct {
	*msgpack.Encoder
	opts EncodeOptions
}

func (e *encoder) batch(b Batch) error {
	if err := e.EncodeArrayLen(3); err != nil {
		return err
	}
	if err := e.EncodeFloat64(b.TS); err != nil {
		return err
	}
	if err := e.EncodeArrayLen(len(b.Events)); err != nil {
		return err
	}
	for i, ev := range b.Events {
		if ev == nil {
			return fmt.Errorf("enginesim: event %d is nil", i)
		}
		if err := ev.encode(e); err != nil {
			return fmt.Errorf("enginesim: event %d (%s): %w", i, ev.Tag(), err)
		}
	}
	if !b.HasRank {
		return e.EncodeNil()
	}
	return e.EncodeUint(uint64(b.Rank))
}

// field writes one named field: its key in the map encoding, nothing extra
// in the array encoding (position carries the name).
func (e *encoder) field(name string, value func() error) error {
	if !e.opts.Arrays {
		if err := e.EncodeString(name); err != nil {
			return err
		}
	}
	return value()
}

// open starts an event with n fields after the tag.
func (e *encoder) open(tag string, n int) error {
	if e.opts.Arrays {
		if err := e.EncodeArrayLen(n + 1); err != nil {
			return err
		}
		return e.EncodeString(tag)
	}
	if err := e.EncodeMapLen(n + 1); err != nil {
		return err
	}
	if err := e.EncodeString("type"); err != nil {
		return err
	}
	return e.EncodeString(tag)
}

func (e *encoder) hash(h uint64) error {
	if !e.opts.Digests {
		return e.EncodeUint(h)
	}
	var d [32]byte
	// Bytes other than the last 8 are filler a real digest would have.
	for i := range 24 {
		d[i] = byte(h>>(i%8*8)) ^ byte(i)
	}
	binary.BigEndian.PutUint64(d[24:], h)
	return e.EncodeBytes(d[:])
}

func (e *encoder) hashes(hs []uint64) error {
	if err := e.EncodeArrayLen(len(hs)); err != nil {
		return err
	}
	for _, h := range hs {
		if err := e.hash(h); err != nil {
			return err
		}
	}
	return nil
}

func (e *encoder) optString(s string) error {
	if s == "" {
		return e.EncodeNil()
	}
	return e.EncodeString(s)
}

func (s BlockStored) encode(e *encoder) error {
	// vLLM's field order: block_hashes, parent_block_hash, token_ids,
	// block_size, lora_id, medium, lora_name, extra_keys, group_idx,
	// kv_cache_spec_kind.
	if err := e.open(s.Tag(), 10); err != nil {
		return err
	}
	steps := []struct {
		name  string
		value func() error
	}{
		{"block_hashes", func() error { return e.hashes(s.BlockHashes) }},
		{"parent_block_hash", func() error {
			if !s.HasParent {
				return e.EncodeNil()
			}
			return e.hash(s.ParentHash)
		}},
		{"token_ids", func() error {
			if s.TokenIDs == nil {
				return e.EncodeNil()
			}
			if err := e.EncodeArrayLen(len(s.TokenIDs)); err != nil {
				return err
			}
			for _, t := range s.TokenIDs {
				if err := e.EncodeInt(t); err != nil {
					return err
				}
			}
			return nil
		}},
		{"block_size", func() error { return e.EncodeInt(int64(s.BlockSize)) }},
		{"lora_id", e.EncodeNil},
		{"medium", func() error { return e.optString(s.Medium) }},
		{"lora_name", func() error { return e.optString(s.LoraName) }},
		{"extra_keys", func() error {
			if err := e.EncodeArrayLen(len(s.BlockHashes)); err != nil {
				return err
			}
			for range s.BlockHashes {
				if err := e.EncodeNil(); err != nil {
					return err
				}
			}
			return nil
		}},
		{"group_idx", func() error { return e.EncodeInt(int64(s.GroupIdx)) }},
		{"kv_cache_spec_kind", func() error { return e.EncodeString("full_attention") }},
	}
	for _, st := range steps {
		if err := e.field(st.name, st.value); err != nil {
			return err
		}
	}
	return nil
}

func (r BlockRemoved) encode(e *encoder) error {
	if err := e.open(r.Tag(), 3); err != nil {
		return err
	}
	if err := e.field("block_hashes", func() error { return e.hashes(r.BlockHashes) }); err != nil {
		return err
	}
	if err := e.field("medium", func() error { return e.optString(r.Medium) }); err != nil {
		return err
	}
	return e.field("group_idx", func() error { return e.EncodeInt(int64(r.GroupIdx)) })
}

func (c AllBlocksCleared) encode(e *encoder) error { return e.open(c.Tag(), 0) }
