package gie

import (
	"context"
	"encoding/json"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	framework "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	attrprefix "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/attribute/prefix"
)

// TierScorerType is the plugin type of the tier scorer.
const TierScorerType = "kvindex-tier-scorer"

// TierScorer is an Affinity scorer of the producer's TierMatch attribute:
// endpoints rank by the tier weights of their matched blocks (the prefill
// each saves), so a GPU holder of a prefix beats a CPU holder of the same
// prefix, which beats a disk holder, and the best of them scores what
// prefix-cache-scorer gives the best (see Score; docs/router.md). It
// takes prefix-cache-scorer's place in a profile, at that scorer's
// weight: the balance between affinity and the load scorers stays the one
// the profile chose, and only the tiers reorder holders. An endpoint
// without a TierMatch (the producer fell back) scores its
// PrefixCacheMatchInfo (the approximate producer's guess, which knows no
// tiers) as prefix-cache-scorer would, and 0 without either.
type TierScorer struct {
	typedName plugin.TypedName
	weights   TierWeights
}

var _ framework.Scorer = (*TierScorer)(nil)

// NewTierScorer returns a scorer named name (empty: TierScorerType) with
// weights w; it returns an error wrapping ErrInvalidConfig when a weight
// is outside [0, 1] (TierWeights.Validate).
func NewTierScorer(name string, w TierWeights) (*TierScorer, error) {
	if err := w.Validate(); err != nil {
		return nil, err
	}
	if name == "" {
		name = TierScorerType
	}
	return &TierScorer{typedName: plugin.TypedName{Type: TierScorerType, Name: name}, weights: w}, nil
}

// TierScorerFactory is the EPP factory of kvindex-tier-scorer; parameters
// are TierScorerParams.
func TierScorerFactory(name string, raw json.RawMessage, _ plugin.Handle) (plugin.Plugin, error) {
	w, err := ParseTierScorerParams(raw)
	if err != nil {
		return nil, err
	}
	return NewTierScorer(name, w)
}

// TypedName implements plugin.Plugin.
func (s *TierScorer) TypedName() plugin.TypedName { return s.typedName }

// Category is Affinity.
func (s *TierScorer) Category() framework.ScorerCategory { return framework.Affinity }

// Consumes names the TierMatch attribute and the prefix match attribute
// (read when TierMatch is absent).
func (s *TierScorer) Consumes() map[string]any {
	return map[string]any{TierMatchKey: TierMatch{}, attrprefix.PrefixCacheMatchInfoKey: attrprefix.PrefixCacheMatchInfo{}}
}

// Weights returns the scorer's tier weights.
func (s *TierScorer) Weights() TierWeights { return s.weights }

// Score implements framework.Scorer. Each endpoint with a TierMatch first
// scores its saved prefill (TierMatch.Score); those scores are then scaled
// together so that the best of them equals the best prefix fraction
// (matched blocks on any tier over the prompt's, what prefix-cache-scorer
// gives): affinity weighs against the load scorers as strongly as the
// prefix scorer's, and the tiers only order the holders. Where no
// candidate holds a block off GPU the scale is 1.
func (s *TierScorer) Score(_ context.Context, _ *framework.CycleState, _ *framework.LLMRequest, endpoints []framework.Endpoint) map[framework.Endpoint]float64 {
	out := make(map[framework.Endpoint]float64, len(endpoints))
	var tiered []framework.Endpoint
	bestSaved, bestPrefix := 0.0, 0.0
	for _, ep := range endpoints {
		out[ep] = 0
		if v, ok := ep.Get(TierMatchKey); ok {
			if tm, ok := v.(*TierMatch); ok && tm != nil {
				out[ep] = tm.Score(s.weights)
				tiered = append(tiered, ep)
				bestSaved = max(bestSaved, out[ep])
				bestPrefix = max(bestPrefix, matchFraction(tm.Blocks(), tm.Total))
				continue
			}
		}
		if v, ok := ep.Get(attrprefix.PrefixCacheMatchInfoKey); ok {
			if pi, ok := v.(*attrprefix.PrefixCacheMatchInfo); ok {
				out[ep] = matchFraction(pi.MatchBlocks(), pi.TotalBlocks())
			}
		}
	}
	if bestSaved > 0 && bestPrefix > bestSaved {
		scale := bestPrefix / bestSaved
		for _, ep := range tiered {
			out[ep] = min(out[ep]*scale, 1)
		}
	}
	return out
}

// matchFraction is matched blocks over the prompt's total, in [0, 1], as
// prefix-cache-scorer scores it; 0 when total is not positive.
func matchFraction(matched, total int) float64 {
	if total <= 0 {
		return 0
	}
	return min(max(float64(matched)/float64(total), 0), 1)
}
