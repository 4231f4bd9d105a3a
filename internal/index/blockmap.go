package index

import "math/bits"

// blockMap is a model table's block hash -> slot value map (set.go's
// encoding; the value 0 means absent and is never stored). It replaced a
// Go map[uint64]uint32 for what was measured (BENCHMARKS.md "The block
// table"): a Go map's slots take 16 bytes (8-byte key, 4-byte value,
// padding) where two flat arrays take 12; the map cannot tell where a key
// will land before the insert, so a chunk's 64 inserts cannot start their
// cache misses together (touch), which is most of a cold start's build;
// and a Lookup probe is a call through the map's hashing where this is a
// multiply and a walk.
//
// Layout: ordered linear probing (Amble and Knuth, "Ordered hash
// tables", 1974) over two pointer-free arrays, keys and vals. A block hash
// h is stored as k = mix(h), a bijection, so engine hashes with little
// entropy in some bits still spread; k's home slot is k scaled to the
// home slots (the high word of k × homes, so any number of them, in k's
// order). Occupied slots hold strictly increasing k in array order,
// each at or after its home slot with no empty slot in between, so:
//
//   - a search walks from k's home slot and stops at k, at an empty slot,
//     or at the first larger key: a miss costs about what a hit does, even
//     near the load limit, where plain linear probing walks to the end of
//     the cluster;
//   - the table does not wrap: a cluster that runs past the last home slot
//     continues in a tail that grows as needed;
//   - growing keeps every key's order, so a rehash is one sequential pass
//     over both tables (appendSorted).
//
// The load limit is 7/8 of the home slots (a search still stops early),
// and the map grows by half: a Go map grows a small table at a time, and
// doubling a map this size would leave it between 7/16 and 7/8 full, up
// to 2× the heap for the same blocks; growing by half keeps it between
// 7/12 and 7/8. Not safe for concurrent mutation; the index's write lock
// covers it.
type blockMap struct {
	keys []uint64
	vals []uint32
	// n counts occupied slots; nhomes is the home slots (0 while keys is
	// nil: the map has no slots yet).
	n      int
	nhomes uint64
}

const (
	// blockMapMinHomes is the home slots of a map's first arrays.
	blockMapMinHomes = 8
	// blockMapTail is how many slots past the last home slot the arrays
	// get at first and grow by when a cluster runs into their end.
	blockMapTail = 32
)

// mix is the bijection from a block hash to its stored key: an
// xor-shift and a multiplication by an odd constant (the golden-ratio
// one of Fibonacci hashing), both invertible, so every bit of h reaches
// the high bits that pick the home slot.
func mix(h uint64) uint64 { return (h ^ h>>32) * mixMul }

// mixMul is mix's multiplier; mixInv is its inverse modulo 2^64.
const (
	mixMul = 0x9e3779b97f4a7c15
	mixInv = 0xf1de83e19937733d
)

// unmix inverts mix: unmix(mix(h)) == h for every h.
func unmix(k uint64) uint64 {
	x := k * mixInv
	return x ^ x>>32
}

// len returns the number of blocks the map holds.
func (m *blockMap) len() int { return m.n }

// homes returns the number of home slots (0 before the first insert).
func (m *blockMap) homes() int { return int(m.nhomes) }

// home returns stored key k's home slot: k scaled to the home slots,
// keeping k's order.
func (m *blockMap) home(k uint64) int {
	hi, _ := bits.Mul64(k, m.nhomes)
	return int(hi)
}

// get returns the slot value of stored key k, or 0 when the map does not
// hold it. It is find's walk written out, not a call of find: so it stays
// small enough to inline into Lookup's probe loop (a call of find is not,
// and measured 0-5% slower per hash).
func (m *blockMap) get(k uint64) uint32 {
	if m.n == 0 {
		return 0
	}
	keys, vals := m.keys, m.vals[:len(m.keys)]
	for i := m.home(k); i < len(keys); i++ {
		if vals[i] == 0 || keys[i] > k {
			return 0
		}
		if keys[i] == k {
			return vals[i]
		}
	}
	return 0
}

