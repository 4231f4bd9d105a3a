// Package tier names the memory tiers a KV-cache block can live in (GPU,
// CPU, disk) and the order between them. The names are the ones used in
// etcd keys (DESIGN "etcd keyspace"); the numbers match the kvindex.v1 Tier
// enum, so a conversion is a cast.
package tier

import "fmt"

// Tier is a memory tier. The zero value is Unknown, never a real tier.
// Lower non-zero values are better tiers: GPU beats CPU beats Disk.
type Tier uint8

// The tiers, numbered as kvindex.v1.Tier. Which engine mediums land in
// each is the medium table's business (events.DefaultMediums, DESIGN v1.1):
// the tier says what kind of memory holds the block, not which engine
// named it.
const (
	// Unknown is no tier: never stored, never returned for a match.
	Unknown Tier = 0
	// GPU is accelerator memory (mediums none, GPU, DEVICE).
	GPU Tier = 1
	// CPU is host memory (CPU, CPU_PINNED, CPU_TIER1).
	CPU Tier = 2
	// Disk is storage behind host memory: local disk, NVMe, remote and
	// external stores, and SGLang HiCache's L3 (CPU_TIER2, DISK, NVME,
	// STORAGE, EXTERNAL, REMOTE).
	Disk Tier = 3
)

// All lists the real tiers from best to worst.
var All = [...]Tier{GPU, CPU, Disk}

// Count is the number of real tiers; a real tier t satisfies 1 <= t <= Count.
const Count = len(All)

// String returns the key segment of the tier ("gpu", "cpu", "disk"), or
// "unknown(N)" for a value that is not a real tier.
func (t Tier) String() string {
	switch t {
	case GPU:
		return "gpu"
	case CPU:
		return "cpu"
	case Disk:
		return "disk"
	}
	return fmt.Sprintf("unknown(%d)", uint8(t))
}

// Valid reports whether t is a real tier.
func (t Tier) Valid() bool { return t >= GPU && t <= Disk }

// Better reports whether t is a better tier than u. A real tier is better
// than Unknown.
func (t Tier) Better(u Tier) bool {
	if !t.Valid() {
		return false
	}
	return !u.Valid() || t < u
}

// Parse maps a key segment ("gpu", "cpu", "disk") back to its tier. It
// returns Unknown and false for anything else, "GPU" included: key
// segments are lower case. It does not accept engine medium names (see
// events.MediumMap for those).
func Parse(s string) (Tier, bool) {
	switch s {
	case "gpu":
		return GPU, true
	case "cpu":
		return CPU, true
	case "disk":
		return Disk, true
	}
	return Unknown, false
}

// FormatRuns renders a prefix's tiers, block by block, as runs of one
// tier ("gpu×3 cpu×2"), so long prefixes stay readable in the CLI and on
// the status page. T is this package's Tier or the client library's (any
// comparable type that prints as its name); an empty slice is "".
func FormatRuns[T comparable](ts []T) string {
	var b []byte
	for i := 0; i < len(ts); {
		j := i
		for j < len(ts) && ts[j] == ts[i] {
			j++
		}
		if len(b) > 0 {
			b = append(b, ' ')
		}
		b = fmt.Appendf(b, "%v×%d", ts[i], j-i)
		i = j
	}
	return string(b)
}
