package indexd

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/internal/index"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// FuzzLookupRequest decodes arbitrary bytes as a LookupRequest and runs
// validation and the lookup (a token Lookup when the request has tokens)
// on a small index whose endpoints hold the keys of a few token prompts
// at block sizes 4 and 8: nothing may panic, a rejection is
// ErrInvalidArgument, and every answer keeps the API's invariants.
func FuzzLookupRequest(f *testing.F) {
	for _, req := range []*kvindexv1.LookupRequest{
		{Model: "m", BlockHashes: []uint64{1, 2, 3}},
		{Model: "m", BlockHashes: []uint64{1}, Candidates: []*kvindexv1.Endpoint{{Pod: "p0", DpRank: 0}, {Pod: ""}}},
		{Model: "m", Barrier: &kvindexv1.Barrier{Records: []*kvindexv1.PartitionOffset{{Topic: "t", Partition: -1, Offset: 3}}, Timeout: durationpb.New(-1)}},
		{},
		{Model: "m", Tokens: &kvindexv1.TokenPrompt{TokenIds: fuzzTokens}},
		{Model: "m", Tokens: &kvindexv1.TokenPrompt{TokenIds: fuzzTokens, LoraName: "l", CacheSalt: "s"}, Candidates: []*kvindexv1.Endpoint{{Pod: "t4"}}},
		{Model: "m", Tokens: &kvindexv1.TokenPrompt{TokenIds: fuzzTokens, MultimodalItems: []*kvindexv1.MultiModalItem{{Hash: "img", Offset: 2, Length: 5}}}},
		{Model: "m", BlockHashes: []uint64{1}, Tokens: &kvindexv1.TokenPrompt{TokenIds: []uint32{1}}},
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
						v := keyspace.AppendChunkValue(nil, []keyspace.ChunkEntry{{Key: h, Engine: h}}, false)
						_, _ = ix.ApplyPut(ks.ChunkKey(keyspace.Endpoint{Model: "m", Pod: pod}, tier.All[i], 0), nil, v)
					}
				}
			}
			for _, size := range []int{4, 8} {
				ep := keyspace.Endpoint{Model: "m", Pod: fmt.Sprintf("t%d", size)}
				rec, _ := (&keyspace.EndpointRecord{HashMode: keyspace.HashModeToken, BlockSize: uint32(size)}).Marshal()
				_, _ = ix.ApplyPut(ks.EndpointKey(ep), nil, rec)
				for seq, p := range []client.TokenPrompt{{TokenIDs: fuzzTokens}, {TokenIDs: fuzzTokens, LoRAName: "l", CacheSalt: "s"}} {
					var es []keyspace.ChunkEntry
					for i, k := range client.TokenKeys(p, size) {
						es = append(es, keyspace.ChunkEntry{Key: k, Engine: uint64(i)})
					}
					_, _ = ix.ApplyPut(ks.ChunkKey(ep, tier.GPU, uint64(seq)), nil, keyspace.AppendChunkValue(nil, es, true))
				}
			}
		})
		var cands []keyspace.Endpoint
		for _, c := range req.Candidates {
			cands = append(cands, keyspace.Endpoint{Pod: c.Pod, Rank: c.DpRank})
		}
		var sc index.Scratch
		if req.Tokens != nil {
			ix.LookupTokens(&sc, req.Model, tokenKeyer(req.Tokens), cands)
			if sc.LeftOut != 0 {
				t.Fatalf("token Lookup over two block sizes left %d endpoints out", sc.LeftOut)
			}
		} else {
			ix.Lookup(&sc, req.Model, req.BlockHashes, cands)
		}
		resp := lookupResponse(&sc)
		for _, m := range resp.Matches {
			limit := len(req.BlockHashes)
			if req.Tokens != nil {
				if m.BlockSize != 4 && m.BlockSize != 8 {
					t.Fatalf("token match %v has a block size no token-mode endpoint has", m)
				}
				limit = len(req.Tokens.TokenIds) / int(m.BlockSize)
			}
			if m.MatchedBlocks == 0 || int(m.MatchedBlocks) > limit || len(m.Tiers) != int(m.MatchedBlocks) {
				t.Fatalf("match %v breaks the API's invariants for %d hashes or blocks", m, limit)
			}
			for _, x := range m.Tiers {
				if !tier.Tier(x).Valid() {
					t.Fatalf("match %v has tier %v", m, x)
				}
			}
		}
	})
}

// fuzzTokens is the prompt whose keys FuzzLookupRequest's index holds.
var fuzzTokens = []uint32{5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21}
