package client

// TierWeights weigh a matched block by the tier it is held in when scoring:
// a GPU hit skips its prefill outright, a CPU or disk hit still has to be
// loaded back. Each weight should lie in [0, 1].
type TierWeights struct {
	GPU, CPU, Disk float64
}

// DefaultTierWeights are gpu 1.0, cpu 0.8, disk 0.5.
func DefaultTierWeights() TierWeights { return TierWeights{GPU: 1.0, CPU: 0.8, Disk: 0.5} }

// weight is w's weight of tier t; an unspecified tier weighs nothing.
func (w TierWeights) weight(t Tier) float64 {
	switch t {
	case TierGPU:
		return w.GPU
	case TierCPU:
		return w.CPU
	case TierDisk:
		return w.Disk
	}
	return 0
}

// Score turns Lookup matches into per-endpoint scores in [0, 1]: the sum
// of the tier weights of an endpoint's matched blocks divided by
// promptBlocks, the number of full blocks of the prompt (len of the hashes
// looked up). An endpoint holding the whole prompt on GPU scores 1; one
// holding nothing is absent from the map (score 0). A non-positive
// promptBlocks gives an empty map. Scores are clamped to [0, 1] (a NaN to
// 0), so weights outside [0, 1], NaN or infinite ones, or matches longer
// than promptBlocks cannot push them out of range.
func Score(matches []Match, promptBlocks int, w TierWeights) map[Endpoint]float64 {
	out := make(map[Endpoint]float64, len(matches))
	if promptBlocks <= 0 {
		return out
	}
	for _, m := range matches {
		sum := 0.0
		for i := 0; i < m.Blocks && i < len(m.Tiers); i++ {
			sum += w.weight(m.Tiers[i])
		}
		out[m.Endpoint] = clamp01(sum / float64(promptBlocks))
	}
	return out
}

// clamp01 clamps x to [0, 1], NaN (a NaN or infinite weight) to 0.
func clamp01(x float64) float64 {
	if !(x > 0) {
		return 0
	}
	return min(x, 1)
}

// ScoreTokens is Score for matches of a token Lookup (LookupTokens), whose
// endpoints may have different block sizes: an endpoint's score is the
// sum of the tier weights of its matched blocks divided by the number of
// full blocks the prompt of promptTokens tokens has at its own BlockSize,
// so it is the weighted share of the prompt's keyable tokens it holds.
// Matches without a block size, or whose block size is larger than the
// prompt, are left out (score 0), as is everything when promptTokens is
// not positive. Scores are clamped to [0, 1].
func ScoreTokens(matches []Match, promptTokens int, w TierWeights) map[Endpoint]float64 {
	out := make(map[Endpoint]float64, len(matches))
	for _, m := range matches {
		if m.BlockSize <= 0 || promptTokens < m.BlockSize {
			continue
		}
		blocks := promptTokens / m.BlockSize
		sum := 0.0
		for i := 0; i < m.Blocks && i < len(m.Tiers); i++ {
			sum += w.weight(m.Tiers[i])
		}
		out[m.Endpoint] = clamp01(sum / float64(blocks))
	}
	return out
}
