package enginesim

import (
	"fmt"
	"math"

	"github.com/kvindex/kvindex/internal/events"
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
	// event converts to the form events.EncodeWith writes.
	event() (events.Event, error)
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
	// TokenIDs are the tokens of the blocks (BlockSize per block); nil (an
	// empty array on the wire) for an offload placeholder.
	TokenIDs []int64
	// BlockSize is the block size in tokens; 0 for an offload placeholder.
	// Encoding fails for a value outside [0, 2^32).
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

// specKind is the kv_cache_spec_kind of every BlockStored: the simulated
// engine serves a plain model, one full-attention KV-cache group.
const specKind = "full_attention"

// Encode returns the batch in vLLM's newer tagged-map encoding with integer
// hashes.
func (b Batch) Encode() ([]byte, error) { return b.EncodeWith(EncodeOptions{}) }

// EncodeWith returns the batch in the encoding opts selects, written by the
// project's encoder (events.EncodeWith), with every BlockStored carrying
// kv_cache_spec_kind "full_attention" as newer vLLM does. It fails for a
// nil event, an event type this package does not define, or a BlockSize
// out of range.
func (b Batch) EncodeWith(opts EncodeOptions) ([]byte, error) {
	eb := events.Batch{TS: b.TS, Rank: b.Rank, HasRank: b.HasRank, Events: make([]events.Event, len(b.Events))}
	for i, ev := range b.Events {
		if ev == nil {
			return nil, fmt.Errorf("enginesim: event %d is nil", i)
		}
		e, err := ev.event()
		if err != nil {
			return nil, fmt.Errorf("enginesim: event %d (%s): %w", i, ev.Tag(), err)
		}
		e.Index = i
		eb.Events[i] = e
	}
	eo := events.EncodeOptions{KVCacheSpecKind: specKind}
	if opts.Arrays {
		eo.Encoding = events.EncodingArray
	}
	if opts.Digests {
		eo.Hashes = events.HashDigest
	}
	p, err := events.EncodeWith(eb, eo)
	if err != nil {
		return nil, fmt.Errorf("enginesim: %w", err)
	}
	return p, nil
}

// MustEncode is Encode for tests and benchmarks whose batches are built in
// code: it panics on an error, which only a foreign or nil Event or an
// out-of-range BlockSize causes.
func (b Batch) MustEncode() []byte {
	p, err := b.Encode()
	if err != nil {
		panic(err)
	}
	return p
}

func (s BlockStored) event() (events.Event, error) {
	if s.BlockSize < 0 || s.BlockSize > math.MaxUint32 {
		return events.Event{}, fmt.Errorf("block size %d out of range [0, %d]", s.BlockSize, uint32(math.MaxUint32))
	}
	return events.Event{
		Type:        events.BlockStored,
		BlockHashes: s.BlockHashes,
		ParentHash:  s.ParentHash,
		HasParent:   s.HasParent,
		TokenIDs:    s.TokenIDs,
		BlockSize:   uint32(s.BlockSize),
		Medium:      s.Medium,
		LoraName:    s.LoraName,
		GroupIdx:    int64(s.GroupIdx),
	}, nil
}

func (r BlockRemoved) event() (events.Event, error) {
	return events.Event{Type: events.BlockRemoved, BlockHashes: r.BlockHashes, Medium: r.Medium, GroupIdx: int64(r.GroupIdx)}, nil
}

func (AllBlocksCleared) event() (events.Event, error) {
	return events.Event{Type: events.AllBlocksCleared}, nil
}
