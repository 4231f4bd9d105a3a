package events

import (
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// realisticBatch builds the batch BENCHMARKS.md describes: 64 BlockStored
// events of one 16-token block each, in vLLM's tagged-map encoding, chained
// by parent hash, on GPU with a data-parallel rank.
func realisticBatch(tb testing.TB, arrays bool) []byte {
	tb.Helper()
	events := make([]any, 0, 64)
	for i := range 64 {
		tokens := make([]int, 16)
		for j := range tokens {
			tokens[j] = 100000 + i*16 + j
		}
		var parent any
		if i > 0 {
			parent = uint64(0x9e3779b97f4a7c15) * uint64(i)
		}
		hash := uint64(0x9e3779b97f4a7c15) * uint64(i+1)
		if arrays {
			events = append(events, []any{"BlockStored", []any{hash}, parent, tokens, 16, nil, "GPU", nil, []any{nil}, 0, "full_attention"})
			continue
		}
		events = append(events, map[string]any{
			"type": "BlockStored", "block_hashes": []any{hash}, "parent_block_hash": parent,
			"token_ids": tokens, "block_size": 16, "lora_id": nil, "medium": "GPU", "lora_name": nil,
			"extra_keys": []any{nil}, "group_idx": 0, "kv_cache_spec_kind": "full_attention",
		})
	}
	b, err := msgpack.Marshal([]any{1733000000.5, events, 0})
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func benchmarkDecode(b *testing.B, arrays bool) {
	payload := realisticBatch(b, arrays)
	dec := NewDecoder(nil)
	if _, err := dec.Decode(payload); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		batch, err := dec.Decode(payload)
		if err != nil || len(batch.Events) != 64 {
			b.Fatalf("decode: %v, %d events", err, len(batch.Events))
		}
	}
	b.ReportMetric(float64(64*b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkDecodeMap decodes the realistic batch in the tagged-map encoding
// (newer vLLM).
func BenchmarkDecodeMap(b *testing.B) { benchmarkDecode(b, false) }

// BenchmarkDecodeArray decodes the realistic batch in the tagged-array
// encoding (older vLLM).
func BenchmarkDecodeArray(b *testing.B) { benchmarkDecode(b, true) }

// BenchmarkMsgpackGeneric decodes the same payload with msgpack's generic
// reflection decoder into interface values: the reference the typed decoder
// is measured against in the same run.
func BenchmarkMsgpackGeneric(b *testing.B) {
	payload := realisticBatch(b, false)
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		var v []any
		if err := msgpack.Unmarshal(payload, &v); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(64*b.N)/b.Elapsed().Seconds(), "events/s")
}
