package index

import (
	"fmt"
	"math/bits"

	"github.com/kvindex/kvindex/internal/tier"
)

// A model table maps a block hash to one uint32 "slot value" that says which
// endpoints hold the block and in which tiers:
//
//	bit 31 = 0: inline, one endpoint: endpoint ID << 3 | tier mask
//	bit 31 = 1: the low 31 bits are the offset of a set in the setArena
//
// A tier mask has bit (t-1) set for each tier t the endpoint holds the block
// in (gpu 1, cpu 2, disk 4); a stored mask is never zero, so the slot value
// 0 means "absent" and a map miss and a present value need no second check.
// Set members use the inline encoding and are sorted by endpoint ID.
const (
	multiBit = uint32(1) << 31
	maskBits = 3
	maskAll  = uint32(1)<<maskBits - 1
	// maxEndpointID is the largest endpoint ID the inline encoding holds.
	maxEndpointID = (multiBit >> maskBits) - 1
	// maxSetOffset is the largest arena offset a slot value holds.
	maxSetOffset = multiBit - 1
)

// inlineValue encodes one endpoint holding a block in the tiers of mask.
func inlineValue(id uint32, mask uint32) uint32 { return id<<maskBits | mask }

// valueID and valueMask decode an inline value or a set member.
func valueID(v uint32) uint32   { return v >> maskBits }
func valueMask(v uint32) uint32 { return v & maskAll }

// tierBit is the mask bit of a real tier.
func tierBit(t tier.Tier) uint32 { return 1 << (t - 1) }

// bestTier is the best tier in a non-zero mask (the lowest bit: gpu > cpu >
// disk).
func bestTier(mask uint32) tier.Tier { return tier.Tier(bits.TrailingZeros32(mask) + 1) }

// setArena stores the endpoint sets of blocks held by more than one
// endpoint in one flat []uint32, so the index holds no pointer per block
// (the garbage collector never scans it) and a set costs 4 bytes per member
// plus one header word, rounded up to its size class.
//
// A set at offset off is a block of 1+cap words: words[off] is the header
// (class << classShift | len) and words[off+1:off+1+len] the members,
// sorted by endpoint ID. Class c has room for 2<<c members. Freed blocks go
// on a per-class free list threaded through their first member word and are
// reused before the slice grows; the slice itself never shrinks.
type setArena struct {
	words []uint32
	// free holds, per class, 1 + the offset of the first free block, or 0.
	free [maxClass + 1]uint32
	// live is the number of words in blocks currently holding a set.
	live int
}

const (
	classShift = 27
	lenMask    = uint32(1)<<classShift - 1
	maxClass   = 26 // 2<<26 members: more than there are endpoint IDs
)

func classCap(c uint32) int { return 2 << c }

// classFor is the smallest class with room for n members (n >= 2).
func classFor(n int) uint32 {
	return uint32(bits.Len(uint(n-1))) - 1
}

// members returns the live members of the set at off (aliasing the arena).
func (a *setArena) members(off uint32) []uint32 {
	n := a.words[off] & lenMask
	return a.words[off+1 : off+1+n]
}

func (a *setArena) class(off uint32) uint32 { return a.words[off] >> classShift }

// alloc returns the offset of a free block of class c holding n members (the
// caller fills them in).
func (a *setArena) alloc(c uint32, n int) (uint32, error) {
	var off uint32
	if head := a.free[c]; head != 0 {
		off = head - 1
		a.free[c] = a.words[off+1]
	} else {
		size := 1 + classCap(c)
		if len(a.words)+size > int(maxSetOffset) {
			return 0, fmt.Errorf("%w: the endpoint-set arena is full (%d words)", ErrFull, len(a.words))
		}
		off = uint32(len(a.words))
		a.words = append(a.words, make([]uint32, size)...)
	}
	a.words[off] = c<<classShift | uint32(n)
	a.live += 1 + classCap(c)
	return off, nil
}

