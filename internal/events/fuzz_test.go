package events

import (
	"errors"
	"runtime"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvindex/kvindex/internal/scenario"
)

// FuzzDecode feeds arbitrary payloads to the decoder. It must never panic;
// it must either reject the payload with ErrMalformedBatch or return only
// valid events; and it must not allocate out of proportion to the payload
// (a short header claiming 2^32 elements allocates nothing for them).
// Seeds: every fixture payload, and one of each v1.1 shape (map batches,
// tier clears in both encodings, stores of other groups with their spec
// kinds, mediums in other cases); testdata/fuzz/FuzzDecode holds the
// committed corpus.
func FuzzDecode(f *testing.F) {
	for _, s := range loadFixtures(f) {
		for _, st := range s.Steps {
			if st.Kind == scenario.KindPublish {
				f.Add(st.Publish.Value)
			}
		}
	}
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0x92, 0x01, 0x91, 0x92, 0xac, 'B', 'l', 'o', 'c', 'k', 'R', 'e', 'm', 'o', 'v', 'e', 'd', 0x91, 0xc6, 0xff, 0xff, 0xff, 0xff})
	for _, seed := range v11Seeds(f) {
		f.Add(seed)
	}
	dec := NewDecoder(nil)
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, allocated, err := decodeAllocated(dec, payload)
		if limit := allocLimit(len(payload)); allocated > limit {
			// TotalAlloc is the process's: an allocation of another
			// goroutine (the fuzzing worker's own) may land inside the
			// window. The decoder's own is the same on every run but
			// for its one-string caches (the last medium and spec kind),
			// so only a payload over the limit on three runs fails.
			for range 2 {
				_, again, _ := decodeAllocated(dec, payload)
				allocated = min(allocated, again)
			}
			if allocated > limit {
				t.Fatalf("decoding %d bytes allocated %d bytes on each of 3 runs, limit %d", len(payload), allocated, limit)
			}
		}
		if err != nil {
			if !errors.Is(err, ErrMalformedBatch) {
				t.Fatalf("error %v does not wrap ErrMalformedBatch", err)
			}
			return
		}
		for _, ev := range b.Events {
			switch ev.Type {
			case BlockStored, BlockRemoved:
				if !ev.Tier.Valid() {
					t.Fatalf("event %d has tier %v", ev.Index, ev.Tier)
				}
				if ev.GroupIdx < 0 {
					t.Fatalf("event %d has group %d", ev.Index, ev.GroupIdx)
				}
				if ev.Type == BlockRemoved && ev.KVCacheSpecKind != "" {
					t.Fatalf("removal %d has a spec kind", ev.Index)
				}
			case TierBlocksCleared:
				if !ev.Tier.Valid() || len(ev.BlockHashes) != 0 || ev.GroupIdx != 0 {
					t.Fatalf("TierBlocksCleared %d: %+v", ev.Index, ev)
				}
			case AllBlocksCleared:
				if len(ev.BlockHashes) != 0 || ev.Tier != 0 {
					t.Fatalf("AllBlocksCleared with hashes or a tier")
				}
			default:
				t.Fatalf("event %d has type %v", ev.Index, ev.Type)
			}
		}
		for _, s := range b.Skipped {
			if s.Reason == 0 || s.Detail == "" {
				t.Fatalf("skip without reason or detail: %+v", s)
			}
		}
	})
}

// v11Seeds returns one payload of each shape DESIGN v1.1 added, encoded
// the way engines send them.
func v11Seeds(tb testing.TB) [][]byte {
	tb.Helper()
	store := func(group int, kind any, medium any) map[string]any {
		return map[string]any{"type": "BlockStored", "block_hashes": []any{uint64(group + 1)}, "parent_block_hash": nil, "token_ids": []int{1, 2}, "block_size": 2, "medium": medium, "group_idx": group, "kv_cache_spec_kind": kind}
	}
	shapes := []any{
		map[string]any{"ts": 1.5, "events": []any{store(0, "full_attention", "GPU")}, "data_parallel_rank": 1},
		map[string]any{"events": []any{store(0, nil, "cpu")}, "ts": 2.5},
		map[string]any{"ts": 3.0, "events": []any{}, "data_parallel_rank": nil, "future": map[string]any{"x": 1}, "7": []any{1}},
		[]any{4.0, []any{map[string]any{"type": "TierBlocksCleared", "medium": "GPU"}, []any{"TierBlocksCleared", "CPU_TIER2"}, []any{"TierBlocksCleared"}, map[string]any{"type": "TierBlocksCleared", "medium": "HBM"}}},
		[]any{5.0, []any{store(0, "mamba", "GPU"), store(1, "mamba", "GPU"), store(3, "mla_attention", "GPU"), map[string]any{"type": "BlockRemoved", "block_hashes": []any{4}, "group_idx": 3}}, 0},
		[]any{6.0, []any{[]any{"BlockStored", []any{7}, nil, []any{1}, 1, nil, "Disk", nil, []any{nil}, 2, "sliding_window", 128}}},
	}
	out := make([][]byte, 0, len(shapes))
	for _, v := range shapes {
		b, err := msgpack.Marshal(v)
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// decodeAllocated decodes payload with dec and reports the bytes the
// process allocated meanwhile (runtime.MemStats.TotalAlloc).
func decodeAllocated(dec *Decoder, payload []byte) (Batch, uint64, error) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	b, err := dec.Decode(payload)
	runtime.ReadMemStats(&after)
	return b, after.TotalAlloc - before.TotalAlloc, err
}

// allocLimit is the most a payload of n bytes may make the decoder
// allocate: a fixed allowance for buffers and error strings, plus a
// per-byte factor (one input byte can become at most one small Skip or a
// share of an Event).
func allocLimit(n int) uint64 { return 256<<10 + 512*uint64(n) }
