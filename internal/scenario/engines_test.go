package scenario_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/scenario"
	"github.com/kvindex/kvindex/internal/tier"
)

var updateEngineFixtures = flag.Bool("update-engine-fixtures", false, "rewrite testdata/fixtures/scenarios/e*.jsonl from engineScenarios")

// TestEngineScenarioFiles checks that the engine-shape scenario files
// (testdata/fixtures/scenarios/e*.jsonl, DESIGN v1.1) are exactly what
// engineScenarios builds, so every payload in them can be read and changed
// here, in code, rather than as base64. Their expectations are written by
// hand from DESIGN below; the reference model, the ingester, indexd and the
// e2e suite each check them independently. Run with
// -update-engine-fixtures to rewrite the files after changing a scenario.
func TestEngineScenarioFiles(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "fixtures", "scenarios")
	for _, sc := range engineScenarios(t) {
		t.Run(sc.name, func(t *testing.T) {
			got := sc.render(t)
			path := filepath.Join(dir, sc.name+".jsonl")
			if *updateEngineFixtures {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update-engine-fixtures to write it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s differs from what engineScenarios builds; run with -update-engine-fixtures", path)
			}
			if _, err := scenario.Parse(bytes.NewReader(got)); err != nil {
				t.Fatalf("the file does not parse: %v", err)
			}
		})
	}
}

// engineScenario is one file being built.
type engineScenario struct {
	name, summary string
	lines         []any
}

type headLine struct {
	Step    string `json:"step"`
	Name    string `json:"name"`
	Summary string `json:"summary"`
}

type publishLine struct {
	Step     string            `json:"step"`
	Key      string            `json:"key"`
	Headers  map[string]string `json:"headers"`
	ValueB64 string            `json:"value_b64"`
	Describe string            `json:"describe"`
}

type lookupLine struct {
	Step     string           `json:"step"`
	Model    string           `json:"model"`
	Hashes   []string         `json:"hashes"`
	Expect   []scenario.Match `json:"expect"`
	Describe string           `json:"describe"`
}

func (s *engineScenario) render(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	for _, l := range append([]any{headLine{"scenario", s.name, s.summary}}, s.lines...) {
		b, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		buf.Write(b)
		buf.WriteByte('\n')
	}
	return buf.Bytes()
}

// publish adds a record of pod with value (raw msgpack bytes). rank, when
// non-negative, is sent as the dp_rank header.
func (s *engineScenario) publish(pod, model string, rank int, value []byte, describe string) {
	h := map[string]string{"model": model}
	if rank >= 0 {
		h["dp_rank"] = fmt.Sprint(rank)
	}
	s.lines = append(s.lines, publishLine{"publish", pod, h, base64.StdEncoding.EncodeToString(value), describe})
}

func (s *engineScenario) lookup(model string, hashes []uint64, describe string, expect ...scenario.Match) {
	hs := make([]string, len(hashes))
	for i, h := range hashes {
		hs[i] = fmt.Sprintf("%016x", h)
	}
	if expect == nil {
		expect = []scenario.Match{}
	}
	s.lines = append(s.lines, lookupLine{"lookup", model, hs, expect, describe})
}

// hashes returns n stable 64-bit block hashes named after label.
func hashes(label string, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		sum := sha256.Sum256([]byte(fmt.Sprintf("%s/%d", label, i)))
		out[i] = binary.BigEndian.Uint64(sum[:8])
	}
	return out
}

