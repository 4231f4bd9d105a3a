package events

import (
	"errors"
	"runtime"
	"testing"

	"github.com/kvindex/kvindex/internal/scenario"
)

// FuzzDecode feeds arbitrary payloads to the decoder. It must never panic;
// it must either reject the payload with ErrMalformedBatch or return only
// valid events; and it must not allocate out of proportion to the payload
// (a short header claiming 2^32 elements allocates nothing for them).
// Seeds: every fixture payload (testdata/fuzz/FuzzDecode holds the
// committed corpus).
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
	dec := NewDecoder(nil)
	f.Fuzz(func(t *testing.T, payload []byte) {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		b, err := dec.Decode(payload)
		runtime.ReadMemStats(&after)
		if limit := allocLimit(len(payload)); after.TotalAlloc-before.TotalAlloc > limit {
			t.Fatalf("decoding %d bytes allocated %d bytes, limit %d", len(payload), after.TotalAlloc-before.TotalAlloc, limit)
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
				if ev.GroupIdx != 0 {
					t.Fatalf("event %d of group %d was not skipped", ev.Index, ev.GroupIdx)
				}
			case AllBlocksCleared:
				if len(ev.BlockHashes) != 0 {
					t.Fatalf("AllBlocksCleared with hashes")
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

// allocLimit is the most a payload of n bytes may make the decoder
// allocate: a fixed allowance for buffers and error strings, plus a
// per-byte factor (one input byte can become at most one small Skip or a
// share of an Event).
func allocLimit(n int) uint64 { return 256<<10 + 512*uint64(n) }
