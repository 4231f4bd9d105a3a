package e2e

import (
	"context"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/ingester"
	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/testutil"
)

// tokenBatch is a vLLM KVEventBatch (array form) of one BlockStored per
// chain: engine hashes hashes, token ids toks, block size bs, LoRA name
// lora and per-block extra_keys extras (nil: the field is absent).
func tokenBatch(t *testing.T, hashes []uint64, toks []uint32, bs int, lora string, extras []any) []byte {
	t.Helper()
	ids := make([]any, len(toks))
	for i, x := range toks {
		ids[i] = uint64(x)
	}
	hs := make([]any, len(hashes))
	for i, h := range hashes {
		hs[i] = h
	}
	var loraName any
	if lora != "" {
		loraName = lora
	}
	ev := []any{"BlockStored", hs, nil, ids, bs, nil, "GPU", loraName}
	if extras != nil {
		ev = append(ev, extras)
	}
	b, err := msgpack.Marshal([]any{1764500000.5, []any{ev}, nil})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestTokenLookupThroughPipeline: pods that hash one prompt differently
// (each engine its own block hashes) are matched by one token Lookup,
// through Kafka, a token-mode ingester, etcd and indexd; the extras an
// event carries (a LoRA name, vLLM's extra_keys with a multimodal item's
// (mm_hash, offset) tuple and a cache salt) key the same as a router's
// request with those extras.
func TestTokenLookupThroughPipeline(t *testing.T) {
	t.Parallel()
	p := newPipeline(t, 2)
	p.ingester("ing-0", func(c *ingester.Config) { c.HashMode = keyspace.HashModeToken })
	r := p.replica()
	c := newClient(t, r.addr)
	const model = "meta-llama/Llama-3.1-8B-Instruct"

	toks := make([]uint32, 40) // 2 full blocks of 16 (8 left over), 10 of 4
	for i := range toks {
		toks[i] = uint32(3000 + 11*i)
	}
	rec := func(pod string, value []byte) *kgo.Record {
		return &kgo.Record{Topic: topic, Key: []byte(pod), Value: value, Headers: []kgo.RecordHeader{{Key: "model", Value: []byte(model)}}}
	}
	// vllm-a and vllm-b: the same prompt, different engine hashes (two
	// processes with different PYTHONHASHSEEDs); vllm-c: block size 4.
	// vllm-lora: the prompt under a LoRA adapter, named only by lora_name.
	// vllm-mm: an image over tokens [20, 36) and a cache salt, as vLLM's
	// extra_keys carry them: block 0 ("tenant-7" salt), block 1 the tuple.
	recs := []*kgo.Record{
		rec("vllm-a", tokenBatch(t, []uint64{0xa1, 0xa2}, toks[:32], 16, "", nil)),
		rec("vllm-b", tokenBatch(t, []uint64{0xb1, 0xb2}, toks[:32], 16, "", nil)),
		rec("vllm-c", tokenBatch(t, []uint64{0xc1, 0xc2, 0xc3, 0xc4, 0xc5, 0xc6}, toks[:24], 4, "", nil)),
		rec("vllm-lora", tokenBatch(t, []uint64{0xd1, 0xd2}, toks[:32], 16, "sql-lora", nil)),
		rec("vllm-mm", tokenBatch(t, []uint64{0xe1, 0xe2}, toks[:32], 16, "", []any{
			[]any{"tenant-7"},               // block 0, tokens [0,16): the salt (the image starts at 20)
			[]any{[]any{"img-a", int64(4)}}, // block 1, tokens [16,32): the image, 4 tokens in
		})),
	}
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(time.Minute))
	defer cancel()
	offs := ingesttest.ProduceKafka(t, ctx, p.prod, recs)

	type brief struct {
		Pod       string
		Blocks    int
		BlockSize int
	}
	lookup := func(prompt client.TokenPrompt) []brief {
		t.Helper()
		res, err := c.LookupTokens(ctx, model, prompt, client.WithBarrier(20*time.Second, barrier(offs)...))
		if err != nil {
			t.Fatalf("LookupTokens: %v", err)
		}
		var out []brief
		for _, m := range res.Matches {
			out = append(out, brief{m.Endpoint.Pod, m.Blocks, m.BlockSize})
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		prompt client.TokenPrompt
		want   []brief
	}{
		{"same_prompt_different_engine_hashes", client.TokenPrompt{TokenIDs: toks},
			[]brief{{"vllm-c", 6, 4}, {"vllm-a", 2, 16}, {"vllm-b", 2, 16}}},
		{"lora", client.TokenPrompt{TokenIDs: toks, LoRAName: "sql-lora"},
			[]brief{{"vllm-lora", 2, 16}}},
		{"multimodal_and_salt", client.TokenPrompt{TokenIDs: toks, CacheSalt: "tenant-7",
			MultiModal: []client.MultiModalItem{{Hash: "img-a", Offset: 20, Length: 16}}},
			[]brief{{"vllm-mm", 2, 16}}},
		{"other_image", client.TokenPrompt{TokenIDs: toks, CacheSalt: "tenant-7",
			MultiModal: []client.MultiModalItem{{Hash: "img-b", Offset: 20, Length: 16}}},
			[]brief{{"vllm-mm", 1, 16}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := gocmp.Diff(tc.want, lookup(tc.prompt)); diff != "" {
				t.Fatalf("(-want +got):\n%s", diff)
			}
		})
	}
	// A router that hashes locally gets the same answer from the keys
	// client.TokenKeys computes.
	res, err := c.Lookup(ctx, model, client.TokenKeys(client.TokenPrompt{TokenIDs: toks}, 16))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Matches) != 2 || res.Matches[0].Blocks != 2 || res.Matches[1].Blocks != 2 {
		t.Fatalf("hash Lookup of client.TokenKeys: %+v, want vllm-a and vllm-b with 2 blocks", res.Matches)
	}
}
