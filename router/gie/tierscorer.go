package gie

import (
	"context"
	"encoding/json"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	framework "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
)

// TierScorerType is the plugin type of the tier scorer.
const TierScorerType = "kvindex-tier-scorer"

// TierScorer is an Affinity scorer of the producer's TierMatch attribute:
// an endpoint scores the tier weights of its matched blocks over the
// prompt's blocks, so a GPU holder of a prefix beats a CPU holder of the
// same prefix, which beats a disk holder. An endpoint without the
// attribute (the producer fell back) scores 0.
type TierScorer struct {
	typedName plugin.TypedName
	weights   TierWeights
}

var _ framework.Scorer = (*TierScorer)(nil)

// NewTierScorer returns a scorer named name with weights w.
func NewTierScorer(name string, w TierWeights) *TierScorer {
	if name == "" {
		name = TierScorerType
	}
	return &TierScorer{typedName: plugin.TypedName{Type: TierScorerType, Name: name}, weights: w}
}

// TierScorerFactory is the EPP factory of kvindex-tier-scorer; parameters
// are TierScorerParams.
func TierScorerFactory(name string, raw json.RawMessage, _ plugin.Handle) (plugin.Plugin, error) {
	w, err := ParseTierScorerParams(raw)
	if err != nil {
		return nil, err
	}
	return NewTierScorer(name, w), nil
}

// TypedName implements plugin.Plugin.
func (s *TierScorer) TypedName() plugin.TypedName { return s.typedName }

// Category is Affinity.
func (s *TierScorer) Category() framework.ScorerCategory { return framework.Affinity }

// Consumes names the TierMatch attribute.
func (s *TierScorer) Consumes() map[string]any { return map[string]any{TierMatchKey: TierMatch{}} }

// Weights returns the scorer's tier weights.
func (s *TierScorer) Weights() TierWeights { return s.weights }

// Score implements framework.Scorer.
func (s *TierScorer) Score(_ context.Context, _ *framework.CycleState, _ *framework.LLMRequest, endpoints []framework.Endpoint) map[framework.Endpoint]float64 {
	out := make(map[framework.Endpoint]float64, len(endpoints))
	for _, ep := range endpoints {
		out[ep] = 0
		v, ok := ep.Get(TierMatchKey)
		if !ok {
			continue
		}
		if tm, ok := v.(*TierMatch); ok {
			out[ep] = tm.Score(s.weights)
		}
	}
	return out
}
