package events

import (
	"bytes"
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

// Encode writes b as a vLLM KVEventBatch payload, the inverse of Decode:
// [ts, events, data_parallel_rank] with rank nil when !b.HasRank, hashes as
// uint64, a nil parent when !HasParent, a nil medium when Medium is empty.
// Simulators, benchmarks and tests use it to produce the wire format model
// servers publish; Tier is not encoded (the medium carries it).
func Encode(b Batch, enc Encoding) ([]byte, error) {
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	if err := encodeBatch(e, b, enc); err != nil {
		return nil, fmt.Errorf("events: encoding a batch: %w", err)
	}
	return buf.Bytes(), nil
}

func encodeBatch(e *msgpack.Encoder, b Batch, enc Encoding) error {
	if err := e.EncodeArrayLen(3); err != nil {
		return err
	}
	if err := e.EncodeFloat64(b.TS); err != nil {
		return err
	}
	if err := e.EncodeArrayLen(len(b.Events)); err != nil {
		return err
	}
	for i := range b.Events {
		if err := encodeEvent(e, &b.Events[i], enc); err != nil {
			return err
		}
	}
	if !b.HasRank {
		return e.EncodeNil()
	}
	return e.EncodeUint(uint64(b.Rank))
}

// field is one (name, value) of an event in declaration order.
type field struct {
	name  string
	value func(*msgpack.Encoder) error
}

func encodeEvent(e *msgpack.Encoder, ev *Event, enc Encoding) error {
	var fields []field
	hashes := func(e *msgpack.Encoder) error {
		if err := e.EncodeArrayLen(len(ev.BlockHashes)); err != nil {
			return err
		}
		for _, h := range ev.BlockHashes {
			if err := e.EncodeUint(h); err != nil {
				return err
			}
		}
		return nil
	}
	optStr := func(s string) func(*msgpack.Encoder) error {
		return func(e *msgpack.Encoder) error {
			if s == "" {
				return e.EncodeNil()
			}
			return e.EncodeString(s)
		}
	}
	group := func(e *msgpack.Encoder) error { return e.EncodeInt(ev.GroupIdx) }
	switch ev.Type {
	case BlockStored:
		fields = []field{
			{"block_hashes", hashes},
			{"parent_block_hash", func(e *msgpack.Encoder) error {
				if !ev.HasParent {
					return e.EncodeNil()
				}
				return e.EncodeUint(ev.ParentHash)
			}},
			{"token_ids", func(e *msgpack.Encoder) error {
				if err := e.EncodeArrayLen(len(ev.TokenIDs)); err != nil {
					return err
				}
				for _, t := range ev.TokenIDs {
					if err := e.EncodeInt(t); err != nil {
						return err
					}
				}
				return nil
			}},
			{"block_size", func(e *msgpack.Encoder) error { return e.EncodeUint(uint64(ev.BlockSize)) }},
			{"lora_id", func(e *msgpack.Encoder) error { return e.EncodeNil() }},
			{"medium", optStr(ev.Medium)},
			{"lora_name", optStr(ev.LoraName)},
			{"extra_keys", func(e *msgpack.Encoder) error {
				if err := e.EncodeArrayLen(len(ev.BlockHashes)); err != nil {
					return err
				}
				for range ev.BlockHashes {
					if err := e.EncodeNil(); err != nil {
						return err
					}
				}
				return nil
			}},
			{"group_idx", group},
		}
	case BlockRemoved:
		fields = []field{{"block_hashes", hashes}, {"medium", optStr(ev.Medium)}, {"group_idx", group}}
	case AllBlocksCleared:
	default:
		return fmt.Errorf("event %d: unknown type %v", ev.Index, ev.Type)
	}
	tag := ev.Type.String()
	if enc == EncodingArray {
		if err := e.EncodeArrayLen(1 + len(fields)); err != nil {
			return err
		}
		if err := e.EncodeString(tag); err != nil {
			return err
		}
		for _, f := range fields {
			if err := f.value(e); err != nil {
				return err
			}
		}
		return nil
	}
	if err := e.EncodeMapLen(1 + len(fields)); err != nil {
		return err
	}
	if err := e.EncodeString("type"); err != nil {
		return err
	}
	if err := e.EncodeString(tag); err != nil {
		return err
	}
	for _, f := range fields {
		if err := e.EncodeString(f.name); err != nil {
			return err
		}
		if err := f.value(e); err != nil {
			return err
		}
	}
	return nil
}
