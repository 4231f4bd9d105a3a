package index

import (
	"cmp"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/internal/tier"
)

func TestSetArenaGrowAndShrink(t *testing.T) {
	var a setArena
	v := uint32(0)
	const n = 100
	var err error
	var added bool
	for id := uint32(n); id > 0; id-- {
		if v, added, err = a.add(v, id, tierBit(tier.CPU)); err != nil || !added {
			t.Fatalf("add %d: added %v err %v", id, added, err)
		}
	}
	ms := a.members(v &^ multiBit)
	if len(ms) != n || !slices.IsSortedFunc(ms, func(x, y uint32) int { return cmp.Compare(valueID(x), valueID(y)) }) {
		t.Fatalf("members %v: want %d sorted", ms, n)
	}
	for id := uint32(1); id < n; id++ {
		var removed bool
		if v, removed = a.remove(v, id, tierBit(tier.CPU)); !removed {
			t.Fatalf("remove %d: not removed", id)
		}
	}
	if v != inlineValue(n, tierBit(tier.CPU)) {
		t.Fatalf("after removing all but one, value %#x, want inline endpoint %d", v, n)
	}
	if a.live != 0 {
		t.Fatalf("arena keeps %d live words after the set went inline", a.live)
	}
	// Freed blocks are reused.
	words := len(a.words)
	v2 := uint32(0)
	for id := uint32(1); id <= 60; id++ {
		v2, _, _ = a.add(v2, id, tierBit(tier.GPU))
	}
	if len(a.words) != words {
		t.Fatalf("arena grew from %d to %d words though freed blocks fit", words, len(a.words))
	}
}
