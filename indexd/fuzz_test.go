package indexd

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// FuzzApplyKey feeds arbitrary keys and values under the prefix to the
// index: nothing may panic, a put then a delete of the same key leaves no
// entry, and the per-endpoint counts always add up to the entries.
func FuzzApplyKey(f *testing.F) {
	ks := keyspace.Default()
	ep := keyspace.Endpoint{Model: "m/x", Pod: "team-a/vllm 0@10.0.0.5:8000", Rank: 2}
	f.Add(ks.BlockKey(ep, tier.GPU, 1), []byte(nil))
	f.Add(ks.BlockKey(ep, tier.Disk, 1<<63), []byte("7b05ab3397532bcc"))
	f.Add("/kvindex/v1/blocks/m/p/0/gpu/zz", []byte(nil))
	f.Add("/kvindex/v1/blocks/m/p/00/gpu/0000000000000001", []byte(nil))
	f.Add("/kvindex/v1/blocks/%zz/p/0/gpu/0000000000000001", []byte(nil))
	f.Add(ks.EndpointKey(ep), []byte(`{"hash_mode":"engine","block_size":16}`))
	f.Add(ks.EndpointKey(ep), []byte(`{`))
	f.Add(ks.OffsetKey(keyspace.Partition{Topic: "t", Partition: 3}), []byte("12"))
	f.Add(ks.OffsetKey(keyspace.Partition{Topic: "t", Partition: 3}), []byte("-1"))
	f.Add("/kvindex/v1/", []byte(nil))
	f.Fuzz(func(t *testing.T, key string, value []byte) {
		ix := newIndex(ks)
		// A known endpoint with a block, so deletes have something to hit.
		ix.write(1, func() { _, _ = ix.applyPut(ks.BlockKey(ep, tier.CPU, 5), nil) })
		ix.write(2, func() { _, _ = ix.applyPut(key, value) })
		checkCounts(t, ix)
		ix.write(3, func() { _, _ = ix.applyDelete(key) })
		checkCounts(t, ix)
		ix.write(4, func() { _, _ = ix.applyDelete(ks.BlockKey(ep, tier.CPU, 5)) })
		if ks.KindOf(key) == keyspace.KindBlock && ix.stats().Entries != 0 {
			t.Fatalf("put then delete of %q left %d entries", key, ix.stats().Entries)
		}
		var sc lookupScratch
		ix.Lookup(&sc, ep.Model, []uint64{1, 5}, nil)
	})
}

// checkCounts insists that the per-endpoint block counts add up to the
// index's entries.
func checkCounts(t *testing.T, ix *index) {
	t.Helper()
	infos, _ := ix.ListEndpoints("")
	var sum uint64
	for _, e := range infos {
		for _, n := range e.Blocks {
			sum += n
		}
	}
	if st := ix.stats(); sum != st.Entries {
		t.Fatalf("endpoint counts add to %d, index holds %d entries", sum, st.Entries)
	}
}

// FuzzLookupRequest decodes arbitrary bytes as a LookupRequest and runs
// validation and the lookup on a small index: nothing may panic, a
// rejection is ErrInvalidArgument, and every answer keeps the API's
// invariants.
func FuzzLookupRequest(f *testing.F) {
	for _, req := range []*kvindexv1.LookupRequest{
		{Model: "m", BlockHashes: []uint64{1, 2, 3}},
		{Model: "m", BlockHashes: []uint64{1}, Candidates: []*kvindexv1.Endpoint{{Pod: "p0", DpRank: 0}, {Pod: ""}}},
		{Model: "m", Barrier: &kvindexv1.Barrier{Records: []*kvindexv1.PartitionOffset{{Topic: "t", Partition: -1, Offset: 3}}, Timeout: durationpb.New(-1)}},
		{},
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	ks := keyspace.Default()
	f.Fuzz(func(t *testing.T, b []byte) {
		var req kvindexv1.LookupRequest
		if proto.Unmarshal(b, &req) != nil {
			return
		}
		s := &Server{cfg: DefaultConfig()}
		if _, _, err := s.validateLookup(&req); err != nil {
			if !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("rejection %v is not ErrInvalidArgument", err)
			}
			return
		}
		ix := newIndex(ks)
		ix.write(1, func() {
			for i, h := range []uint64{1, 2, 3} {
				for p, pod := range []string{"p0", "p1"} {
					if i <= p+1 {
						_, _ = ix.applyPut(ks.BlockKey(keyspace.Endpoint{Model: "m", Pod: pod}, tier.All[i], h), nil)
					}
				}
			}
		})
		var cands []keyspace.Endpoint
		for _, c := range req.Candidates {
			cands = append(cands, keyspace.Endpoint{Pod: c.Pod, Rank: c.DpRank})
		}
		var sc lookupScratch
		ix.Lookup(&sc, req.Model, req.BlockHashes, cands)
		resp := lookupResponse(&sc)
		for _, m := range resp.Matches {
			if m.MatchedBlocks == 0 || int(m.MatchedBlocks) > len(req.BlockHashes) || len(m.Tiers) != int(m.MatchedBlocks) {
				t.Fatalf("match %v breaks the API's invariants for %d hashes", m, len(req.BlockHashes))
			}
			for _, x := range m.Tiers {
				if !tier.Tier(x).Valid() {
					t.Fatalf("match %v has tier %v", m, x)
				}
			}
		}
	})
}
