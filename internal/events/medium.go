package events

import "github.com/kvindex/kvindex/internal/tier"

// MediumMap maps an engine's medium string to a tier. The empty string
// stands for a nil medium. A medium that is not in the map is skipped and
// counted (SkipUnknownMedium), never guessed.
type MediumMap map[string]tier.Tier

// DefaultMediums returns the DESIGN mapping: nil and "GPU" to gpu; "CPU",
// "CPU_TIER1" and "CPU_TIER2" to cpu; "Disk" and "DISK" to disk. The result
// is a fresh map the caller may extend.
func DefaultMediums() MediumMap {
	return MediumMap{
		"":          tier.GPU,
		"GPU":       tier.GPU,
		"CPU":       tier.CPU,
		"CPU_TIER1": tier.CPU,
		"CPU_TIER2": tier.CPU,
		"Disk":      tier.Disk,
		"DISK":      tier.Disk,
	}
}
