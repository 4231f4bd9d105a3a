package indexd

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// putTokenBlocks stores keys on ep in tier t as a token-mode ingester
// does: each chunk entry is the canonical key then the engine's hash
// (indexd does not read the latter).
func (w *writer) putTokenBlocks(ep keyspace.Endpoint, t tier.Tier, keys []uint64) []any {
	w.chunks.Engine = true
	var ops []any
	for i, k := range keys {
		engine := 0xe0000000 + uint64(i) // what the engine called the block
		ops = append(ops, blockOp{b: keyspace.Block{Endpoint: ep, Tier: t, Hash: k}, engine: engine})
	}
	return ops
}

// tokenLookup is a token Lookup after the writer's last commit applied.
func tokenLookup(t *testing.T, r *replica, w *writer, tp *kvindexv1.TokenPrompt, cands ...string) *kvindexv1.LookupResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	req := &kvindexv1.LookupRequest{Model: model, Tokens: tp, Barrier: w.barrier()}
	for _, c := range cands {
		req.Candidates = append(req.Candidates, &kvindexv1.Endpoint{Pod: c})
	}
	resp, err := r.api.Lookup(ctx, req)
	if err != nil {
		t.Fatalf("Lookup(tokens): %v", err)
	}
	return resp
}

// brief is a match as the tests state it.
type brief struct {
	Pod       string
	Blocks    uint32
	BlockSize uint32
	Tiers     []kvindexv1.Tier
}

func briefs(resp *kvindexv1.LookupResponse) []brief {
	var out []brief
	for _, m := range resp.Matches {
		out = append(out, brief{Pod: m.Endpoint.Pod, Blocks: m.MatchedBlocks, BlockSize: m.BlockSize, Tiers: m.Tiers})
	}
	return out
}

