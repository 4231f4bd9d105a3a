package index_test

import (
	"testing"

	"github.com/kvindex/kvindex/internal/index"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// FuzzApplyKey feeds arbitrary keys and values under the prefix to the
// index: nothing may panic, a put then a delete of the same key leaves no
// entry, and the per-endpoint counts always add up to the entries.
func FuzzApplyKey(f *testing.F) {
	ks := keyspace.Default()
	ep := keyspace.Endpoint{Model: "m/x", Pod: "team-a/vllm 0@10.0.0.5:8000", Rank: 2}
	f.Add(ks.BlockKey(ep, tier.GPU, 1), []byte(nil))
	f.Add(ks.BlockKey(ep, tier.Disk, 1<<63), []byte("7b05ab3397532bcc"))
	f.Add("/kvindex/v2/blocks/m/p/0/gpu/zz", []byte(nil))
	f.Add("/kvindex/v2/blocks/m/p/00/gpu/0000000000000001", []byte(nil))
	f.Add("/kvindex/v2/blocks/%zz/p/0/gpu/0000000000000001", []byte(nil))
	f.Add(ks.EndpointKey(ep), []byte(`{"hash_mode":"engine","block_size":16}`))
	f.Add(ks.EndpointKey(ep), []byte(`{`))
	f.Add(ks.OffsetKey(keyspace.Partition{Topic: "t", Partition: 3}), []byte("12"))
	f.Add(ks.OffsetKey(keyspace.Partition{Topic: "t", Partition: 3}), []byte("-1"))
	f.Add("/kvindex/v2/", []byte(nil))
	f.Fuzz(func(t *testing.T, key string, value []byte) {
		ix := index.New(ks)
		// A known endpoint with a block, so deletes have something to hit.
		ix.Write(1, func() { _, _ = ix.ApplyPut(ks.BlockKey(ep, tier.CPU, 5), nil) })
		ix.Write(2, func() { _, _ = ix.ApplyPut(key, value) })
		checkCounts(t, ix)
		ix.Write(3, func() { _, _ = ix.ApplyDelete(key) })
		checkCounts(t, ix)
		ix.Write(4, func() { _, _ = ix.ApplyDelete(ks.BlockKey(ep, tier.CPU, 5)) })
		if ks.KindOf(key) == keyspace.KindBlock && ix.Stats().Entries != 0 {
			t.Fatalf("put then delete of %q left %d entries", key, ix.Stats().Entries)
		}
		var sc index.Scratch
		ix.Lookup(&sc, ep.Model, []uint64{1, 5}, nil)
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
