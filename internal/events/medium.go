package events

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/kvindex/kvindex/internal/tier"
)

// MediumMap maps an engine's medium string to a tier (DESIGN v1.1 "Event
// wire format"). Names match case-insensitively: "cpu", "Cpu" and "CPU"
// are one name, so a map must not give two spellings of one name different
// tiers (Validate). The empty string stands for a nil medium. A medium
// that is not in the map is skipped and counted (SkipUnknownMedium), never
// guessed.
type MediumMap map[string]tier.Tier

// DefaultMediums returns the DESIGN v1.1 table: nil, "GPU" and "DEVICE" to
// gpu; "CPU", "CPU_PINNED" and "CPU_TIER1" to cpu; "CPU_TIER2", "DISK",
// "NVME", "STORAGE", "EXTERNAL" and "REMOTE" to disk. "CPU_TIER2" is SGLang
// HiCache's L3 (storage behind host memory), not host memory: were it cpu,
// an L2 eviction (a removal on CPU_TIER1) would erase the L3 copy. The
// result is a fresh map the caller may extend or change.
func DefaultMediums() MediumMap {
	return MediumMap{
		"":           tier.GPU,
		"GPU":        tier.GPU,
		"DEVICE":     tier.GPU,
		"CPU":        tier.CPU,
		"CPU_PINNED": tier.CPU,
		"CPU_TIER1":  tier.CPU,
		"CPU_TIER2":  tier.Disk,
		"DISK":       tier.Disk,
		"NVME":       tier.Disk,
		"STORAGE":    tier.Disk,
		"EXTERNAL":   tier.Disk,
		"REMOTE":     tier.Disk,
	}
}

// foldMedium is the case-folded form names are compared in. strings.ToUpper
// returns its argument without allocating when it has no lower-case letter,
// which is how engines spell mediums.
func foldMedium(name string) string { return strings.ToUpper(name) }

// Validate reports a map that cannot be used: a name mapped to a value that
// is not a real tier, or two spellings of one name (equal but for case)
// mapped to different tiers. The error names the medium.
func (m MediumMap) Validate() error {
	seen := make(map[string]string, len(m))
	for _, name := range m.names() {
		t := m[name]
		if !t.Valid() {
			return fmt.Errorf("events: medium %q maps to %v, not a tier", name, t)
		}
		f := foldMedium(name)
		if other, ok := seen[f]; ok && m[other] != t {
			return fmt.Errorf("events: mediums %q and %q differ only in case but map to %v and %v", other, name, m[other], t)
		}
		seen[f] = name
	}
	return nil
}

// names returns the map's names sorted, for a deterministic walk.
func (m MediumMap) names() []string {
	out := make([]string, 0, len(m))
	for name := range m {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// folded returns the map keyed by folded names. It assumes Validate passed
// (for a map that did not, one of the conflicting spellings wins).
func (m MediumMap) folded() map[string]tier.Tier {
	out := make(map[string]tier.Tier, len(m))
	for name, t := range m {
		out[foldMedium(name)] = t
	}
	return out
}

// Lookup returns the tier medium maps to, matching case-insensitively; ok
// is false when it maps to none. The decoder keeps a folded copy instead of
// calling this per event.
func (m MediumMap) Lookup(medium string) (tier.Tier, bool) {
	if t, ok := m[medium]; ok && t.Valid() {
		return t, true
	}
	f := foldMedium(medium)
	for name, t := range m {
		if foldMedium(name) == f && t.Valid() {
			return t, true
		}
	}
	return tier.Unknown, false
}

// FingerprintLen is the length of a Fingerprint: 16 lower-case hex digits.
const FingerprintLen = 16

// Fingerprint identifies what the map does: two maps that send every
// medium to the same tier (names compared case-insensitively) have the same
// fingerprint, and any other two differ with overwhelming probability. It
// is the first 8 bytes of the SHA-256 of the folded names and their tiers,
// sorted, one "LEN:NAME=tier\n" line each (LEN the name's byte length, so
// no name can forge another line), in hex. The ingester stores it in
// every endpoint record (DESIGN v1.1): an endpoint written under another
// map is dropped before its next record applies.
func (m MediumMap) Fingerprint() string {
	f := m.folded()
	names := make([]string, 0, len(f))
	for name := range f {
		names = append(names, name)
	}
	slices.Sort(names)
	h := sha256.New()
	for _, name := range names {
		fmt.Fprintf(h, "%d:%s=%s\n", len(name), name, f[name])
	}
	return hex.EncodeToString(h.Sum(nil)[:FingerprintLen/2])
}