// TestTokenLookup stores canonical keys in etcd as a token-mode ingester
// would (keys computed with the client's hasher) and checks that indexd
// keys a token Lookup the same way: per block size, with the extras, only
// for endpoints in token mode, each match carrying its block size.
func TestTokenLookup(t *testing.T) {
	e := testutil.StartEtcd(t)
	r := startReplica(t, e.Client)
	r.waitServing(t)
	w := newWriter(t, e.Client)

	toks := make([]uint32, 70) // 4 blocks of 16 (6 left over), 2 of 32
	for i := range toks {
		toks[i] = uint32(1000 + i*37)
	}
	base := client.TokenPrompt{TokenIDs: toks}
	lora := client.TokenPrompt{TokenIDs: toks, LoRAName: "sql-lora"}
	salted := client.TokenPrompt{TokenIDs: toks, CacheSalt: "tenant-7"}
	image := client.TokenPrompt{TokenIDs: toks, MultiModal: []client.MultiModalItem{{Hash: "img-a", Offset: 20, Length: 30}}}
	ep := func(pod string) keyspace.Endpoint { return keyspace.Endpoint{Model: model, Pod: pod} }
	rec := func(mode keyspace.HashMode, size uint32) keyspace.EndpointRecord {
		return keyspace.EndpointRecord{HashMode: mode, BlockSize: size}
	}
	var ops []any
	for _, s := range []struct {
		pod    string
		rec    keyspace.EndpointRecord
		tier   tier.Tier
		prompt client.TokenPrompt
		blocks int
	}{
		{"a16", rec(keyspace.HashModeToken, 16), tier.GPU, base, 4},
		{"b16", rec(keyspace.HashModeToken, 16), tier.CPU, base, 2},
		{"c32", rec(keyspace.HashModeToken, 32), tier.GPU, base, 2},
		{"engine16", rec(keyspace.HashModeEngine, 16), tier.GPU, base, 4},
		{"lora16", rec(keyspace.HashModeToken, 16), tier.GPU, lora, 3},
		{"salt16", rec(keyspace.HashModeToken, 16), tier.GPU, salted, 4},
		{"image16", rec(keyspace.HashModeToken, 16), tier.Disk, image, 4},
	} {
		ops = append(ops, w.record(ep(s.pod), s.rec))
		size := int(s.rec.BlockSize)
		ops = append(ops, w.putTokenBlocks(ep(s.pod), s.tier, client.TokenKeys(s.prompt, size)[:s.blocks])...)
	}
	w.commit(ops...)

	gpu, cpu, disk := kvindexv1.Tier_TIER_GPU, kvindexv1.Tier_TIER_CPU, kvindexv1.Tier_TIER_DISK
	for _, tc := range []struct {
		name  string
		tp    *kvindexv1.TokenPrompt
		cands []string
		want  []brief
	}{
		{
			name: "base_prompt_two_block_sizes",
			tp:   &kvindexv1.TokenPrompt{TokenIds: toks},
			want: []brief{
				// image16 shares blocks 0 (before the image) with the base prompt.
				{"a16", 4, 16, []kvindexv1.Tier{gpu, gpu, gpu, gpu}},
				{"b16", 2, 16, []kvindexv1.Tier{cpu, cpu}},
				{"c32", 2, 32, []kvindexv1.Tier{gpu, gpu}},
				{"image16", 1, 16, []kvindexv1.Tier{disk}},
			},
		},
		{
			name: "lora_matches_only_its_adapter",
			tp:   &kvindexv1.TokenPrompt{TokenIds: toks, LoraName: "sql-lora"},
			want: []brief{{"lora16", 3, 16, []kvindexv1.Tier{gpu, gpu, gpu}}},
		},
		{
			name: "salt_matches_only_its_salt",
			tp:   &kvindexv1.TokenPrompt{TokenIds: toks, CacheSalt: "tenant-7"},
			want: []brief{{"salt16", 4, 16, []kvindexv1.Tier{gpu, gpu, gpu, gpu}}},
		},
		{
			name: "image_item_matches_its_image",
			tp: &kvindexv1.TokenPrompt{TokenIds: toks, MultimodalItems: []*kvindexv1.MultiModalItem{
				{Hash: "img-a", Offset: 20, Length: 30}}},
			want: []brief{
				{"image16", 4, 16, []kvindexv1.Tier{disk, disk, disk, disk}},
				{"a16", 1, 16, []kvindexv1.Tier{gpu}},
				{"b16", 1, 16, []kvindexv1.Tier{cpu}},
			},
		},
		{
			name: "another_image_behind_the_same_tokens",
			tp: &kvindexv1.TokenPrompt{TokenIds: toks, MultimodalItems: []*kvindexv1.MultiModalItem{
				{Hash: "img-b", Offset: 20, Length: 30}}},
			want: []brief{
				{"a16", 1, 16, []kvindexv1.Tier{gpu}},
				{"b16", 1, 16, []kvindexv1.Tier{cpu}},
				{"image16", 1, 16, []kvindexv1.Tier{disk}},
			},
		},
		{
			name:  "candidates_restrict",
			tp:    &kvindexv1.TokenPrompt{TokenIds: toks},
			cands: []string{"b16", "c32", "engine16"},
			want: []brief{
				{"b16", 2, 16, []kvindexv1.Tier{cpu, cpu}},
				{"c32", 2, 32, []kvindexv1.Tier{gpu, gpu}},
			},
		},
		{
			name: "shorter_than_a_block",
			tp:   &kvindexv1.TokenPrompt{TokenIds: toks[:15]},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := briefs(tokenLookup(t, r, w, tc.tp, tc.cands...))
			if diff := gocmp.Diff(tc.want, got); diff != "" {
				t.Fatalf("(-want +got):\n%s", diff)
			}
		})
	}

	// A hash Lookup with the keys the client computes finds the same
	// blocks, and engine-mode endpoints too (it does not look at modes).
	byHash, _ := lookup(t, r, w, model, client.TokenKeys(base, 16), nil)
	var pods []string
	for _, m := range byHash {
		pods = append(pods, fmt.Sprintf("%s:%d", m.Endpoint.Pod, m.Blocks))
	}
	if diff := gocmp.Diff([]string{"a16:4", "engine16:4", "b16:2", "image16:1"}, pods); diff != "" {
		t.Fatalf("hash Lookup with client.TokenKeys (-want +got):\n%s", diff)
	}

	// ListEndpoints reports each endpoint's hash mode next to its block
	// size.
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	list, err := r.api.ListEndpoints(ctx, &kvindexv1.ListEndpointsRequest{Model: model})
	if err != nil {
		t.Fatal(err)
	}
	modes := map[string]string{}
	for _, e := range list.Endpoints {
		modes[e.Endpoint.Pod] = fmt.Sprintf("%s/%d", e.HashMode, e.BlockSize)
	}
	want := map[string]string{
		"a16": "HASH_MODE_TOKEN/16", "b16": "HASH_MODE_TOKEN/16", "c32": "HASH_MODE_TOKEN/32", "engine16": "HASH_MODE_ENGINE/16",
		"lora16": "HASH_MODE_TOKEN/16", "salt16": "HASH_MODE_TOKEN/16", "image16": "HASH_MODE_TOKEN/16",
	}
	if diff := gocmp.Diff(want, modes); diff != "" {
		t.Fatalf("ListEndpoints hash modes (-want +got):\n%s", diff)
	}
}

