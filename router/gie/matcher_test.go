package gie

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestMerge(t *testing.T) {
	a, b, c := Identity{Pod: "a"}, Identity{Pod: "b"}, Identity{Pod: "c", Rank: 1}
	none := func(Identity) int { return 0 }
	tests := []struct {
		name       string
		candidates []Identity
		matches    []IndexMatch
		spec       func(Identity) int
		specBS     int
		tokens     int
		want       map[Identity]EndpointMatch
	}{
		{
			name:       "tiers_and_absent_candidates",
			candidates: []Identity{a, b, c},
			matches: []IndexMatch{
				{Identity: a, Blocks: 3, BlockSize: 16, Tiers: []Tier{TierGPU, TierGPU, TierCPU}},
				{Identity: c, Blocks: 1, BlockSize: 16, Tiers: []Tier{TierDisk}},
			},
			spec: none, specBS: 16, tokens: 70,
			want: map[Identity]EndpointMatch{
				a: {Blocks: 3, Total: 4, BlockSize: 16, GPU: 2, CPU: 1},
				b: {Blocks: 0, Total: 4, BlockSize: 16},
				c: {Blocks: 1, Total: 4, BlockSize: 16, Disk: 1},
			},
		},
		{
			name:       "per_endpoint_block_size",
			candidates: []Identity{a, b},
			matches:    []IndexMatch{{Identity: a, Blocks: 2, BlockSize: 32, Tiers: []Tier{TierGPU, TierGPU}}},
			spec:       none, specBS: 16, tokens: 64,
			want: map[Identity]EndpointMatch{
				a: {Blocks: 2, Total: 2, BlockSize: 32, GPU: 2},
				b: {Blocks: 0, Total: 4, BlockSize: 16},
			},
		},
		{
			name:       "speculative_extends_the_index",
			candidates: []Identity{a, b},
			matches:    []IndexMatch{{Identity: a, Blocks: 1, BlockSize: 16, Tiers: []Tier{TierCPU}}},
			spec: func(id Identity) int {
				if id == a {
					return 4
				}
				return 2
			},
			specBS: 16, tokens: 64,
			want: map[Identity]EndpointMatch{
				a: {Blocks: 4, Total: 4, BlockSize: 16, CPU: 1, GPU: 3, Speculative: 3},
				b: {Blocks: 2, Total: 4, BlockSize: 16, GPU: 2, Speculative: 2},
			},
		},
		{
			name:       "speculative_shorter_than_the_index_adds_nothing",
			candidates: []Identity{a},
			matches:    []IndexMatch{{Identity: a, Blocks: 3, BlockSize: 16, Tiers: []Tier{TierGPU, TierGPU, TierGPU}}},
			spec:       func(Identity) int { return 2 }, specBS: 16, tokens: 64,
			want: map[Identity]EndpointMatch{a: {Blocks: 3, Total: 4, BlockSize: 16, GPU: 3}},
		},
		{
			name:       "speculative_converted_to_larger_blocks",
			candidates: []Identity{a},
			matches:    []IndexMatch{{Identity: a, Blocks: 0, BlockSize: 32}},
			spec:       func(Identity) int { return 3 }, specBS: 16, tokens: 128,
			want: map[Identity]EndpointMatch{a: {Blocks: 1, Total: 4, BlockSize: 32, GPU: 1, Speculative: 1}},
		},
		{
			name:       "index_match_capped_at_total",
			candidates: []Identity{a},
			matches:    []IndexMatch{{Identity: a, Blocks: 9, BlockSize: 16, Tiers: []Tier{TierGPU, TierGPU}}},
			spec:       none, specBS: 16, tokens: 32,
			want: map[Identity]EndpointMatch{a: {Blocks: 2, Total: 2, BlockSize: 16, GPU: 2}},
		},
		{
			name:    "no_candidates_means_the_index_answer",
			matches: []IndexMatch{{Identity: b, Blocks: 1, BlockSize: 16, Tiers: []Tier{TierGPU}}},
			spec:    none, specBS: 16, tokens: 16,
			want: map[Identity]EndpointMatch{b: {Blocks: 1, Total: 1, BlockSize: 16, GPU: 1}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := merge(tc.candidates, tc.matches, tc.spec, tc.specBS, tc.tokens, 16)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("merge (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTruncate(t *testing.T) {
	m := &Matcher{cfg: MatcherConfig{MaxPromptTokens: 4}}
	p := m.truncate(Prompt{TokenIDs: seq(10), MultiModal: []MultiModalItem{{Hash: "x", Offset: 2, Length: 5}, {Hash: "y", Offset: 6, Length: 1}}})
	want := Prompt{TokenIDs: seq(4), MultiModal: []MultiModalItem{{Hash: "x", Offset: 2, Length: 5}}}
	if diff := cmp.Diff(want, p); diff != "" {
		t.Errorf("truncate (-want +got):\n%s", diff)
	}
}
