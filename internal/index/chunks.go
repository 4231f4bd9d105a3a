package index

import (
	"fmt"
	"slices"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// Chunks (DESIGN "etcd keyspace (v2)", "Reads (indexd)"): the writer keeps
// an (endpoint, tier)'s blocks in chunk keys of up to the chunk size
// (default 24, at most 256) key hashes each, and every put carries a
// chunk's whole value. The index keeps no chunk
// state: it applies a put as the difference between the chunk's previous
// value (etcd's prev_kv, which the reflector asks the watch for) and its
// new one, and a delete as the removal of every key the previous value
// held. The measured reason (heap per entry against keeping each chunk's
// keys) is in DESIGN "Reads (indexd)" and BENCHMARKS.md.
//
// Holds are counted, not flagged: a key hash is present on (endpoint,
// tier) while any chunk of that (endpoint, tier) holds it. The first hold
// is the tier bit of the block's slot (set.go); every further one is a
// count in Index.dups, a map that is empty while the writer keeps its
// rule that a key is in at most one chunk. Counting makes the events of
// one revision commute, which is what the writer's merge needs: it moves
// a sparse chunk's keys to the open chunk and deletes the sparse one in
// one transaction, and whichever of the two events comes first, the
// moved keys never leave (a put first adds a second hold that the delete
// then takes back), so no Lookup, which sees whole revisions only, can
// find them absent or left behind. A writer that puts one key in two
// chunks (a bug) is survived the same way: the block stays until the
// last chunk holding it lets it go.
//
// A chunk counts as a multiset of its keys, both when it is added and
// when it is removed, so a value that lists a key twice is taken back
// exactly as it was given.

// dupKey names one (endpoint, tier, key hash).
type dupKey struct {
	hash uint64
	id   uint32
	t    tier.Tier
}

// putChunk applies a put of chunk key with value over prev.
func (ix *Index) putChunk(key string, prev, value []byte) error {
	prefix, t, _, err := ix.ks.SplitChunkKey(key)
	if err != nil {
		return err
	}
	next, verr := keyspace.ParseChunkValue(value)
	if verr != nil {
		verr = fmt.Errorf("%w: %s: %w", ErrMalformedValue, key, verr)
	}
	// A prev that does not parse was counted when it arrived, and counted
	// as a chunk holding nothing then, as now.
	old, _ := keyspace.ParseChunkValue(prev)
	id, ok := ix.byPrefix[prefix]
	if !ok {
		// An endpoint the index does not know holds nothing to remove.
		c, err := ix.ks.ParseChunkKey(key)
		if err != nil {
			return err
		}
		if next.Len() == 0 {
			return verr
		}
		if id, err = ix.intern(c.Endpoint, prefix); err != nil {
			return err
		}
	}
	err = ix.diffChunk(id, t, old, next)
	ix.maybeFree(id)
	if err != nil {
		return err
	}
	return verr
}

// deleteChunk applies a delete of chunk key whose value was prev.
func (ix *Index) deleteChunk(key string, prev []byte) error {
	prefix, t, _, err := ix.ks.SplitChunkKey(key)
	if err != nil {
		return err
	}
	id, ok := ix.byPrefix[prefix]
	if !ok {
		// An endpoint the index does not know holds nothing here; still
		// insist on a well-formed key so junk is counted.
		_, err := ix.ks.ParseChunkKey(key)
		return err
	}
	old, _ := keyspace.ParseChunkValue(prev)
	for i, n := 0, old.Len(); i < n; i++ {
		ix.dropRef(id, t, old.Key(i))
	}
	ix.maybeFree(id)
	return nil
}

// diffChunk moves endpoint id's holds in tier t from the keys of old to
// those of next: a put without a previous value adds every key, a chunk
// left empty removes every key, and otherwise the two sorted key lists
// are merged, removing what only old holds and adding what only next
// holds (as multisets). A chunk of the writer's default 64 keys costs two
// sorts of 64 words.
func (ix *Index) diffChunk(id uint32, t tier.Tier, old, next keyspace.ChunkView) error {
	if old.Len() == 0 {
		// A new chunk: touch its keys' slots first, so their cache
		// misses overlap.
		m := &ix.eps[id].tbl.blocks
		var sum uint32
		for i, n := 0, next.Len(); i < n; i++ {
			sum += m.touch(mix(next.Key(i)))
		}
		ix.touched += sum
		for i, n := 0, next.Len(); i < n; i++ {
			if _, err := ix.addRef(id, t, next.Key(i)); err != nil {
				return err
			}
		}
		return nil
	}
	if next.Len() == 0 {
		for i, n := 0, old.Len(); i < n; i++ {
			ix.dropRef(id, t, old.Key(i))
		}
		return nil
	}
	a, b := appendKeys(ix.keysA[:0], old), appendKeys(ix.keysB[:0], next)
	slices.Sort(a)
	slices.Sort(b)
	ix.keysA, ix.keysB = a, b
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || (i < len(a) && a[i] < b[j]):
			ix.dropRef(id, t, a[i])
			i++
		case i == len(a) || b[j] < a[i]:
			if _, err := ix.addRef(id, t, b[j]); err != nil {
				return err
			}
			j++
		default: // held before and after
			i++
			j++
		}
	}
	return nil
}

// appendKeys appends c's key hashes to dst.
func appendKeys(dst []uint64, c keyspace.ChunkView) []uint64 {
	for i, n := 0, c.Len(); i < n; i++ {
		dst = append(dst, c.Key(i))
	}
	return dst
}

// addRef adds one hold of hash on endpoint id in tier t and reports
// whether the (block, endpoint, tier) became present. It does not free
// the endpoint on error; the caller does (maybeFree).
func (ix *Index) addRef(id uint32, t tier.Tier, hash uint64) (bool, error) {
	e := &ix.eps[id]
	m := &e.tbl.blocks
	k := mix(hash)
	i, found := m.find(k)
	var v uint32
	if found {
		v = m.vals[i]
	}
	nv, added, err := ix.sets.add(v, id, tierBit(t))
	if err != nil {
		return false, err
	}
	switch {
	case !found:
		m.insertAt(i, k, nv)
	case nv != v:
		m.vals[i] = nv
	}
	if added {
		e.blocks[t-1]++
		ix.entries++
		return true, nil
	}
	if ix.dups == nil {
		ix.dups = make(map[dupKey]uint32)
	}
	ix.dups[dupKey{hash: hash, id: id, t: t}]++
	return false, nil
}

// dropRef takes back one hold of hash on endpoint id in tier t; the
// (block, endpoint, tier) goes with its last hold. Taking back a hold the
// index does not have is a no-op. It never frees the endpoint; the
// caller does (maybeFree).
func (ix *Index) dropRef(id uint32, t tier.Tier, hash uint64) {
	if len(ix.dups) > 0 {
		k := dupKey{hash: hash, id: id, t: t}
		if n, ok := ix.dups[k]; ok {
			if n == 1 {
				delete(ix.dups, k)
			} else {
				ix.dups[k] = n - 1
			}
			return
		}
	}
	e := &ix.eps[id]
	m := &e.tbl.blocks
	i, ok := m.find(mix(hash))
	if !ok {
		return
	}
	v := m.vals[i]
	nv, removed := ix.sets.remove(v, id, tierBit(t))
	if !removed {
		return
	}
	if nv == 0 {
		m.deleteAt(i)
	} else if nv != v {
		m.vals[i] = nv
	}
	e.blocks[t-1]--
	ix.entries--
}
