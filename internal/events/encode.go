package events

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Encoding selects how Encode writes events.
type Encoding uint8

// The two event encodings vLLM has used.
const (
	// EncodingMap writes tagged maps {"type": "BlockStored", ...} (newer
	// vLLM).
	EncodingMap Encoding = iota
	// EncodingArray writes tagged arrays ["BlockStored", ...] in field
	// declaration order (older vLLM, msgspec array_like).
	EncodingArray
)

// HashForm selects how EncodeWith writes block hashes (block_hashes and
// parent_block_hash). Every form decodes to the same 64-bit hash (DESIGN
// "Event wire format").
type HashForm uint8

// The hash forms engines send.
const (
	// HashUint64 writes a msgpack unsigned integer (vLLM's int hashes).
	HashUint64 HashForm = iota
	// HashInt64 writes the hash reinterpreted as a signed 64-bit integer,
	// negative when its top bit is set (SGLang).
	HashInt64
	// HashDigest writes a DigestLen-byte msgpack bin whose last 8 bytes,
	// big-endian, are the hash (vLLM's sha256 hashes before their
	// conversion to int). The other bytes are filler derived from the
	// hash, so equal hashes give equal digests.
	HashDigest
)

// DigestLen is the length of the byte digests HashDigest writes (a sha256
// digest).
const DigestLen = 32

// EncodeOptions selects among the wire details real engines differ in. The
// zero value is Encode's output with EncodingMap: tagged maps, unsigned
// integer hashes, no kv_cache_spec_kind.
type EncodeOptions struct {
	// Encoding is the event encoding. Default (zero) EncodingMap.
	Encoding Encoding
	// Hashes is the form of every block hash. Default (zero) HashUint64.
	Hashes HashForm
	// KVCacheSpecKind, when non-empty, is written as the kv_cache_spec_kind
	// field of every BlockStored whose own Event.KVCacheSpecKind is empty
	// (after group_idx; newer vLLM sends "full_attention" for plain
	// models). Default "": such stores leave the field out, as older
	// engines do.
	KVCacheSpecKind string
	// BatchMap writes the batch as a map {"ts", "events",
	// "data_parallel_rank"} with the rank left out when !HasRank, as
	// vLLM's newest EventBatch (not array_like) is sent. Default false:
	// the array [ts, events, data_parallel_rank].
	BatchMap bool
}

// Encode writes b as a vLLM KVEventBatch payload, the inverse of Decode:
// [ts, events, data_parallel_rank] with rank nil when !b.HasRank, hashes as
// uint64, a nil parent when !HasParent, a nil medium when Medium is empty.
// Simulators, benchmarks and tests use it to produce the wire format model
// servers publish; Tier is not encoded (the medium carries it). It is
// EncodeWith with only the Encoding set.
func Encode(b Batch, enc Encoding) ([]byte, error) {
	return EncodeWith(b, EncodeOptions{Encoding: enc})
}

// EncodeWith writes b as Encode does, in the wire details opts selects.
// Event.Index and Event.Tier are not encoded (a TierBlocksCleared carries
// its Medium); token_ids is always an array (empty for an offload
// placeholder), lora_id always nil, extra_keys nil unless HasExtraKeys
// (then ExtraKeysLen entries: ExtraKeys[i], or nil where ExtraKeys is nil).
// It fails, wrapping no sentinel, for an unknown Encoding or
// HashForm and for an event of an unknown Type.
func EncodeWith(b Batch, opts EncodeOptions) ([]byte, error) {
	if opts.Encoding > EncodingArray {
		return nil, fmt.Errorf("events: encoding a batch: unknown encoding %d", opts.Encoding)
	}
	if opts.Hashes > HashDigest {
		return nil, fmt.Errorf("events: encoding a batch: unknown hash form %d", opts.Hashes)
	}
	var buf bytes.Buffer
	w := &writer{Encoder: msgpack.NewEncoder(&buf), opts: opts}
	if err := w.batch(b); err != nil {
		return nil, fmt.Errorf("events: encoding a batch: %w", err)
	}
	return buf.Bytes(), nil
}

// writer is a msgpack encoder with the options of one EncodeWith call.
type writer struct {
	*msgpack.Encoder
	opts EncodeOptions
}

func (w *writer) batch(b Batch) error {
	events := func() error {
		if err := w.EncodeArrayLen(len(b.Events)); err != nil {
			return err
		}
		for i := range b.Events {
			if err := w.event(i, &b.Events[i]); err != nil {
				return err
			}
		}
		return nil
	}
	if w.opts.BatchMap {
		n := 2
		if b.HasRank {
			n = 3
		}
		if err := w.EncodeMapLen(n); err != nil {
			return err
		}
		if err := w.EncodeString("ts"); err != nil {
			return err
		}
		if err := w.EncodeFloat64(b.TS); err != nil {
			return err
		}
		if err := w.EncodeString("events"); err != nil {
			return err
		}
		if err := events(); err != nil {
			return err
		}
		if !b.HasRank {
			return nil
		}
		if err := w.EncodeString("data_parallel_rank"); err != nil {
			return err
		}
		return w.EncodeUint(uint64(b.Rank))
	}
	if err := w.EncodeArrayLen(3); err != nil {
		return err
	}
	if err := w.EncodeFloat64(b.TS); err != nil {
		return err
	}
	if err := events(); err != nil {
		return err
	}
	if !b.HasRank {
		return w.EncodeNil()
	}
	return w.EncodeUint(uint64(b.Rank))
}

