package gie

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"

	framework "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/scorer/prefix"
)

// tieredIndex answers every Lookup with fixed per-pod tier lists: pod
// vllm-i holds len(tiers[i]) leading blocks, block j best in tiers[i][j].
type tieredIndex struct{ tiers [][]Tier }

func (f tieredIndex) LookupTokens(_ context.Context, _ string, _ Prompt, candidates []Identity) (IndexAnswer, error) {
	var ans IndexAnswer
	for i, ts := range f.tiers {
		if len(ts) == 0 {
			continue
		}
		id := Identity{Pod: podEndpoints(len(f.tiers))[i].GetMetadata().PodName}
		for _, c := range candidates {
			if c == id {
				ans.Matches = append(ans.Matches, IndexMatch{Identity: id, Blocks: len(ts), BlockSize: 16, Tiers: ts})
			}
		}
	}
	return ans, nil
}

// tiers returns gpu GPU blocks followed by cpu CPU blocks.
func tiers(gpu, cpu int) []Tier {
	out := make([]Tier, 0, gpu+cpu)
	for range gpu {
		out = append(out, TierGPU)
	}
	for range cpu {
		out = append(out, TierCPU)
	}
	return out
}

// scoreBoth runs the producer over a 12-block prompt against an index
// holding holders, then scores the candidates with the tier scorer (default
// weights) and with GIE's prefix-cache-scorer, which reads the
// PrefixCacheMatchInfo the same producer wrote.
func scoreBoth(t *testing.T, holders [][]Tier) (tier, pfx []float64) {
	t.Helper()
	p, err := NewProducer("", ProducerParams{Target: "x:1", PodIdentity: PodIdentityPodName}, tieredIndex{holders}, nil)
	if err != nil {
		t.Fatal(err)
	}
	eps := podEndpoints(len(holders))
	req := &framework.LLMRequest{RequestId: "r", TargetModel: "llama", TokenizedPrompt: &framework.TokenizedPrompt{TokenIDs: seq(12 * 16)}}
	if err := p.PrepareRequestData(t.Context(), req, eps); err != nil {
		t.Fatal(err)
	}
	ps, err := prefix.New(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ts := newTierScorer(t, DefaultTierWeights()).Score(t.Context(), nil, req, eps)
	pp := ps.Score(t.Context(), nil, req, eps)
	for _, ep := range eps {
		tier, pfx = append(tier, ts[ep]), append(pfx, pp[ep])
	}
	return tier, pfx
}

// argmax is the index of the highest score (the first of ties).
func argmax(s []float64) int {
	best := 0
	for i, v := range s {
		if v > s[best] {
			best = i
		}
	}
	return best
}

// TestTierScorerFollowsTheCostModel pins the tier scorer's rule: a
// candidate's rank is the prefill it saves, in prompt blocks, GPU blocks
// saving all of theirs and CPU blocks all but the load-back (1 - cpu
// weight); the scores are then scaled so that the best one is the prefix
// scorer's best (the longest match on any tier over the prompt's blocks).
// Over a 12-block prompt (saved blocks, then the scale):
func TestTierScorerFollowsTheCostModel(t *testing.T) {
	for _, tc := range []struct {
		name     string
		holders  [][]Tier
		want     []float64
		wantBest int
	}{
		// Saves 3.2; the longest match is 4 blocks: x 4/3.2.
		{"cpu_holder_beats_a_holder_of_nothing", [][]Tier{nil, tiers(0, 4)}, []float64{0, 4.0 / 12}, 1},
		// 4.8 against 6; the longest is the GPU holder's 6: x 1.
		{"gpu_holder_beats_a_cpu_holder_of_the_same_length", [][]Tier{tiers(0, 6), tiers(6, 0)}, []float64{0.8 * 6 / 12, 6.0 / 12}, 1},
		// 9 GPU blocks save 9; 10 CPU blocks save 10 - 0.2x10 = 8: x 10/9.
		{"shorter_gpu_prefix_that_saves_more_wins", [][]Tier{tiers(0, 10), tiers(9, 0)}, []float64{8.0 * 10 / 9 / 12, 10.0 / 12}, 1},
		// 7 GPU blocks save 7; 10 CPU blocks save 8: x 10/8.
		{"longer_cpu_prefix_that_saves_more_wins", [][]Tier{tiers(7, 0), tiers(0, 10)}, []float64{7.0 * 10 / 8 / 12, 10.0 / 12}, 1},
		// 6 GPU + 4 CPU save 9.2 against 9: x 10/9.2.
		{"gpu_head_and_cpu_tail", [][]Tier{tiers(9, 0), tiers(6, 4)}, []float64{9.0 * 10 / 9.2 / 12, 10.0 / 12}, 1},
		// Two longest holders, one of them on CPU, beside a shorter GPU
		// holder: 10, 8 and 5 saved; the longest is 10: x 1.
		{"a_tie_of_length_split_by_tier", [][]Tier{tiers(10, 0), tiers(0, 10), tiers(5, 0)}, []float64{10.0 / 12, 8.0 / 12, 5.0 / 12}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, pfx := scoreBoth(t, tc.holders)
			if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b float64) bool { return a-b < 1e-12 && b-a < 1e-12 })); diff != "" {
				t.Errorf("tier scores (-want +got):\n%s", diff)
			}
			if b := argmax(got); b != tc.wantBest {
				t.Errorf("best candidate %d, want %d (scores %v)", b, tc.wantBest, got)
			}
			// Affinity weighs against the load scorers as the prefix
			// scorer's does: the best candidate scores its best.
			if g, p := got[argmax(got)], pfx[argmax(pfx)]; g-p > 1e-12 || p-g > 1e-12 {
				t.Errorf("best tier score %v, want the best prefix score %v", g, p)
			}
		})
	}
}

