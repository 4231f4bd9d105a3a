package indexd

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kvindex/kvindex/internal/index"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

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
		ix := index.New(ks)
		ix.Write(1, func() {
			for i, h := range []uint64{1, 2, 3} {
				for p, pod := range []string{"p0", "p1"} {
					if i <= p+1 {
						_, _ = ix.ApplyPut(ks.BlockKey(keyspace.Endpoint{Model: "m", Pod: pod}, tier.All[i], h), nil)
					}
				}
			}
		})
		var cands []keyspace.Endpoint
		for _, c := range req.Candidates {
			cands = append(cands, keyspace.Endpoint{Pod: c.Pod, Rank: c.DpRank})
		}
		var sc index.Scratch
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