// field is one (name, value) of an event in declaration order.
type field struct {
	name  string
	value func() error
}

func (w *writer) event(i int, ev *Event) error {
	var fields []field
	hashes := func() error { return w.hashes(ev.BlockHashes) }
	group := func() error { return w.EncodeInt(ev.GroupIdx) }
	switch ev.Type {
	case BlockStored:
		fields = []field{
			{"block_hashes", hashes},
			{"parent_block_hash", func() error {
				if !ev.HasParent {
					return w.EncodeNil()
				}
				return w.hash(ev.ParentHash)
			}},
			{"token_ids", func() error {
				if err := w.EncodeArrayLen(len(ev.TokenIDs)); err != nil {
					return err
				}
				for _, t := range ev.TokenIDs {
					if err := w.EncodeInt(t); err != nil {
						return err
					}
				}
				return nil
			}},
			{"block_size", func() error { return w.EncodeUint(uint64(ev.BlockSize)) }},
			{"lora_id", w.EncodeNil},
			{"medium", func() error { return w.optString(ev.Medium) }},
			{"lora_name", func() error { return w.optString(ev.LoraName) }},
			{"extra_keys", func() error { return w.extraKeys(ev) }},
			{"group_idx", group},
		}
		kind := ev.KVCacheSpecKind
		if kind == "" {
			kind = w.opts.KVCacheSpecKind
		}
		if kind != "" {
			fields = append(fields, field{"kv_cache_spec_kind", func() error { return w.EncodeString(kind) }})
		}
	case BlockRemoved:
		fields = []field{
			{"block_hashes", hashes},
			{"medium", func() error { return w.optString(ev.Medium) }},
			{"group_idx", group},
		}
	case TierBlocksCleared:
		fields = []field{{"medium", func() error { return w.optString(ev.Medium) }}}
	case AllBlocksCleared:
	default:
		return fmt.Errorf("event %d: unknown type %v", i, ev.Type)
	}
	tag := ev.Type.String()
	if w.opts.Encoding == EncodingArray {
		if err := w.EncodeArrayLen(1 + len(fields)); err != nil {
			return err
		}
		if err := w.EncodeString(tag); err != nil {
			return err
		}
		for _, f := range fields {
			if err := f.value(); err != nil {
				return err
			}
		}
		return nil
	}
	if err := w.EncodeMapLen(1 + len(fields)); err != nil {
		return err
	}
	if err := w.EncodeString("type"); err != nil {
		return err
	}
	if err := w.EncodeString(tag); err != nil {
		return err
	}
	for _, f := range fields {
		if err := w.EncodeString(f.name); err != nil {
			return err
		}
		if err := f.value(); err != nil {
			return err
		}
	}
	return nil
}

func (w *writer) hashes(hs []uint64) error {
	if err := w.EncodeArrayLen(len(hs)); err != nil {
		return err
	}
	for _, h := range hs {
		if err := w.hash(h); err != nil {
			return err
		}
	}
	return nil
}

// hash writes one block hash in the configured form.
func (w *writer) hash(h uint64) error {
	switch w.opts.Hashes {
	case HashInt64:
		return w.EncodeInt(int64(h))
	case HashDigest:
		return w.EncodeBytes(digestOf(h))
	}
	return w.EncodeUint(h)
}

// digestOf returns the DigestLen-byte digest form of hash h that HashDigest
// writes: filler derived from h, then h big-endian in the last 8 bytes, the
// bytes the decoder reads back.
func digestOf(h uint64) []byte {
	d := make([]byte, DigestLen)
	for i := range DigestLen - 8 {
		d[i] = byte(h>>(i%8*8)) ^ byte(i)
	}
	binary.BigEndian.PutUint64(d[DigestLen-8:], h)
	return d
}

func (w *writer) optString(s string) error {
	if s == "" {
		return w.EncodeNil()
	}
	return w.EncodeString(s)
}

// extraKeys writes ev's extra_keys: nil without HasExtraKeys, else
// ExtraKeysLen entries, each nil or an array of the block's keys.
func (w *writer) extraKeys(ev *Event) error {
	if !ev.HasExtraKeys {
		return w.EncodeNil()
	}
	if err := w.EncodeArrayLen(ev.ExtraKeysLen); err != nil {
		return err
	}
	for i := 0; i < ev.ExtraKeysLen; i++ {
		var keys []Extra
		if i < len(ev.ExtraKeys) {
			keys = ev.ExtraKeys[i]
		}
		if keys == nil {
			if err := w.EncodeNil(); err != nil {
				return err
			}
			continue
		}
		if err := w.EncodeArrayLen(len(keys)); err != nil {
			return err
		}
		for _, k := range keys {
			var err error
			switch k.Kind {
			case ExtraString:
				err = w.EncodeString(string(k.Data))
			case ExtraBytes:
				err = w.EncodeBytes(k.Data)
			case ExtraInt:
				if len(k.Data) != 8 {
					err = fmt.Errorf("int extra key of %d bytes, want 8", len(k.Data))
					break
				}
				err = w.EncodeInt(int64(binary.LittleEndian.Uint64(k.Data)))
			default:
				err = fmt.Errorf("extra key of unknown kind %d", k.Kind)
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}