// TestTierScorerIsThePrefixScorerWithoutCPUHolders: where no candidate
// holds a block off GPU, the tier scorer gives every candidate exactly
// what prefix-cache-scorer gives it (same ranking, same weight against
// the load scorers), blocks the index names no tier for included.
func TestTierScorerIsThePrefixScorerWithoutCPUHolders(t *testing.T) {
	for _, tc := range []struct {
		name    string
		holders [][]Tier
	}{
		{"nobody_holds_anything", [][]Tier{nil, nil, nil}},
		{"gpu_holders_of_different_lengths", [][]Tier{tiers(3, 0), nil, tiers(12, 0), tiers(7, 0)}},
		{"blocks_without_a_tier", [][]Tier{{TierUnspecified, TierUnspecified, TierGPU}, tiers(2, 0)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, pfx := scoreBoth(t, tc.holders)
			if diff := cmp.Diff(pfx, got); diff != "" {
				t.Errorf("tier scores against prefix-cache-scorer's (-prefix +tier):\n%s", diff)
			}
		})
	}
}

// TestTierScorerNilTierMatch: an endpoint whose TierMatch attribute is a
// nil pointer (a producer bug, or another plugin's) scores 0 instead of
// panicking the scheduling cycle, and does not change the others' scale.
func TestTierScorerNilTierMatch(t *testing.T) {
	eps := podEndpoints(2)
	eps[0].Put(TierMatchKey, (*TierMatch)(nil))
	eps[1].Put(TierMatchKey, &TierMatch{CPU: 4, Total: 12})
	got := newTierScorer(t, DefaultTierWeights()).Score(t.Context(), nil, &framework.LLMRequest{}, eps)
	if diff := cmp.Diff([]float64{0, 4.0 / 12}, []float64{got[eps[0]], got[eps[1]]}); diff != "" {
		t.Errorf("scores (-want +got):\n%s", diff)
	}
}

// TestTierScorerZeroWeights: with the CPU weight 0, CPU blocks save
// nothing, so CPU-only holders score as holders of nothing, and a GPU
// holder beats longer CPU ones at the longest match's score.
func TestTierScorerZeroWeights(t *testing.T) {
	eps := podEndpoints(3)
	eps[0].Put(TierMatchKey, &TierMatch{CPU: 6, Total: 12})
	eps[1].Put(TierMatchKey, &TierMatch{CPU: 3, Total: 12})
	s := newTierScorer(t, TierWeights{GPU: 1, CPU: 0, Disk: 0})
	got := s.Score(t.Context(), nil, &framework.LLMRequest{}, eps[:2])
	if diff := cmp.Diff([]float64{0, 0}, []float64{got[eps[0]], got[eps[1]]}); diff != "" {
		t.Errorf("CPU-only holders (-want +got):\n%s", diff)
	}
	eps[2].Put(TierMatchKey, &TierMatch{GPU: 2, Total: 12})
	got = s.Score(t.Context(), nil, &framework.LLMRequest{}, eps)
	if diff := cmp.Diff([]float64{0, 0, 6.0 / 12}, []float64{got[eps[0]], got[eps[1]], got[eps[2]]}); diff != "" {
		t.Errorf("with a GPU holder (-want +got):\n%s", diff)
	}
}

// newTierScorer is NewTierScorer for weights the test knows are valid.
func newTierScorer(t *testing.T, w TierWeights) *TierScorer {
	t.Helper()
	s, err := NewTierScorer("", w)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestNewTierScorerRefusesBadWeights: a weight outside [0, 1], NaN
// included, is an invalid config from the Go API as from the JSON one.
func TestNewTierScorerRefusesBadWeights(t *testing.T) {
	for _, w := range []TierWeights{{GPU: 1.5, CPU: 0.8, Disk: 0.5}, {GPU: 1, CPU: -0.1, Disk: 0.5}, {GPU: 1, CPU: 0.8, Disk: math.NaN()}} {
		if s, err := NewTierScorer("", w); !errors.Is(err, ErrInvalidConfig) || s != nil {
			t.Errorf("%+v: scorer %v, err %v; want nil and ErrInvalidConfig", w, s, err)
		}
	}
	s, err := NewTierScorer("mine", TierWeights{})
	if err != nil || s.TypedName().Name != "mine" || s.Weights() != (TierWeights{}) {
		t.Errorf("zero weights: %v, %v; want a scorer named mine", s, err)
	}
}
