package index_test

import (
	"testing"

	"github.com/kvindex/kvindex/internal/index"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// FuzzApplyKey feeds arbitrary keys and values under the prefix to the
// index: nothing may panic, a put then a delete of the same key with the
// put's value as prev leaves no entry, and the per-endpoint counts always
// add up to the entries.
func FuzzApplyKey(f *testing.F) {
	ks := keyspace.Default()
	ep := keyspace.Endpoint{Model: "m/x", Pod: "team-a/vllm 0@10.0.0.5:8000", Rank: 2}
	f.Add(ks.ChunkKey(ep, tier.GPU, 1), chunkValue(1, 5))
	f.Add(ks.ChunkKey(ep, tier.Disk, 1<<63), keyspace.AppendChunkValue(nil, []keyspace.ChunkEntry{{Key: 5, Engine: 7}}, true))
	f.Add("/kvindex/v2/chunks/m/p/0/gpu/zz", chunkValue(1))
	f.Add("/kvindex/v2/chunks/m/p/00/gpu/0000000000000001", chunkValue(1))
	f.Add("/kvindex/v2/chunks/%zz/p/0/gpu/0000000000000001", chunkValue(1))
	f.Add("/kvindex/v2/blocks/m/p/0/gpu/0000000000000001", []byte(nil))
	f.Add(ks.EndpointKey(ep), []byte(`{"hash_mode":"engine","block_size":16}`))
	f.Add(ks.EndpointKey(ep), []byte(`{`))
	f.Add(ks.OffsetKey(keyspace.Partition{Topic: "t", Partition: 3}), []byte("12"))
	f.Add(ks.OffsetKey(keyspace.Partition{Topic: "t", Partition: 3}), []byte("-1"))
	f.Add("/kvindex/v2/", []byte(nil))
	f.Fuzz(func(t *testing.T, key string, value []byte) {
		ix := index.New(ks)
		// A known endpoint with a block, so deletes have something to hit.
		known := ks.ChunkKey(ep, tier.CPU, 9)
		ix.Write(1, func() { _, _ = ix.ApplyPut(known, nil, chunkValue(5)) })
		if key == known {
			return // the fuzzed key would rewrite the fixture's own chunk
		}
		ix.Write(2, func() { _, _ = ix.ApplyPut(key, nil, value) })
		checkCounts(t, ix)
		ix.Write(3, func() { _, _ = ix.ApplyDelete(key, value) })
		checkCounts(t, ix)
		ix.Write(4, func() { _, _ = ix.ApplyDelete(known, chunkValue(5)) })
		if st := ix.Stats(); ks.KindOf(key) == keyspace.KindChunk && (st.Entries != 0 || st.Duplicates != 0) {
			t.Fatalf("put then delete of %q left %+v", key, st)
		}
		var sc index.Scratch
		ix.Lookup(&sc, ep.Model, []uint64{1, 5}, nil)
	})
}

// FuzzChunkValues rewrites one chunk through arbitrary values (parsed by
// keyspace.ParseChunkValue, malformed ones included): nil → a → b → c →
// deleted, each put diffed against the one before. Nothing may panic, the
// counts always add up, after each put the chunk's keys (when its value
// parses) are exactly what the index holds, and after the delete nothing
// is left: not an entry, a duplicate hold or the endpoint.
func FuzzChunkValues(f *testing.F) {
	f.Add(chunkValue(1, 2, 3), chunkValue(2, 3, 4), chunkValue(4))
	f.Add(chunkValue(1, 1, 1), chunkValue(1), []byte{8})
	f.Add([]byte{16, 0, 1}, chunkValue(7), keyspace.AppendChunkValue(nil, []keyspace.ChunkEntry{{Key: 7, Engine: 9}}, true))
	f.Add([]byte{}, []byte{9, 0, 0, 0, 0, 0, 0, 0, 0}, chunkValue(5, 6))
	ks := keyspace.Default()
	ep := keyspace.Endpoint{Model: "m", Pod: "p"}
	key := ks.ChunkKey(ep, tier.GPU, 0)
	f.Fuzz(func(t *testing.T, a, b, c []byte) {
		ix := index.New(ks)
		var prev []byte
		for rev, v := range [][]byte{a, b, c} {
			ix.Write(int64(rev+1), func() { _, _ = ix.ApplyPut(key, prev, v) })
			checkCounts(t, ix)
			want := map[uint64]bool{}
			if cv, err := keyspace.ParseChunkValue(v); err == nil {
				for i := range cv.Len() {
					want[cv.Key(i)] = true
				}
			}
			if st := ix.Stats(); st.Entries != uint64(len(want)) {
				t.Fatalf("after put %d the index holds %d entries, the value %d keys", rev+1, st.Entries, len(want))
			}
			for h := range want {
				if ms := lookupCopy(ix, ep.Model, []uint64{h}, nil); len(ms) != 1 {
					t.Fatalf("after put %d key %x is missing", rev+1, h)
				}
			}
			prev = v
		}
		ix.Write(4, func() { _, _ = ix.ApplyDelete(key, prev) })
		if st := ix.Stats(); st != (index.Stats{}) {
			t.Fatalf("after the delete the index holds %+v", st)
		}
	})
}

// checkCounts insists that the per-endpoint block counts add up to the
// index's entries.
func checkCounts(t *testing.T, ix *index.Index) {
	t.Helper()
	infos, _ := ix.ListEndpoints("")
	var sum uint64
	for _, e := range infos {
		for _, n := range e.Blocks {
			sum += n
		}
	}
	if st := ix.Stats(); sum != st.Entries {
		t.Fatalf("endpoint counts add to %d, index holds %d entries", sum, st.Entries)
	}
}