// TestTokenLookupPreV11Record checks that an endpoint record without a
// hash_mode (written before v1.1) is engine mode: listed as such and left
// out of token Lookups.
func TestTokenLookupPreV11Record(t *testing.T) {
	e := testutil.StartEtcd(t)
	r := startReplica(t, e.Client)
	r.waitServing(t)
	w := newWriter(t, e.Client)
	ep := keyspace.Endpoint{Model: model, Pod: "old"}
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	ops := []any{clientv3.OpPut(w.ks.EndpointKey(ep), `{"block_size":4}`, clientv3.WithLease(w.lease))}
	ops = append(ops, w.putTokenBlocks(ep, tier.GPU, client.TokenKeys(client.TokenPrompt{TokenIDs: toks}, 4))...)
	w.commit(ops...)
	if got := tokenLookup(t, r, w, &kvindexv1.TokenPrompt{TokenIds: toks}); len(got.Matches) != 0 {
		t.Fatalf("a pre-v1.1 (engine mode) endpoint matched a token Lookup: %v", got.Matches)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	list, err := r.api.ListEndpoints(ctx, &kvindexv1.ListEndpointsRequest{Model: model})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Endpoints) != 1 || list.Endpoints[0].HashMode != kvindexv1.HashMode_HASH_MODE_ENGINE || list.Endpoints[0].BlockSize != 4 {
		t.Fatalf("ListEndpoints = %v, want one engine-mode endpoint of block size 4", list.Endpoints)
	}
}

func TestTokenLookupInvalid(t *testing.T) {
	e := testutil.StartEtcd(t)
	r := startReplica(t, e.Client, func(c *Config) {
		c.MaxTokens = 8
		c.MaxMultiModalItems = 2
		c.MaxExtraBytes = 5
	})
	r.waitServing(t)
	w := newWriter(t, e.Client)
	var ops []any
	for i, size := range []uint32{4, 8, 16, 32, 64} {
		ops = append(ops, w.record(keyspace.Endpoint{Model: "sizes", Pod: fmt.Sprintf("p%d", i)}, keyspace.EndpointRecord{HashMode: keyspace.HashModeToken, BlockSize: size}))
	}
	w.commit(ops...)
	mm := func(items ...*kvindexv1.MultiModalItem) *kvindexv1.LookupRequest {
		return &kvindexv1.LookupRequest{Model: model, Tokens: &kvindexv1.TokenPrompt{TokenIds: []uint32{1, 2}, MultimodalItems: items}}
	}
	for _, tc := range []struct {
		name    string
		req     *kvindexv1.LookupRequest
		wantMsg string
	}{
		{"hashes_and_tokens", &kvindexv1.LookupRequest{Model: model, BlockHashes: []uint64{1}, Tokens: &kvindexv1.TokenPrompt{}}, "either block_hashes or tokens, not both"},
		{"too_many_tokens", &kvindexv1.LookupRequest{Model: model, Tokens: &kvindexv1.TokenPrompt{TokenIds: make([]uint32, 9)}}, "9 tokens, the limit is 8 per request (--max-tokens)"},
		{"lora_too_long", &kvindexv1.LookupRequest{Model: model, Tokens: &kvindexv1.TokenPrompt{LoraName: "sql-lora"}}, "tokens.lora_name is 8 bytes, the limit is 5 (--max-extra-bytes)"},
		{"salt_too_long", &kvindexv1.LookupRequest{Model: model, Tokens: &kvindexv1.TokenPrompt{CacheSalt: "tenant-7"}}, "tokens.cache_salt is 8 bytes"},
		{"too_many_items", mm(&kvindexv1.MultiModalItem{Hash: "a", Length: 1}, &kvindexv1.MultiModalItem{Hash: "b", Offset: 1, Length: 1}, &kvindexv1.MultiModalItem{Hash: "c", Offset: 2, Length: 1}), "3 items, the limit is 2 per request (--max-multimodal-items)"},
		{"item_without_hash", mm(&kvindexv1.MultiModalItem{Length: 1}), "multimodal_items[0].hash is required"},
		{"item_hash_too_long", mm(&kvindexv1.MultiModalItem{Hash: "abcdef", Length: 1}), "multimodal_items[0].hash is 6 bytes"},
		{"item_without_length", mm(&kvindexv1.MultiModalItem{Hash: "a"}), "multimodal_items[0].length is 0"},
		{"items_overlap", mm(&kvindexv1.MultiModalItem{Hash: "a", Length: 4}, &kvindexv1.MultiModalItem{Hash: "b", Offset: 3, Length: 1}), "multimodal_items[1] starts at token 3, inside or before"},
		{"items_out_of_order", mm(&kvindexv1.MultiModalItem{Hash: "a", Offset: 5, Length: 1}, &kvindexv1.MultiModalItem{Hash: "b", Offset: 0, Length: 1}), "must be in prompt order"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			tc.req.Barrier = w.barrier()
			_, err := r.api.Lookup(ctx, tc.req)
			st := status.Convert(err)
			if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tc.wantMsg) {
				t.Fatalf("error = %v, want INVALID_ARGUMENT containing %q", err, tc.wantMsg)
			}
		})
	}
	// Four of the five sizes, named as candidates, are keyed.
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	resp, err := r.api.Lookup(ctx, &kvindexv1.LookupRequest{Model: "sizes", Tokens: &kvindexv1.TokenPrompt{TokenIds: []uint32{1, 2, 3, 4}},
		Candidates: []*kvindexv1.Endpoint{{Pod: "p0"}, {Pod: "p1"}, {Pod: "p2"}, {Pod: "p3"}}})
	if err != nil {
		t.Fatalf("four block sizes: %v", err)
	}
	if diff := gocmp.Diff(&kvindexv1.LookupResponse{Revision: resp.Revision, AppliedOffsets: resp.AppliedOffsets, ProgressTime: resp.ProgressTime}, resp, protocmp.Transform()); diff != "" {
		t.Fatalf("four block sizes, no blocks stored: (-want +got):\n%s", diff)
	}
}

