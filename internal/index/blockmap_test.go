package index

import (
	"math/rand/v2"
	"testing"
)

// checkBlockMap fails t unless m keeps its layout's rule: occupied keys
// strictly increasing in array order, each at or after its home slot with
// no empty slot in between, and n counting them.
func checkBlockMap(t *testing.T, m *blockMap) {
	t.Helper()
	n, last, lastAt := 0, uint64(0), -1
	for i, v := range m.vals {
		if v == 0 {
			continue
		}
		n++
		k := m.keys[i]
		if lastAt >= 0 && k <= last {
			t.Fatalf("slot %d holds key %#x after %#x at slot %d: not increasing", i, k, last, lastAt)
		}
		home := m.home(k)
		if home > i {
			t.Fatalf("slot %d holds key %#x whose home slot is %d", i, k, home)
		}
		for j := home; j < i; j++ {
			if m.vals[j] == 0 {
				t.Fatalf("key %#x at slot %d: slot %d between it and its home slot %d is empty", k, i, j, home)
			}
		}
		last, lastAt = k, i
	}
	if n != m.n {
		t.Fatalf("the map counts %d keys, its slots hold %d", m.n, n)
	}
}

// TestBlockMapAgainstMap runs seeded random sets and removals against a
// Go map, on stored keys as a hash function would give them and as they
// would be were mix not there (small integers, keys differing only in
// their top bits, 0 and all ones), through growth and back to empty.
func TestBlockMapAgainstMap(t *testing.T) {
	shapes := map[string]func(r *rand.Rand) uint64{
		"random":   func(r *rand.Rand) uint64 { return r.Uint64() },
		"small":    func(r *rand.Rand) uint64 { return r.Uint64N(3000) },
		"top_bits": func(r *rand.Rand) uint64 { return r.Uint64N(3000) << 52 },
		"extremes": func(r *rand.Rand) uint64 { return []uint64{0, 1, ^uint64(0), 1 << 63, ^uint64(0) >> 1}[r.IntN(5)] },
	}
	for name, key := range shapes {
		t.Run(name, func(t *testing.T) {
			for seed := uint64(1); seed <= 5; seed++ {
				r := rand.New(rand.NewPCG(seed, 24))
				var m blockMap
				ref := map[uint64]uint32{}
				for step := range 20_000 {
					h := key(r)
					switch op := r.IntN(10); {
					case op < 6 || step < 3000: // set
						v := uint32(r.Uint32N(1<<20) + 1)
						setKey(&m, h, v)
						ref[h] = v
					case op < 9: // remove
						setKey(&m, h, 0)
						delete(ref, h)
					default: // remove a held key
						for k := range ref {
							setKey(&m, k, 0)
							delete(ref, k)
							break
						}
					}
					if step%997 == 0 {
						checkBlockMap(t, &m)
					}
				}
				checkBlockMap(t, &m)
				if m.len() != len(ref) {
					t.Fatalf("seed %d: map holds %d keys, reference %d", seed, m.len(), len(ref))
				}
				for k, v := range ref {
					if got := m.get(k); got != v {
						t.Fatalf("seed %d: get(%#x) = %d, want %d", seed, k, got, v)
					}
				}
				for range 2000 {
					if h := key(r); m.get(h) != ref[h] {
						t.Fatalf("seed %d: get(%#x) = %d, want %d", seed, h, m.get(h), ref[h])
					}
				}
				for k := range ref {
					setKey(&m, k, 0)
				}
				checkBlockMap(t, &m)
				if m.len() != 0 || m.keys != nil {
					t.Fatalf("seed %d: emptied map holds %d keys, arrays %d", seed, m.len(), len(m.keys))
				}
			}
		})
	}
}

// TestBlockMapGrowKeepsOrder fills two maps past several doublings with
// the same keys in opposite orders; both end with the same slots (an
// ordered table's layout depends on its keys only).
func TestBlockMapGrowKeepsOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	hs := make([]uint64, 50_000)
	for i := range hs {
		hs[i] = r.Uint64()
	}
	var a, b blockMap
	for i, h := range hs {
		setKey(&a, h, uint32(i+1))
	}
	for i := len(hs) - 1; i >= 0; i-- {
		setKey(&b, hs[i], uint32(i+1))
	}
	checkBlockMap(t, &a)
	checkBlockMap(t, &b)
	if a.homes() != b.homes() || len(a.keys) < a.homes() {
		t.Fatalf("home slots %d and %d, arrays %d", a.homes(), b.homes(), len(a.keys))
	}
	for i := range min(len(a.keys), len(b.keys)) {
		if a.vals[i] != b.vals[i] || (a.vals[i] != 0 && a.keys[i] != b.keys[i]) {
			t.Fatalf("slot %d differs: %#x=%d against %#x=%d", i, a.keys[i], a.vals[i], b.keys[i], b.vals[i])
		}
	}
}

// setKey stores v (non-zero) for stored key k in m, or, with v 0,
// removes k: what addRef and dropRef do around the endpoint sets.
func setKey(m *blockMap, k uint64, v uint32) {
	i, ok := m.find(k)
	switch {
	case ok && v == 0:
		m.deleteAt(i)
	case ok:
		m.vals[i] = v
	case v != 0:
		m.insertAt(i, k, v)
	}
}

// TestUnmix checks that unmix inverts mix (the loader stores mixed keys
// and gives the duplicate holds their block hash back).
func TestUnmix(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	for _, h := range append([]uint64{0, 1, 1 << 63, ^uint64(0), 0xdeadbeef}, rng.Uint64(), rng.Uint64(), rng.Uint64()) {
		if got := unmix(mix(h)); got != h {
			t.Fatalf("unmix(mix(%#x)) = %#x", h, got)
		}
	}
	if mul, inv := uint64(mixMul), uint64(mixInv); mul*inv != 1 {
		t.Fatal("mixInv is not mixMul's inverse modulo 2^64")
	}
}
