package client

import (
	"math"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestScore(t *testing.T) {
	a, b := Endpoint{Pod: "a"}, Endpoint{Pod: "b", DPRank: 1}
	gpu, cpu, disk := TierGPU, TierCPU, TierDisk
	for _, tc := range []struct {
		name    string
		matches []Match
		blocks  int
		w       TierWeights
		want    map[Endpoint]float64
	}{
		{name: "whole_prompt_on_gpu", blocks: 2, w: DefaultTierWeights(),
			matches: []Match{{Endpoint: a, Blocks: 2, Tiers: []Tier{gpu, gpu}}},
			want:    map[Endpoint]float64{a: 1}},
		{name: "tier_weights_normalised_by_prompt", blocks: 4, w: DefaultTierWeights(),
			matches: []Match{{Endpoint: a, Blocks: 3, Tiers: []Tier{gpu, cpu, disk}}, {Endpoint: b, Blocks: 1, Tiers: []Tier{cpu}}},
			want:    map[Endpoint]float64{a: (1 + 0.8 + 0.5) / 4, b: 0.8 / 4}},
		{name: "custom_weights", blocks: 2, w: TierWeights{GPU: 1, CPU: 0.5, Disk: 0},
			matches: []Match{{Endpoint: a, Blocks: 2, Tiers: []Tier{cpu, disk}}},
			want:    map[Endpoint]float64{a: 0.25}},
		{name: "longer_match_than_prompt_clamped", blocks: 1, w: DefaultTierWeights(),
			matches: []Match{{Endpoint: a, Blocks: 3, Tiers: []Tier{gpu, gpu, gpu}}},
			want:    map[Endpoint]float64{a: 1}},
		{name: "weights_out_of_range_clamped", blocks: 1, w: TierWeights{GPU: 7, CPU: -3},
			matches: []Match{{Endpoint: a, Blocks: 1, Tiers: []Tier{gpu}}, {Endpoint: b, Blocks: 1, Tiers: []Tier{cpu}}},
			want:    map[Endpoint]float64{a: 1, b: 0}},
		{name: "nan_and_infinite_weights_clamped", blocks: 1, w: TierWeights{GPU: math.NaN(), CPU: math.Inf(1), Disk: math.Inf(-1)},
			matches: []Match{{Endpoint: a, Blocks: 1, Tiers: []Tier{gpu}}, {Endpoint: b, Blocks: 1, Tiers: []Tier{cpu}}, {Endpoint: Endpoint{Pod: "c"}, Blocks: 1, Tiers: []Tier{disk}}},
			want:    map[Endpoint]float64{a: 0, b: 1, {Pod: "c"}: 0}},
		{name: "unspecified_tier_weighs_nothing", blocks: 2, w: DefaultTierWeights(),
			matches: []Match{{Endpoint: a, Blocks: 2, Tiers: []Tier{gpu, TierUnspecified}}},
			want:    map[Endpoint]float64{a: 0.5}},
		{name: "empty_prompt", blocks: 0, w: DefaultTierWeights(),
			matches: []Match{{Endpoint: a, Blocks: 1, Tiers: []Tier{gpu}}},
			want:    map[Endpoint]float64{}},
		{name: "no_matches", blocks: 5, w: DefaultTierWeights(), want: map[Endpoint]float64{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Score(tc.matches, tc.blocks, tc.w)
			if diff := gocmp.Diff(tc.want, got, cmpopts.EquateApprox(0, 1e-12)); diff != "" {
				t.Fatalf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestScoreTokens(t *testing.T) {
	a, b, c := Endpoint{Pod: "a"}, Endpoint{Pod: "b"}, Endpoint{Pod: "c"}
	gpu, cpu := TierGPU, TierCPU
	for _, tc := range []struct {
		name    string
		matches []Match
		tokens  int
		want    map[Endpoint]float64
	}{
		{name: "per_endpoint_block_size", tokens: 70, matches: []Match{
			{Endpoint: a, Blocks: 4, Tiers: []Tier{gpu, gpu, gpu, gpu}, BlockSize: 16}, // 4 of 4 blocks of 16
			{Endpoint: b, Blocks: 1, Tiers: []Tier{cpu}, BlockSize: 32},                // 1 of 2 blocks of 32
		}, want: map[Endpoint]float64{a: 1, b: 0.8 / 2}},
		{name: "unknown_or_oversized_block_size_left_out", tokens: 20, matches: []Match{
			{Endpoint: a, Blocks: 1, Tiers: []Tier{gpu}},
			{Endpoint: b, Blocks: 1, Tiers: []Tier{gpu}, BlockSize: 32},
			{Endpoint: c, Blocks: 1, Tiers: []Tier{gpu}, BlockSize: 16},
		}, want: map[Endpoint]float64{c: 1}},
		{name: "empty_prompt", tokens: 0, matches: []Match{{Endpoint: a, Blocks: 1, Tiers: []Tier{gpu}, BlockSize: 16}}, want: map[Endpoint]float64{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ScoreTokens(tc.matches, tc.tokens, DefaultTierWeights())
			if diff := gocmp.Diff(tc.want, got, cmpopts.EquateApprox(0, 1e-12)); diff != "" {
				t.Fatalf("(-want +got):\n%s", diff)
			}
		})
	}
}
