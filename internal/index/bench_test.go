package index_test

import (
	"fmt"
	"testing"

	"github.com/kvindex/kvindex/internal/bench/paired"
	"github.com/kvindex/kvindex/internal/index"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// BenchmarkApply measures applying watched block keys to the index
// (ApplyPut, then ApplyDelete of the same keys: key split, endpoint
// lookup, slot and set update) against the reference measured in the same
// loop (paired.Timer): setting and deleting the same hashes in a plain
// map[uint64]uint32, the work with no key to read. 4,096 keys over 16
// endpoints and two tiers. Metrics: ns/key, map-ns/key, x-map.
func BenchmarkApply(b *testing.B) {
	ks := keyspace.Default()
	const n = 4096
	keys := make([]string, n)
	hashes := make([]uint64, n)
	for i := range keys {
		hashes[i] = uint64(i+1) * 0x9e3779b97f4a7c15
		ep := keyspace.Endpoint{Model: "m", Pod: fmt.Sprintf("pod-%d", i%16)}
		keys[i] = ks.BlockKey(ep, tier.All[i%2], hashes[i])
	}
	ix := index.New(ks)
	// Known endpoints, as in a running replica (the first key of an
	// endpoint takes the slow path once).
	ix.Write(1, func() {
		for _, k := range keys[:16] {
			if _, err := ix.ApplyPut(k, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	ref := make(map[uint64]uint32, n)
	var tm paired.Timer
	for b.Loop() {
		tm.Step(2*n, func() {
			ix.Write(2, func() {
				for _, k := range keys {
					_, _ = ix.ApplyPut(k, nil)
				}
				for _, k := range keys {
					_, _ = ix.ApplyDelete(k)
				}
			})
		}, func() {
			for i, h := range hashes {
				ref[h] = uint32(i)
			}
			for _, h := range hashes {
				delete(ref, h)
			}
		})
	}
	if st := ix.Stats(); st.Entries != 0 || len(ref) != 0 {
		b.Fatalf("after the last batch the index holds %d entries, the map %d", st.Entries, len(ref))
	}
	tm.Report(b, "key", "map")
}
