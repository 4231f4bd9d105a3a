package index_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/index"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/sim/bench/paired"
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

// BenchmarkApplyEndpointRecord measures applying a watched endpoints/
// record, as the ingester rewrites one per endpoint in every window it
// commits (block size, hash mode, seq, batch ts, last record time,
// partition, leases), against the reference measured in the same loop:
// json.Valid over the same bytes, the least any reader of the JSON does.
// Metrics: ns/record, valid-ns/record, x-valid.
func BenchmarkApplyEndpointRecord(b *testing.B) {
	ks := keyspace.Default()
	const n = 64
	keys := make([]string, n)
	values := make([][]byte, n)
	for i := range keys {
		ep := keyspace.Endpoint{Model: "meta-llama/Llama-3.1-8B-Instruct", Pod: fmt.Sprintf("default/vllm-%d", i)}
		keys[i] = ks.EndpointKey(ep)
		seq := uint64(1000 + i)
		rec := keyspace.EndpointRecord{BlockSize: 16, HashMode: keyspace.HashModeEngine, Seq: &seq, BatchTS: 1764480000.25,
			LastRecord: time.Date(2026, 11, 30, 7, 0, 0, 0, time.UTC), Topic: "kvindex-events", Partition: int32(i % 4),
			Lease: keyspace.LeaseID(0x694d7a1b2c3d4e5f + i), TierLeases: map[string][]keyspace.LeaseShard{
				"gpu": {{ID: keyspace.LeaseID(0x694d7a1b2c3d4f00 + i), Keys: 4096}},
				"cpu": {{ID: keyspace.LeaseID(0x694d7a1b2c3d5000 + i), Keys: 10000}, {ID: keyspace.LeaseID(0x694d7a1b2c3d5100 + i), Keys: 6384}},
			}}
		var err error
		if values[i], err = rec.Marshal(); err != nil {
			b.Fatal(err)
		}
	}
	ix := index.New(ks)
	var tm paired.Timer
	valid := 0
	for b.Loop() {
		tm.Step(n, func() {
			ix.Write(2, func() {
				for i, k := range keys {
					if _, err := ix.ApplyPut(k, values[i]); err != nil {
						b.Fatal(err)
					}
				}
			})
		}, func() {
			for _, v := range values {
				if json.Valid(v) {
					valid++
				}
			}
		})
	}
	if valid != tm.Units {
		b.Fatalf("%d of %d records valid JSON", valid, tm.Units)
	}
	tm.Report(b, "record", "valid")
}