// touch loads stored key k's home slot in both arrays and returns a sum
// of what it read, so that a caller can start the cache misses of a batch
// of inserts before doing them, overlapped (a load whose result is kept
// live is Go's prefetch).
func (m *blockMap) touch(k uint64) uint32 {
	if m.n == 0 {
		return 0
	}
	i := m.home(k)
	return m.vals[i] + uint32(m.keys[i])
}

// find returns the slot of stored key k and true, or the slot where k
// belongs (an empty slot or the first larger key; len(m.keys) when the
// cluster runs to the end of the arrays) and false.
func (m *blockMap) find(k uint64) (int, bool) {
	if m.keys == nil {
		return 0, false
	}
	keys, vals := m.keys, m.vals[:len(m.keys)]
	i := m.home(k)
	for ; i < len(keys); i++ {
		if vals[i] == 0 || keys[i] > k {
			return i, false
		}
		if keys[i] == k {
			return i, true
		}
	}
	return i, false
}

// insertAt inserts key k with value v (non-zero) at slot i, which find
// returned for k with false, shifting the rest of the cluster one slot on.
func (m *blockMap) insertAt(i int, k uint64, v uint32) {
	if m.n+1 > m.homes()*7/8 {
		m.grow()
		i, _ = m.find(k)
	}
	// The cluster ends at the first empty slot at or after i.
	e := i
	for e < len(m.vals) && m.vals[e] != 0 {
		e++
	}
	if e == len(m.vals) {
		m.growTail()
	}
	copy(m.keys[i+1:e+1], m.keys[i:e])
	copy(m.vals[i+1:e+1], m.vals[i:e])
	m.keys[i], m.vals[i] = k, v
	m.n++
}

// deleteAt empties slot i and moves the keys after it that sit past
// their home slot one slot back, keeping the layout's rule.
func (m *blockMap) deleteAt(i int) {
	j := i + 1
	for j < len(m.vals) && m.vals[j] != 0 && m.home(m.keys[j]) < j {
		j++
	}
	copy(m.keys[i:j-1], m.keys[i+1:j])
	copy(m.vals[i:j-1], m.vals[i+1:j])
	m.keys[j-1], m.vals[j-1] = 0, 0
	m.n--
	if m.n == 0 {
		// Let an emptied model's arrays go.
		m.keys, m.vals, m.nhomes = nil, nil, 0
	}
}

// grow adds half the home slots (or makes the first ones).
func (m *blockMap) grow() { m.resize(max(blockMapMinHomes, m.homes()/2*3)) }

// resize moves every key to arrays of homes home slots (at least the
// present ones), in one pass, in order.
func (m *blockMap) resize(homes int) {
	old, oldVals := m.keys, m.vals
	m.keys = make([]uint64, homes+blockMapTail)
	m.vals = make([]uint32, homes+blockMapTail)
	m.nhomes = uint64(homes)
	m.n = 0
	next := 0
	for j, v := range oldVals {
		if v != 0 {
			next = m.appendSorted(next, old[j], v)
		}
	}
}

// appendSorted places key k, larger than every key placed so far, the last
// of them before slot next, at its home slot or at next, whichever is
// later, and returns the slot after it. It does not check the load limit.
func (m *blockMap) appendSorted(next int, k uint64, v uint32) int {
	i := max(next, m.home(k))
	if i >= len(m.keys) {
		m.growTail()
	}
	m.keys[i], m.vals[i] = k, v
	m.n++
	return i + 1
}

// growTail adds blockMapTail empty slots past the end of the arrays, for
// a cluster that runs into it.
func (m *blockMap) growTail() {
	m.keys = append(m.keys, make([]uint64, blockMapTail)...)
	m.vals = append(m.vals, make([]uint32, blockMapTail)...)
}