// release puts the block at off on its class's free list.
func (a *setArena) release(off uint32) {
	c := a.class(off)
	a.words[off] = c << classShift
	a.words[off+1] = a.free[c]
	a.free[c] = off + 1
	a.live -= 1 + classCap(c)
}

// search returns the position of endpoint id among the members of the set
// (sorted by ID) and whether it is there; when absent, the position is where
// it would be inserted.
func search(ms []uint32, id uint32) (int, bool) {
	if len(ms) <= 8 {
		for i, m := range ms {
			if mid := valueID(m); mid >= id {
				return i, mid == id
			}
		}
		return len(ms), false
	}
	lo, hi := 0, len(ms)
	for lo < hi {
		h := int(uint(lo+hi) >> 1)
		if valueID(ms[h]) < id {
			lo = h + 1
		} else {
			hi = h
		}
	}
	return lo, lo < len(ms) && valueID(ms[lo]) == id
}

// add records endpoint id holding the block in tier bit (one of 1, 2, 4)
// and returns the new slot value and whether the (endpoint, tier) was new.
// v is the current slot value (0 when absent).
func (a *setArena) add(v, id, bit uint32) (uint32, bool, error) {
	if v == 0 {
		return inlineValue(id, bit), true, nil
	}
	if v&multiBit == 0 {
		if valueID(v) == id {
			return v | bit, v&bit == 0, nil
		}
		off, err := a.alloc(0, 2)
		if err != nil {
			return v, false, err
		}
		ms := a.words[off+1 : off+3]
		if mine := inlineValue(id, bit); valueID(v) < id {
			ms[0], ms[1] = v, mine
		} else {
			ms[0], ms[1] = mine, v
		}
		return multiBit | off, true, nil
	}
	off := v &^ multiBit
	ms := a.members(off)
	i, found := search(ms, id)
	if found {
		old := ms[i]
		ms[i] |= bit
		return v, old&bit == 0, nil
	}
	n := len(ms)
	if c := a.class(off); n < classCap(c) {
		// Room in place: shift the tail right by one.
		ms = a.words[off+1 : off+2+uint32(n)]
		copy(ms[i+1:], ms[i:n])
		ms[i] = inlineValue(id, bit)
		a.words[off]++
		return v, true, nil
	}
	noff, err := a.alloc(classFor(n+1), n+1)
	if err != nil {
		return v, false, err
	}
	ms = a.members(off) // alloc may have moved the slice
	dst := a.words[noff+1 : noff+2+uint32(n)]
	copy(dst, ms[:i])
	dst[i] = inlineValue(id, bit)
	copy(dst[i+1:], ms[i:])
	a.release(off)
	return multiBit | noff, true, nil
}

// remove clears tier bit of endpoint id and returns the new slot value (0
// when no endpoint holds the block any more) and whether the (endpoint,
// tier) was present. A set shrinks to the inline form at one member and to
// a smaller class when a quarter full.
func (a *setArena) remove(v, id, bit uint32) (uint32, bool) {
	if v == 0 {
		return 0, false
	}
	if v&multiBit == 0 {
		if valueID(v) != id || v&bit == 0 {
			return v, false
		}
		if v&^bit&maskAll == 0 {
			return 0, true
		}
		return v &^ bit, true
	}
	off := v &^ multiBit
	ms := a.members(off)
	i, found := search(ms, id)
	if !found || ms[i]&bit == 0 {
		return v, false
	}
	if ms[i]&^bit&maskAll != 0 {
		ms[i] &^= bit
		return v, true
	}
	// The endpoint leaves the set.
	n := len(ms) - 1
	copy(ms[i:], ms[i+1:])
	a.words[off]--
	if n == 1 {
		last := a.words[off+1]
		a.release(off)
		return last, true
	}
	if c := a.class(off); c > 0 && n <= classCap(c)/4 {
		noff, err := a.alloc(classFor(n), n)
		if err != nil {
			return v, true // keep the roomy block; shrinking is optional
		}
		copy(a.words[noff+1:noff+1+uint32(n)], a.members(off))
		a.release(off)
		return multiBit | noff, true
	}
	return v, true
}
