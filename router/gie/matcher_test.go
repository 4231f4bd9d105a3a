package gie

import (
	"context"
	"slices"
	"testing"
	"time"

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
			name:       "an_endpoint_named_twice_takes_its_longer_entry",
			candidates: []Identity{a},
			matches: []IndexMatch{
				{Identity: a, Blocks: 3, BlockSize: 16, Tiers: []Tier{TierGPU, TierGPU, TierGPU}},
				{Identity: a, Blocks: 1, BlockSize: 16, Tiers: []Tier{TierCPU}},
			},
			spec: none, specBS: 16, tokens: 64,
			want: map[Identity]EndpointMatch{a: {Blocks: 3, Total: 4, BlockSize: 16, GPU: 3}},
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
			// A block without a tier (short Tiers, or unspecified) is
			// held all the same: it counts as GPU, so the split always
			// adds up to Blocks, as PrefixCacheMatchInfo counts it.
			name:       "blocks_without_a_tier_count_as_gpu",
			candidates: []Identity{a, b},
			matches: []IndexMatch{
				{Identity: a, Blocks: 3, BlockSize: 16, Tiers: []Tier{TierCPU}},
				{Identity: b, Blocks: 2, BlockSize: 16, Tiers: []Tier{TierUnspecified, TierDisk}},
			},
			spec: none, specBS: 16, tokens: 64,
			want: map[Identity]EndpointMatch{
				a: {Blocks: 3, Total: 4, BlockSize: 16, GPU: 2, CPU: 1},
				b: {Blocks: 2, Total: 4, BlockSize: 16, GPU: 1, Disk: 1},
			},
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

// laggingIndex is an Index whose answer is fixed and whose progress time
// trails the test clock by lag (zero progress when noProgress).
type laggingIndex struct {
	clock      *clock
	lag        time.Duration
	noProgress bool
	matches    []IndexMatch
}

func (f *laggingIndex) LookupTokens(_ context.Context, _ string, _ Prompt, candidates []Identity) (IndexAnswer, error) {
	var out []IndexMatch
	for _, m := range f.matches {
		if len(candidates) == 0 || slices.Contains(candidates, m.Identity) {
			out = append(out, m)
		}
	}
	ans := IndexAnswer{Matches: out}
	if !f.noProgress {
		ans.ProgressTime = f.clock.now().Add(-f.lag)
	}
	return ans, nil
}

// TestEvictedHolderLosesWithinTheTTL reproduces the measurement of issue
// 24: A was chosen for an 8-block prompt (speculative entries), then A's
// blocks left the index while B holds 3 of them, and a request for the
// prompt comes every 0.5 s, each routed to the endpoint with the most
// blocks and remembered. B must win by the first request one round trip
// (0.5 s here) after the decision's TTL at the latest, and from then on
// always; with the index caught up, sooner.
func TestEvictedHolderLosesWithinTheTTL(t *testing.T) {
	const (
		ttl      = 2 * time.Second
		indexLag = 500 * time.Millisecond
		every    = 500 * time.Millisecond
	)
	a, b := Identity{Pod: "a"}, Identity{Pod: "b"}
	for _, tc := range []struct {
		name string
		idx  laggingIndex
		// within is how long after the decision B must have won.
		within time.Duration
	}{
		{"index_without_progress_time", laggingIndex{noProgress: true}, ttl + every},
		{"index_far_behind", laggingIndex{lag: time.Minute}, ttl + every},
		{"index_current", laggingIndex{lag: 0}, indexLag + every},
		{"index_100ms_behind", laggingIndex{lag: 100 * time.Millisecond}, indexLag + 100*time.Millisecond + every},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t0 := time.Unix(1000, 0)
			c := &clock{t: t0}
			idx := tc.idx
			idx.clock = c
			idx.matches = []IndexMatch{{Identity: b, Blocks: 3, BlockSize: 16, Tiers: []Tier{TierGPU, TierGPU, TierGPU}}}
			spec := NewSpeculative(ttl, indexLag, 1000, 16, c.now)
			// The answers' ages are the test clock's, and one case is a
			// minute behind: the staleness check (TestStaleAnswerFallsBack)
			// is off here, the entries' rule is the subject.
			cfg := DefaultMatcherConfig()
			cfg.MaxStaleness = 0
			m, err := NewMatcher(cfg, &idx, spec)
			if err != nil {
				t.Fatal(err)
			}
			p := Prompt{TokenIDs: seq(8 * 16)}
			m.Remember("m", p, a) // the decision, made just before the eviction
			var firstB time.Duration = -1
			for step := range 20 { // 10 s of requests
				c.add(every)
				ems, err := m.Match(t.Context(), "m", p, []Identity{a, b})
				if err != nil {
					t.Fatal(err)
				}
				winner := a
				if ems[b].Blocks > ems[a].Blocks {
					winner = b
				}
				m.Remember("m", p, winner)
				since := time.Duration(step+1) * every
				switch {
				case winner == b && firstB < 0:
					firstB = since
				case winner == a && firstB >= 0:
					t.Fatalf("A won again at %v after B won at %v", since, firstB)
				case winner == a && ems[a].Speculative == 0:
					t.Fatalf("A won at %v without speculative credit: %+v", since, ems[a])
				}
			}
			if firstB < 0 || firstB > tc.within {
				t.Errorf("B first won %v after the decision, want within %v", firstB, tc.within)
			}
		})
	}
}