// TestTokenLookupPastFourBlockSizes: the endpoints of a model have five
// block sizes. A token Lookup keys the four whose endpoints hold the most
// blocks (the smaller size first on a tie), answers for them, and counts
// the endpoints of the fifth as left out: an endpoint reporting an odd
// block size hides only itself.
func TestTokenLookupPastFourBlockSizes(t *testing.T) {
	e := testutil.StartEtcd(t)
	r := startReplica(t, e.Client)
	r.waitServing(t)
	w := newWriter(t, e.Client)
	toks := make([]uint32, 64)
	for i := range toks {
		toks[i] = uint32(500 + i)
	}
	prompt := client.TokenPrompt{TokenIDs: toks}
	var ops []any
	// p4 (4 tokens) holds 16 blocks, p64 one; p8, p16, p32 none, so the
	// tie among them leaves the largest, 32, out.
	for _, s := range []struct {
		pod    string
		size   uint32
		blocks int
	}{{"p4", 4, 16}, {"p8", 8, 0}, {"p16", 16, 0}, {"p32", 32, 0}, {"p64", 64, 1}} {
		ep := keyspace.Endpoint{Model: model, Pod: s.pod}
		ops = append(ops, w.record(ep, keyspace.EndpointRecord{HashMode: keyspace.HashModeToken, BlockSize: s.size}))
		if s.blocks > 0 {
			ops = append(ops, w.putTokenBlocks(ep, tier.GPU, client.TokenKeys(prompt, int(s.size))[:s.blocks])...)
		}
	}
	w.commit(ops...)
	got := briefs(tokenLookup(t, r, w, &kvindexv1.TokenPrompt{TokenIds: toks}))
	want := []brief{
		{Pod: "p4", Blocks: 16, BlockSize: 4, Tiers: slices.Repeat([]kvindexv1.Tier{kvindexv1.Tier_TIER_GPU}, 16)},
		{Pod: "p64", Blocks: 1, BlockSize: 64, Tiers: []kvindexv1.Tier{kvindexv1.Tier_TIER_GPU}},
	}
	if diff := gocmp.Diff(want, got); diff != "" {
		t.Fatalf("five block sizes (-want +got):\n%s", diff)
	}
	if n := r.counter(t, r.srv.m.tokenLeftOut); n != 1 {
		t.Errorf("kvindex_indexd_token_lookup_left_out_total = %v, want 1 (p32)", n)
	}
	// Named as candidates, four sizes fit: nothing is left out.
	tokenLookup(t, r, w, &kvindexv1.TokenPrompt{TokenIds: toks}, "p8", "p16", "p32", "p64")
	if n := r.counter(t, r.srv.m.tokenLeftOut); n != 1 {
		t.Errorf("after a Lookup of four sizes, left out = %v, want still 1", n)
	}
}