// enc encodes b with opts, failing the test on error.
func enc(t *testing.T, b events.Batch, opts events.EncodeOptions) []byte {
	t.Helper()
	v, err := events.EncodeWith(b, opts)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// rawMap encodes a msgpack map with its keys in the given order (kv is
// key, value, key, value...); values are msgpack-encoded as Go values, with
// sorted keys inside nested maps.
func rawMap(t *testing.T, kv ...any) []byte {
	t.Helper()
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	e.SetSortMapKeys(true)
	if err := e.EncodeMapLen(len(kv) / 2); err != nil {
		t.Fatal(err)
	}
	for _, x := range kv {
		if err := e.Encode(x); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

// storeMap is a BlockStored as newest vLLM sends it (a tagged map, fields
// at their defaults left out); kind nil leaves kv_cache_spec_kind out.
func storeMap(hs []uint64, parent *uint64, medium any, group int, kind any) map[string]any {
	m := map[string]any{"type": "BlockStored", "block_hashes": hs, "parent_block_hash": nil, "token_ids": tokens(len(hs)), "block_size": 16, "lora_id": nil, "medium": medium, "lora_name": nil}
	if parent != nil {
		m["parent_block_hash"] = *parent
	}
	if group != 0 {
		m["group_idx"] = group
	}
	if kind != nil {
		m["kv_cache_spec_kind"] = kind
	}
	return m
}

func tokens(blocks int) []int {
	out := make([]int, 16*blocks)
	for i := range out {
		out[i] = 1000 + i
	}
	return out
}

func match(pod string, rank uint32, tiers ...tier.Tier) scenario.Match {
	m := scenario.Match{Pod: pod, DPRank: rank, Blocks: len(tiers), Tiers: []string{}}
	for _, tr := range tiers {
		m.Tiers = append(m.Tiers, tr.String())
	}
	return m
}

func stored(hs []uint64, medium string) events.Event {
	return events.Event{Type: events.BlockStored, BlockHashes: hs, TokenIDs: toks(len(hs)), BlockSize: 16, Medium: medium}
}

func toks(blocks int) []int64 {
	out := make([]int64, 16*blocks)
	for i := range out {
		out[i] = int64(1000 + i)
	}
	return out
}

func removed(hs []uint64, medium string) events.Event {
	return events.Event{Type: events.BlockRemoved, BlockHashes: hs, Medium: medium}
}

// engineScenarios builds the scenario files of the DESIGN v1.1 shapes.
func engineScenarios(t *testing.T) []*engineScenario {
	return []*engineScenario{
		mapBatches(t), mediumNames(t), l2EvictionKeepsL3(t), tierBlocksCleared(t), hybridAttentionGroup(t), slidingWindowOnly(t),
	}
}

func mapBatches(t *testing.T) *engineScenario {
	const model = "meta-llama/Llama-3.1-8B-Instruct"
	s := &engineScenario{name: "e01_map_batches", summary: "vLLM's newest EventBatch is a map {ts, events, data_parallel_rank} (not array_like): the rank may be present, omitted or nil, the keys come in any order, unknown keys are ignored; a map batch without ts is malformed and skipped whole."}
	h := hashes("e01", 3)
	s.publish("vllm-map-0", model, 0, rawMap(t, "ts", 1764590400.25, "events", []any{storeMap(h[:2], nil, "GPU", 0, "full_attention")}, "data_parallel_rank", 0),
		"map batch {ts, events, data_parallel_rank: 0}: store h0,h1 on GPU")
	s.publish("vllm-map-1", model, 1, rawMap(t, "data_parallel_rank", 1, "events", []any{storeMap(h[:1], nil, "GPU", 0, "full_attention")}, "ts", 1764590400.5),
		"map batch with its keys reversed (rank 1 first, ts last): store h0")
	s.publish("vllm-map-2", model, -1, rawMap(t, "ts", 1764590400.75, "schema_version", 2, 7, []any{"not", "a", "field"}, "events", []any{storeMap(h, nil, "GPU", 0, nil)}),
		"map batch, rank omitted (nil), with a string and an integer key nobody knows: store h0,h1,h2")
	s.publish("vllm-map-2", model, -1, enc(t, events.Batch{TS: 1764590401, Events: []events.Event{removed(h[2:], "GPU")}}, events.EncodeOptions{BatchMap: true}),
		"map batch (rank omitted): remove h2")
	s.publish("vllm-map-3", model, -1, rawMap(t, "data_parallel_rank", nil, "ts", 1764590401.25, "events", []any{storeMap(h[:1], nil, "GPU", 0, nil)}),
		"map batch with an explicit nil rank: store h0")
	s.publish("vllm-map-bad", model, -1, rawMap(t, "events", []any{storeMap(h, nil, "GPU", 0, nil)}, "data_parallel_rank", 0),
		"map batch without ts: malformed, skipped whole")
	s.lookup(model, h, "every map batch applied; the one without ts did not",
		match("vllm-map-0", 0, tier.GPU, tier.GPU), match("vllm-map-1", 1, tier.GPU), match("vllm-map-2", 0, tier.GPU, tier.GPU), match("vllm-map-3", 0, tier.GPU))
	return s
}

func mediumNames(t *testing.T) *engineScenario {
	const model = "Qwen/Qwen3-8B"
	s := &engineScenario{name: "e02_medium_names", summary: "Every medium name of the DESIGN v1.1 table, matched case-insensitively (LMCache's lower-case cpu, SGLang's CPU_PINNED and CPU_TIER2, storage names), lands in its tier; an unknown medium is skipped, not guessed."}
	h := hashes("e02", 2)
	names := []struct {
		medium string
		tr     tier.Tier
	}{
		{"", tier.GPU}, {"GPU", tier.GPU}, {"DEVICE", tier.GPU}, {"gpu", tier.GPU},
		{"CPU", tier.CPU}, {"CPU_PINNED", tier.CPU}, {"CPU_TIER1", tier.CPU}, {"cpu", tier.CPU},
		{"CPU_TIER2", tier.Disk}, {"DISK", tier.Disk}, {"NVME", tier.Disk}, {"STORAGE", tier.Disk}, {"EXTERNAL", tier.Disk}, {"REMOTE", tier.Disk}, {"Disk", tier.Disk}, {"nvme", tier.Disk},
	}
	var expect []scenario.Match
	for i, n := range names {
		pod := fmt.Sprintf("pod-%02d", i)
		label := n.medium
		if label == "" {
			label = "nil"
		}
		s.publish(pod, model, -1, enc(t, events.Batch{TS: 1764590400 + float64(i), Events: []events.Event{stored(h, n.medium)}}, events.EncodeOptions{}),
			fmt.Sprintf("store h0,h1 with medium %s (tier %s)", label, n.tr))
		expect = append(expect, match(pod, 0, n.tr, n.tr))
	}
	s.publish("pod-unknown", model, -1, enc(t, events.Batch{TS: 1764590500, Events: []events.Event{stored(h, "HBM"), stored(h, "GPU ")}}, events.EncodeOptions{}),
		`store h0,h1 with medium HBM, then with "GPU " (trailing space): both unknown, skipped and counted`)
	s.lookup(model, h, "one endpoint per medium name, each in its tier; the unknown mediums stored nothing", expect...)
	return s
}

func l2EvictionKeepsL3(t *testing.T) *engineScenario {
	const model = "deepseek-ai/DeepSeek-V3"
	s := &engineScenario{name: "e03_l2_eviction_keeps_l3", summary: "SGLang HiCache: CPU_TIER1 (host memory, L2) is cpu and CPU_TIER2 (storage, L3) is disk, so an L2 eviction leaves the L3 copy indexed."}
	h := hashes("e03", 2)
	opts := events.EncodeOptions{Encoding: events.EncodingArray, Hashes: events.HashInt64}
	s.publish("sglang-0", model, -1, enc(t, events.Batch{TS: 1764590400, Events: []events.Event{stored(h, "GPU"), stored(h, "CPU_TIER1"), stored(h, "CPU_TIER2")}}, opts),
		"tagged arrays, signed hashes: store h0,h1 on GPU, CPU_TIER1 and CPU_TIER2")
	s.lookup(model, h, "best tier gpu", match("sglang-0", 0, tier.GPU, tier.GPU))
	s.publish("sglang-0", model, -1, enc(t, events.Batch{TS: 1764590401, Events: []events.Event{removed(h, "GPU")}}, opts), "remove h0,h1 from GPU")
	s.lookup(model, h, "the host-memory copy is best now", match("sglang-0", 0, tier.CPU, tier.CPU))
	s.publish("sglang-0", model, -1, enc(t, events.Batch{TS: 1764590402, Events: []events.Event{removed(h, "CPU_TIER1")}}, opts), "L2 eviction: remove h0,h1 from CPU_TIER1")
	s.lookup(model, h, "the L3 copy is still there", match("sglang-0", 0, tier.Disk, tier.Disk))
	s.publish("sglang-0", model, -1, enc(t, events.Batch{TS: 1764590403, Events: []events.Event{removed(h[:1], "CPU_TIER2")}}, opts), "L3 eviction of h0")
	s.lookup(model, h, "h0 is gone from every tier: no prefix")
	return s
}

func tierBlocksCleared(t *testing.T) *engineScenario {
	const model = "meta-llama/Llama-3.1-8B-Instruct"
	s := &engineScenario{name: "e04_tier_blocks_cleared", summary: "TierBlocksCleared(medium) clears that one tier of that endpoint, in both event encodings; a nil medium is gpu, an unknown one is skipped; other pods and other tiers keep their blocks."}
	h := hashes("e04", 2)
	both := func(pod string, ts float64) {
		s.publish(pod, model, -1, enc(t, events.Batch{TS: ts, Events: []events.Event{stored(h, "GPU"), stored(h, "CPU")}}, events.EncodeOptions{}), "store h0,h1 on GPU and CPU")
	}
	both("pod-a", 1764590400)
	both("pod-b", 1764590401)
	s.publish("pod-c", model, -1, enc(t, events.Batch{TS: 1764590402, Events: []events.Event{stored(h, "GPU")}}, events.EncodeOptions{}), "store h0,h1 on GPU")
	s.publish("pod-a", model, -1, enc(t, events.Batch{TS: 1764590403, Events: []events.Event{{Type: events.TierBlocksCleared, Medium: "GPU"}}}, events.EncodeOptions{BatchMap: true}),
		`map batch, tagged map {"type": "TierBlocksCleared", "medium": "GPU"}`)
	s.lookup(model, h, "pod-a keeps its CPU copies; the others are untouched",
		match("pod-a", 0, tier.CPU, tier.CPU), match("pod-b", 0, tier.GPU, tier.GPU), match("pod-c", 0, tier.GPU, tier.GPU))
	s.publish("pod-b", model, -1, enc(t, events.Batch{TS: 1764590404, Events: []events.Event{{Type: events.TierBlocksCleared, Medium: "CPU"}}}, events.EncodeOptions{Encoding: events.EncodingArray}),
		`tagged array ["TierBlocksCleared", "CPU"]`)
	s.publish("pod-a", model, -1, enc(t, events.Batch{TS: 1764590405, Events: []events.Event{{Type: events.TierBlocksCleared}}}, events.EncodeOptions{Encoding: events.EncodingArray}),
		`tagged array ["TierBlocksCleared", nil]: a nil medium is the GPU, which pod-a no longer holds`)
	s.publish("pod-a", model, -1, enc(t, events.Batch{TS: 1764590406, Events: []events.Event{{Type: events.TierBlocksCleared, Medium: "HBM"}}}, events.EncodeOptions{}),
		"TierBlocksCleared on an unknown medium: skipped and counted, nothing cleared")
	s.lookup(model, h, "pod-b lost only its CPU copies (GPU is still its best tier); pod-a kept CPU",
		match("pod-a", 0, tier.CPU, tier.CPU), match("pod-b", 0, tier.GPU, tier.GPU), match("pod-c", 0, tier.GPU, tier.GPU))
	s.publish("pod-b", model, -1, enc(t, events.Batch{TS: 1764590407, Events: []events.Event{removed(h[1:], "GPU"), {Type: events.TierBlocksCleared, Medium: "gpu"}, stored(h[:1], "CPU")}}, events.EncodeOptions{}),
		"remove h1 from GPU, clear the GPU tier (lower-case gpu), store h0 on CPU again")
	s.lookup(model, h, "pod-b holds h0 on CPU only",
		match("pod-a", 0, tier.CPU, tier.CPU), match("pod-b", 0, tier.CPU), match("pod-c", 0, tier.GPU, tier.GPU))
	s.publish("pod-c", model, -1, enc(t, events.Batch{TS: 1764590408, Events: []events.Event{stored(h, "CPU"), {Type: events.TierBlocksCleared, Medium: "GPU"}, stored(h[:1], "GPU")}}, events.EncodeOptions{Encoding: events.EncodingArray}),
		"one batch: store h0,h1 on CPU, clear the GPU tier, store h0 on GPU again: the clear voids only what came before it, in its tier")
	s.lookup(model, h, "pod-c: h0 back on GPU, h1 on CPU",
		match("pod-a", 0, tier.CPU, tier.CPU), match("pod-b", 0, tier.CPU), match("pod-c", 0, tier.GPU, tier.CPU))
	return s
}

func hybridAttentionGroup(t *testing.T) *engineScenario {
	const model = "example/hybrid-mamba-mla"
	s := &engineScenario{name: "e05_hybrid_attention_group", summary: "A hybrid model stores in mamba groups 0-2 before its mla_attention group 3: the endpoint indexes group 0 provisionally, switches to group 3 at its first attention store (dropping group 0's blocks first), never moves again, and skips every other group's events, removals that name only group_idx included."}
	m := hashes("e05-mamba", 3)
	a := hashes("e05-attn", 3)
	s.publish("hybrid-0", model, -1, rawMap(t, "ts", 1764590400.0, "events", []any{
		storeMap(m[:2], nil, "GPU", 0, "mamba"), storeMap(m[:1], nil, "GPU", 1, "mamba"), storeMap(m[:1], nil, "GPU", 2, "mamba"),
	}), "mamba stores in groups 0, 1 and 2: no attention yet, group 0 is indexed provisionally")
	s.lookup(model, m[:2], "group 0's blocks, provisionally", match("hybrid-0", 0, tier.GPU, tier.GPU))
	s.publish("hybrid-0", model, -1, rawMap(t, "ts", 1764590401.0, "events", []any{
		storeMap(m[2:], &m[1], "GPU", 0, "mamba"), storeMap(a[:2], nil, "GPU", 3, "mla_attention"), storeMap(a[2:], &a[1], "GPU", 3, "mla_attention"),
	}), "a mamba store in group 0, then mla_attention stores in group 3: group 3 is fixed before the batch applies, group 0's blocks are dropped")
	s.lookup(model, m, "nothing of group 0 is left")
	s.lookup(model, a, "group 3's chain", match("hybrid-0", 0, tier.GPU, tier.GPU, tier.GPU))
	s.publish("hybrid-0", model, -1, rawMap(t, "ts", 1764590402.0, "events", []any{
		map[string]any{"type": "BlockRemoved", "block_hashes": a[2:], "medium": "GPU", "group_idx": 3},
		map[string]any{"type": "BlockRemoved", "block_hashes": a[:1], "medium": "GPU"},
		map[string]any{"type": "BlockRemoved", "block_hashes": a[1:2], "medium": "GPU", "group_idx": 1},
		storeMap(m[:1], nil, "GPU", 0, "full_attention"),
	}), "removals carry only group_idx: a2 in group 3 (applies), a0 in group 0 (nil: skipped), a1 in group 1 (skipped); a full_attention store in group 0 does not move the group")
	s.lookup(model, a, "a2 gone; a0 and a1 stay", match("hybrid-0", 0, tier.GPU, tier.GPU))
	s.lookup(model, m, "group 0 stays skipped")
	s.publish("hybrid-0", model, -1, enc(t, events.Batch{TS: 1764590403, Events: []events.Event{{Type: events.TierBlocksCleared, Medium: "GPU"}}}, events.EncodeOptions{}),
		"a tier clear carries no group and always applies")
	s.lookup(model, a, "cleared")
	return s
}

func slidingWindowOnly(t *testing.T) *engineScenario {
	const model = "example/sliding-window"
	s := &engineScenario{name: "e06_sliding_window_groups", summary: "An endpoint whose groups are all sliding_window never sees an attention store and keeps indexing group 0; one with a sliding-window group 0 and a full_attention group 1 switches to group 1 at its first attention store, in a later batch."}
	h := hashes("e06", 3)
	sw := func(hs []uint64, group int) events.Event {
		ev := stored(hs, "GPU")
		ev.GroupIdx, ev.KVCacheSpecKind = int64(group), "sliding_window"
		return ev
	}
	s.publish("swa-0", model, -1, enc(t, events.Batch{TS: 1764590400, Events: []events.Event{sw(h[:2], 0), sw(h, 1)}}, events.EncodeOptions{Encoding: events.EncodingArray}),
		"tagged arrays: sliding_window stores in group 0 (h0,h1) and group 1 (h0,h1,h2)")
	s.publish("swa-1", model, -1, enc(t, events.Batch{TS: 1764590401, Events: []events.Event{sw(h[:1], 0)}}, events.EncodeOptions{}),
		"sliding_window store in group 0: h0")
	s.lookup(model, h, "both index group 0 provisionally", match("swa-0", 0, tier.GPU, tier.GPU), match("swa-1", 0, tier.GPU))
	rm := removed(h[1:2], "GPU")
	rm.GroupIdx = 1
	s.publish("swa-0", model, -1, enc(t, events.Batch{TS: 1764590402, Events: []events.Event{rm}}, events.EncodeOptions{Encoding: events.EncodingArray}),
		"remove h1 from group 1: another group, skipped")
	s.lookup(model, h, "swa-0 unchanged", match("swa-0", 0, tier.GPU, tier.GPU), match("swa-1", 0, tier.GPU))
	full := stored(h, "GPU")
	full.GroupIdx, full.KVCacheSpecKind = 1, events.KindFullAttention
	s.publish("swa-1", model, -1, enc(t, events.Batch{TS: 1764590403, Events: []events.Event{sw(h[1:2], 0), full}}, events.EncodeOptions{}),
		"swa-1: a sliding_window store in group 0, then a full_attention store of h0,h1,h2 in group 1: swa-1 switches to group 1")
	s.lookup(model, h, "swa-1 indexes group 1 now", match("swa-0", 0, tier.GPU, tier.GPU), match("swa-1", 0, tier.GPU, tier.GPU, tier.GPU))
	rm0 := removed(h[:1], "GPU")
	s.publish("swa-0", model, -1, enc(t, events.Batch{TS: 1764590404, Events: []events.Event{rm0}}, events.EncodeOptions{Encoding: events.EncodingArray}),
		"remove h0 from group 0: swa-0's indexed group")
	s.lookup(model, h, "swa-0 has no prefix left", match("swa-1", 0, tier.GPU, tier.GPU, tier.GPU))
	return s
}
