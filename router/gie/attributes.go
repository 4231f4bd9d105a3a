package gie

import (
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
)

// TierMatchKey is the endpoint attribute holding a *TierMatch, put by the
// producer and read by the tier scorer.
const TierMatchKey = "kvindex.TierMatch"

// TierMatch is one endpoint's match split by tier: of the prompt's Total
// full blocks of BlockSize tokens, its first GPU+CPU+Disk blocks are
// cached on it, GPU of them best held in GPU memory, and so on. The value
// type (TierMatch{}) is what Produces and Consumes name.
type TierMatch struct {
	GPU, CPU, Disk   int
	Total, BlockSize int
}

// Clone implements the EPP's Cloneable; a nil TierMatch clones to nil
// (GIE's attribute map clones on every Get).
func (t *TierMatch) Clone() fwkdl.Cloneable {
	if t == nil {
		return (*TierMatch)(nil)
	}
	c := *t
	return &c
}

// Blocks is the matched prefix length in blocks.
func (t *TierMatch) Blocks() int { return t.GPU + t.CPU + t.Disk }

// Score weighs the matched blocks by tier and divides by Total: in [0, 1],
// 0 when Total is 0.
func (t *TierMatch) Score(w TierWeights) float64 {
	if t.Total <= 0 {
		return 0
	}
	s := (float64(t.GPU)*w.GPU + float64(t.CPU)*w.CPU + float64(t.Disk)*w.Disk) / float64(t.Total)
	return min(max(s, 0), 1)
}
