package refmodel

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// TestV11Semantics checks the model's reading of DESIGN v1.1: tier
// clears, the indexed KV-cache group and its edge cases, and medium names.
func TestV11Semantics(t *testing.T) {
	const model, pod = "m", "p"
	ep := keyspace.Endpoint{Model: model, Pod: pod}
	h := func(kv ...string) map[string]string {
		out := map[string]string{"model": model}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	st := func(medium any, group any, kind any, hs ...uint64) any {
		return map[string]any{"type": "BlockStored", "block_hashes": hs, "medium": medium, "group_idx": group, "kv_cache_spec_kind": kind}
	}
	rm := func(medium any, group any, hs ...uint64) any {
		return map[string]any{"type": "BlockRemoved", "block_hashes": hs, "medium": medium, "group_idx": group}
	}
	rec := func(t *testing.T, headers map[string]string, evs ...any) Record {
		return Record{Key: pod, Headers: headers, Value: batch(t, 1, 0, evs...)}
	}
	type want struct {
		blocks   []keyspace.Block
		group    int64
		groupSet bool
		skipped  map[string]int
	}
	b := func(tr tier.Tier, hs ...uint64) []keyspace.Block {
		var out []keyspace.Block
		for _, x := range hs {
			out = append(out, keyspace.Block{Endpoint: ep, Tier: tr, Hash: x})
		}
		return out
	}
	cat := func(parts ...[]keyspace.Block) []keyspace.Block {
		var out []keyspace.Block
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	tests := []struct {
		name string
		recs func(t *testing.T) []Record
		want want
	}{
		{name: "tier_clear_clears_one_tier", recs: func(t *testing.T) []Record {
			return []Record{
				rec(t, h(), st("GPU", nil, nil, 1, 2), st("CPU", nil, nil, 1), st("DISK", nil, nil, 1)),
				rec(t, h(), map[string]any{"type": "TierBlocksCleared", "medium": "cpu"}),
				rec(t, h(), []any{"TierBlocksCleared"}),
			}
		}, want: want{blocks: b(tier.Disk, 1)}},
		{name: "unknown_medium_tier_clear_skipped", recs: func(t *testing.T) []Record {
			return []Record{rec(t, h(), st("GPU", nil, nil, 1), map[string]any{"type": "TierBlocksCleared", "medium": "HBM"})}
		}, want: want{blocks: b(tier.GPU, 1), skipped: map[string]int{"unknown_medium": 1}}},
		{name: "l2_eviction_keeps_l3", recs: func(t *testing.T) []Record {
			return []Record{
				rec(t, h(), st("CPU_TIER1", nil, nil, 1, 2), st("CPU_TIER2", nil, nil, 1, 2)),
				rec(t, h(), rm("CPU_TIER1", nil, 1, 2)),
			}
		}, want: want{blocks: b(tier.Disk, 1, 2)}},
		{name: "provisional_group_0_until_attention", recs: func(t *testing.T) []Record {
			return []Record{
				rec(t, h(), st("GPU", 0, "mamba", 1), st("GPU", 1, "mamba", 2)),
			}
		}, want: want{blocks: b(tier.GPU, 1), skipped: map[string]int{"other_group": 1}}},
		{name: "switch_to_attention_drops_group_0_first", recs: func(t *testing.T) []Record {
			return []Record{
				rec(t, h(), st("GPU", 0, "mamba", 1), st("CPU", 0, "mamba", 5)),
				// The group-0 store before the attention store in this
				// batch is already of another group: skipped.
				rec(t, h(), st("GPU", 0, "mamba", 2), st("GPU", 3, "mla_attention", 3), st("GPU", 3, "full_attention", 4), map[string]any{"type": "AllBlocksCleared"}, st("GPU", 3, nil, 6)),
				rec(t, h(), rm("GPU", 3, 6), rm("GPU", nil, 1), st("GPU", 3, "mamba", 7)),
			}
		}, want: want{blocks: b(tier.GPU, 7), group: 3, groupSet: true, skipped: map[string]int{"other_group": 2}}},
		{name: "attention_in_group_0_fixes_it_without_a_drop", recs: func(t *testing.T) []Record {
			return []Record{
				rec(t, h(), st("GPU", nil, nil, 1)),
				rec(t, h(), st("GPU", 0, "full_attention", 2)),
				rec(t, h(), st("GPU", 1, "full_attention", 3)),
			}
		}, want: want{blocks: b(tier.GPU, 1, 2), groupSet: true, skipped: map[string]int{"other_group": 1}}},
		{name: "group_never_moves", recs: func(t *testing.T) []Record {
			return []Record{
				rec(t, h(), st("GPU", 1, "sliding_window", 1), st("GPU", 2, "full_attention", 2)),
				rec(t, h(), st("GPU", 4, "mla_attention", 3), st("GPU", 2, nil, 4)),
				rec(t, h("kind", "resync")),
				rec(t, h(), st("GPU", 4, "full_attention", 5), st("GPU", 2, "full_attention", 6)),
			}
		}, want: want{blocks: b(tier.GPU, 6), group: 2, groupSet: true, skipped: map[string]int{"other_group": 3}}},
		{name: "sliding_window_only_stays_provisional", recs: func(t *testing.T) []Record {
			return []Record{rec(t, h(), st("GPU", 0, "sliding_window", 1), st("GPU", 1, "sliding_window", 2), rm("GPU", 1, 2))}
		}, want: want{blocks: b(tier.GPU, 1), skipped: map[string]int{"other_group": 2}}},
		{name: "goodbye_resets_the_group", recs: func(t *testing.T) []Record {
			return []Record{
				rec(t, h(), st("GPU", 3, "full_attention", 1)),
				rec(t, h("kind", "goodbye")),
				rec(t, h(), st("GPU", 0, nil, 2), st("GPU", 3, nil, 3)),
			}
		}, want: want{blocks: b(tier.GPU, 2), skipped: map[string]int{"other_group": 1}}},
		{name: "new_process_resets_the_group", recs: func(t *testing.T) []Record {
			return []Record{
				rec(t, h("seq", "0", "incarnation", "a"), st("GPU", 3, "full_attention", 1)),
				rec(t, h("seq", "1", "incarnation", "b"), st("GPU", 0, nil, 2)),
			}
		}, want: want{blocks: b(tier.GPU, 2)}},
		{name: "gap_keeps_the_group", recs: func(t *testing.T) []Record {
			return []Record{
				rec(t, h("seq", "0"), st("GPU", 3, "full_attention", 1)),
				rec(t, h("seq", "5"), st("GPU", 0, nil, 2), st("GPU", 3, nil, 3)),
			}
		}, want: want{blocks: b(tier.GPU, 3), group: 3, groupSet: true, skipped: map[string]int{"other_group": 1}}},
		{name: "medium_spellings", recs: func(t *testing.T) []Record {
			return []Record{rec(t, h(), st("gpu", nil, nil, 1), st("Cpu_Pinned", nil, nil, 1), st("nvme", nil, nil, 1), st("hbm", nil, nil, 9))}
		}, want: want{blocks: cat(b(tier.GPU, 1), b(tier.CPU, 1), b(tier.Disk, 1)), skipped: map[string]int{"unknown_medium": 1}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := New(Config{})
			for i, r := range tc.recs(t) {
				if got := m.Apply(r); got != Applied {
					t.Fatalf("record %d: %q", i, got)
				}
			}
			want := tc.want
			if want.skipped == nil {
				want.skipped = map[string]int{}
			}
			g, set := m.Group(ep)
			got := want
			got.blocks, got.group, got.groupSet, got.skipped = m.Blocks(), g, set, m.SkippedEvents()
			if diff := cmp.Diff(want, got, cmp.AllowUnexported(want)); diff != "" {
				t.Fatalf("state (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRemapDropsBeforeNextRecord: after the medium map changes, an
// endpoint written under the old map loses its blocks when its next record
// arrives (any kind), not before; one that sends nothing keeps them.
func TestRemapDropsBeforeNextRecord(t *testing.T) {
	rec := func(pod string, headers map[string]string, evs ...any) Record {
		if evs == nil {
			return Record{Key: pod, Headers: headers}
		}
		return Record{Key: pod, Headers: headers, Value: batch(t, 1, 0, evs...)}
	}
	st := func(medium string, hs ...uint64) any {
		return map[string]any{"type": "BlockStored", "block_hashes": hs, "medium": medium}
	}
	m := New(Config{})
	for _, pod := range []string{"a", "b", "c"} {
		m.Apply(rec(pod, map[string]string{"model": "m"}, st("CPU_TIER2", 1), st("GPU", 2)))
	}
	remap := events.DefaultMediums()
	remap["CPU_TIER2"] = tier.CPU
	m.Remap(remap)
	m.Apply(rec("a", map[string]string{"model": "m", "kind": "heartbeat"}))
	m.Apply(rec("b", map[string]string{"model": "m"}, st("CPU_TIER2", 3)))
	got := map[string][]keyspace.Block{}
	for _, bl := range m.Blocks() {
		got[bl.Endpoint.Pod] = append(got[bl.Endpoint.Pod], bl)
	}
	want := map[string][]keyspace.Block{
		"b": {{Endpoint: keyspace.Endpoint{Model: "m", Pod: "b"}, Tier: tier.CPU, Hash: 3}},
		"c": {{Endpoint: keyspace.Endpoint{Model: "m", Pod: "c"}, Tier: tier.GPU, Hash: 2}, {Endpoint: keyspace.Endpoint{Model: "m", Pod: "c"}, Tier: tier.Disk, Hash: 1}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("blocks by pod after the remap (-want +got):\n%s", diff)
	}
}
