package index

import (
	"cmp"
	"fmt"
	"math/bits"
	"runtime"
	"slices"
	"sync"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// Loader builds a fresh index from a list: the puts of one revision's
// keyspace, each with no previous value, as a cold start or a re-list
// reads them (DESIGN "Reads (indexd)"). Its ApplyPut returns what the
// index's ApplyPut returns for the same put, and after Finish the index is
// the one those ApplyPuts would have built, in any order of the puts,
// faster.
//
// Why (BENCHMARKS.md "Cold start"): applied one by one, a chunk's entries
// land at random slots of a model's table, a cache miss per new block,
// and the table grows many times on the way. The Loader queues each
// chunk's entries instead (a sequential append, while the list's later
// ranges are still being read), and Finish builds each model's table in
// key order (loadQueue), every step but the last spread over the cores:
// measured at 1M entries, 0.36-0.37× a bare Go map insert per entry,
// where the same build on one goroutine but for the sort took
// 0.56-0.58× and put by put 1.09-1.12×.
//
// A Loader holds the index's write side until Finish: the index must not
// be read, written or published meanwhile. Put it only on an index no
// reader can reach (the reflector's fresh index) or inside Write. Every
// kind other than chunks/ is applied at once; none of them reads or frees
// what the queue holds, because a list has no deletes. Not safe for
// concurrent use.
type Loader struct {
	ix *Index
	// queues holds the queued entries per model table, in the order the
	// tables got their first entry (Finish's order).
	queues []*loadQueue
	byTbl  map[*table]*loadQueue
}

// loadQueue is one model table's queued entries, in blocks of
// loadBlockEntries (appending never copies what is queued).
type loadQueue struct {
	tbl    *table
	blocks [][]loadItem
	n      int
	// lo and hi bound the refs queued: a run counts its holds per ref
	// in [lo, hi] only, so a list of many small models does not cost
	// each table the whole index's endpoints.
	lo, hi uint32
}

// loadItem is one queued entry: a block hash and the endpoint and tier
// holding it, packed (loadRef).
type loadItem struct {
	k   uint64 // mix(block hash)
	ref uint32
}

func (q *loadQueue) push(it loadItem) {
	if n := len(q.blocks); n == 0 || len(q.blocks[n-1]) == cap(q.blocks[n-1]) {
		q.blocks = append(q.blocks, make([]loadItem, 0, loadBlockEntries))
	}
	last := &q.blocks[len(q.blocks)-1]
	*last = append(*last, it)
	q.n++
}

const (
	// loadBucketEntries is the entries Finish aims to put in one bucket:
	// few enough for sortLoadItems to sort them by insertion.
	loadBucketEntries = 16
	// loadMaxBucketBits bounds the buckets of one table (2^18 counters,
	// 2 MiB).
	loadMaxBucketBits = 18
	// loadTierBits holds tier-1 in a queued ref, the endpoint ID above it.
	loadTierBits = 2
	// loadBlockEntries is the entries of one block of a queue (1 MiB).
	loadBlockEntries = 1 << 16
)

// A queued ref packs the endpoint ID above tier-1; the IDs the index
// hands out (maxEndpointID) leave room for it.
var _ = [1]struct{}{}[(maxEndpointID<<loadTierBits)>>loadTierBits-maxEndpointID]
var _ = [1]struct{}{}[max(tier.Count-1, 0)>>loadTierBits]

func loadRef(id uint32, t tier.Tier) uint32 { return id<<loadTierBits | uint32(t-1) }

func loadID(r uint32) uint32      { return r >> loadTierBits }
func loadTier(r uint32) tier.Tier { return tier.Tier(r&(1<<loadTierBits-1)) + 1 }

// Loader returns a Loader that builds ix from a list. See Loader for what
// ix may be.
func (ix *Index) Loader() *Loader {
	return &Loader{ix: ix, byTbl: make(map[*table]*loadQueue)}
}

// ApplyPut applies a put of key with value and no previous value, with
// Index.ApplyPut's contract and errors, except that a chunk's entries are
// queued until Finish; an endpoints/ record, an offset or any other key
// takes effect at once.
func (l *Loader) ApplyPut(key string, value []byte) (keyspace.Kind, error) {
	ix := l.ix
	kind := ix.ks.KindOf(key)
	if kind != keyspace.KindChunk {
		return ix.ApplyPut(key, nil, value)
	}
	prefix, t, _, err := ix.ks.SplitChunkKey(key)
	if err != nil {
		return kind, err
	}
	next, verr := keyspace.ParseChunkValue(value)
	if verr != nil {
		// As putChunk: a value that does not parse holds nothing.
		return kind, fmt.Errorf("%w: %s: %w", ErrMalformedValue, key, verr)
	}
	id, ok := ix.byPrefix[prefix]
	if !ok {
		c, err := ix.ks.ParseChunkKey(key)
		if err != nil {
			return kind, err
		}
		if id, err = ix.intern(c.Endpoint, prefix); err != nil {
			return kind, err
		}
	}
	tbl := ix.eps[id].tbl
	q := l.byTbl[tbl]
	if q == nil {
		q = &loadQueue{tbl: tbl}
		l.byTbl[tbl] = q
		l.queues = append(l.queues, q)
	}
	ref := loadRef(id, t)
	if q.n == 0 || ref < q.lo {
		q.lo = ref
	}
	if q.n == 0 || ref > q.hi {
		q.hi = ref
	}
	for i, n := 0, next.Len(); i < n; i++ {
		q.push(loadItem{k: mix(next.Key(i)), ref: ref})
	}
	return kind, nil
}

// Finish applies every queued entry and empties the queue; the Loader can
// go on after it. It returns nil, or an error wrapping ErrFull that says
// how many entries the index had no room for (each skipped; the rest are
// applied), which the caller counts as one skipped key.
func (l *Loader) Finish() error {
	ix := l.ix
	var skipped int
	var first error
	for _, q := range l.queues {
		n, err := ix.loadQueue(q)
		skipped += n
		if first == nil {
			first = err
		}
	}
	if skipped > 0 {
		// An endpoint whose every entry was skipped, with no record, goes
		// as putChunk would have let it go. No other endpoint is without
		// both: each change of the index frees those it leaves so.
		for id := range ix.eps {
			if ix.eps[id].used {
				ix.maybeFree(uint32(id))
			}
		}
	}
	clear(l.byTbl)
	l.queues = l.queues[:0]
	if first != nil {
		return fmt.Errorf("%d queued chunk entries skipped: %w", skipped, first)
	}
	return nil
}

// loadQueue inserts q's entries into their table. A table that holds no
// block yet (every table of a cold start) is built in order, on up to
// loadWorkers goroutines, each owning a contiguous run of keys:
//
//  1. bucketed cuts the queue into buckets by key (each goroutine counts
//     and scatters its share of the queue);
//  2. sortBuckets sorts each run's buckets and counts its distinct keys
//     and the set-arena words its multi-holder blocks need;
//  3. the table is sized once for the distinct keys (load 3/4) and the
//     arena grown once for the sets, each run given its own part of it;
//  4. each run appends its keys in order into its own part of the table
//     (fillRun), each key's holders gathered into one slot value, and
//     keeps aside the few that a cluster pushes past the part's end;
//  5. settleSpills places those, shifting the next part's first cluster.
//
// No step searches, shifts a cluster or grows a set one member at a time.
// A table with blocks takes the entries one by one (loadEach), and so do
// the entries of a table whose sets the arena has no room for, so its
// limit is kept entry by entry and each skip counted. It returns the
// entries it skipped and the first error.
func (ix *Index) loadQueue(q *loadQueue) (int, error) {
	if q.n == 0 {
		return 0, nil
	}
	m := &q.tbl.blocks
	workers := loadWorkers(q.n)
	lo, hi := q.lo, q.hi
	items, starts := q.bucketed(workers)
	if m.n > 0 {
		return ix.loadEach(m, items)
	}
	runs := sortBuckets(items, starts, workers)
	var distinct, words int
	for _, r := range runs {
		distinct += r.distinct
		words += r.words
	}
	a := &ix.sets
	if len(a.words)+words > int(maxSetOffset) {
		return ix.loadEach(m, items)
	}
	m.resize(max(blockMapMinHomes, distinct*4/3+1))
	arena := len(a.words)
	a.words = append(a.words, make([]uint32, words)...)
	a.live += words
	nb := len(starts) - 1
	shift := loadShift(nb)
	for i := range runs {
		r := &runs[i]
		r.arena = arena
		arena += r.words
		r.limit = len(m.keys)
		if r.to < nb {
			// The next run's smallest possible key's home: every key
			// of r is smaller, so homes below it (bits.Mul64 keeps
			// order), and the next run writes from it on.
			r.limit = m.home(uint64(r.to) << shift)
		}
	}
	parallel(len(runs), func(w int) { ix.fillRun(m, items, starts, lo, hi, &runs[w]) })
	m.settleSpills(runs)
	for i := range runs {
		r := &runs[i]
		m.n += r.placed
		ix.entries += r.entries
		for j, n := range r.held {
			if n > 0 {
				ref := lo + uint32(j)
				ix.eps[loadID(ref)].blocks[loadTier(ref)-1] += n
			}
		}
		for k, n := range r.dups {
			if ix.dups == nil {
				ix.dups = make(map[dupKey]uint32)
			}
			ix.dups[k] += n
		}
	}
	return 0, nil
}

// loadRun is one goroutine's share of a table's build: buckets [from, to)
// of the bucketed queue, what sortBuckets counted in them, and what
// fillRun did with them.
type loadRun struct {
	from, to int
	// distinct is the distinct keys of the run; words the arena words
	// their sets take (1+classCap of each set's class).
	distinct, words int
	// arena is the first word of the run's part of the set arena; limit
	// the first slot of the table past the run's part.
	arena, limit int
	// placed is the keys fillRun stored, entries the (block, endpoint,
	// tier) among them; held counts those per queued ref (endpoint and
	// tier), held[ref-lo] for the queue's lo, and dups the duplicate holds, as hold would.
	placed  int
	entries uint64
	held    []uint64
	dups    map[dupKey]uint32
	// spill holds the run's last keys, in order, whose slots fell at or
	// past limit: settleSpills places them.
	spill []loadSlot
}

// loadSlot is a key and its slot value, waiting for a slot.
type loadSlot struct {
	k uint64
	v uint32
}

// fillRun appends run r's keys, in order, to m (sized and empty) from the
// first home slot of the run's part, each at its home slot or after the
// previous key, whichever is later, and each key's holders gathered into
// its slot value: an inline value for one endpoint, else a set written
// into the run's part of the arena. A key whose slot would be at or past
// r.limit goes to r.spill instead. Runs write disjoint slots and arena
// words, so they run at once.
func (ix *Index) fillRun(m *blockMap, items []loadItem, starts []int, lo, hi uint32, r *loadRun) {
	words := ix.sets.words
	off := uint32(r.arena)
	r.held = make([]uint64, hi-lo+1)
	var members []uint32
	next := 0
	end := starts[r.to]
	for i := starts[r.from]; i < end; {
		k := items[i].k
		var v uint32
		if i+1 == end || items[i+1].k != k {
			// One holder: the common case, decided without a loop.
			ref := items[i].ref
			v = inlineValue(loadID(ref), tierBit(loadTier(ref)))
			r.held[ref-lo]++
			r.entries++
			i++
		} else {
			members = members[:0]
			last := ^uint32(0)
			for ; i < end && items[i].k == k; i++ {
				ref := items[i].ref
				id, t := loadID(ref), loadTier(ref)
				if ref == last {
					if r.dups == nil {
						r.dups = make(map[dupKey]uint32)
					}
					r.dups[dupKey{hash: unmix(k), id: id, t: t}]++
					continue
				}
				last = ref
				r.held[ref-lo]++
				r.entries++
				if n := len(members); n > 0 && valueID(members[n-1]) == id {
					members[n-1] |= tierBit(t)
				} else {
					members = append(members, inlineValue(id, tierBit(t)))
				}
			}
			if len(members) == 1 {
				v = members[0]
			} else {
				c := classFor(len(members))
				words[off] = c<<classShift | uint32(len(members))
				copy(words[off+1:], members)
				v = multiBit | off
				off += 1 + uint32(classCap(c))
			}
		}
		pos := max(next, m.home(k))
		if pos >= r.limit {
			r.spill = append(r.spill, loadSlot{k: k, v: v})
		} else {
			m.keys[pos], m.vals[pos] = k, v
		}
		next = pos + 1
		r.placed++
	}
}

// settleSpills places the keys fillRun kept aside, in key order: from the
// first slot past a run's part it walks the slots, putting the oldest
// waiting key in each and taking the slot's own key, if any, into the
// wait, until none waits. Crossing into a later run's part adds that
// run's spill behind what waits. So each key moves only later, the keys
// stay sorted, and a cluster stays unbroken from each key's home to its
// slot: blockMap's layout, as if one goroutine had appended them all.
func (m *blockMap) settleSpills(runs []loadRun) {
	var wait []loadSlot
	head := 0
	i := 0
	next := 0 // the first run whose spill is not yet waiting
	for {
		if head == len(wait) {
			wait, head = wait[:0], 0
			for next < len(runs) && len(runs[next].spill) == 0 {
				next++
			}
			if next == len(runs) {
				return
			}
			i = runs[next].limit
			wait = append(wait, runs[next].spill...)
			next++
			continue
		}
		if next < len(runs) && i >= runs[next].limit {
			wait = append(wait, runs[next].spill...)
			next++
			continue
		}
		if i >= len(m.keys) {
			m.growTail()
		}
		if m.vals[i] != 0 {
			wait = append(wait, loadSlot{k: m.keys[i], v: m.vals[i]})
		}
		m.keys[i], m.vals[i] = wait[head].k, wait[head].v
		head++
		i++
	}
}

// loadEach adds items one by one (addRef) to m, grown first for all of
// them: for a table that already holds blocks, or entries the arena has
// no room to build sets for at once.
func (ix *Index) loadEach(m *blockMap, items []loadItem) (int, error) {
	if need := (m.n + len(items)) * 8 / 7; m.homes() < need {
		m.resize(need)
	}
	var skipped int
	var first error
	for _, it := range items {
		if _, err := ix.addRef(loadID(it.ref), loadTier(it.ref), unmix(it.k)); err != nil {
			skipped++
			if first == nil {
				first = err
			}
		}
	}
	return skipped, first
}

// loadParallelMin is the fewest entries of one table that Finish spreads
// over more than one goroutine.
const loadParallelMin = 1 << 16

// loadWorkers is the goroutines Finish builds a table of n queued entries
// on: GOMAXPROCS from loadParallelMin entries, else one. A variable so
// that tests can force several runs on small tables.
var loadWorkers = func(n int) int {
	if n < loadParallelMin {
		return 1
	}
	return runtime.GOMAXPROCS(0)
}

// parallel calls f(0) ... f(n-1) at once, f(0) on this goroutine, and
// returns when all have returned.
func parallel(n int, f func(w int)) {
	var wg sync.WaitGroup
	for w := 1; w < n; w++ {
		wg.Go(func() { f(w) })
	}
	f(0)
	wg.Wait()
}

// loadShift is the shift that takes a stored key to its bucket among nb
// (a power of two): the key's top log2(nb) bits. With one bucket it is 64,
// and every key is in bucket 0 (x >> 64 == 0 in Go).
func loadShift(nb int) uint { return uint(64 - bits.TrailingZeros(uint(nb))) }

// bucketed moves q's entries into one slice, cut into buckets of about
// loadBucketEntries by the high bits of their stored keys (bucket j is
// items[starts[j]:starts[j+1]]), and empties q. Up to workers goroutines
// each count and then scatter a share of q's blocks; within a bucket the
// entries keep no particular order.
func (q *loadQueue) bucketed(workers int) (items []loadItem, starts []int) {
	b := min(bits.Len(uint(q.n/loadBucketEntries)), loadMaxBucketBits)
	nb := 1 << b
	shift := loadShift(nb)
	workers = max(1, min(workers, len(q.blocks)))
	share := func(w int) [][]loadItem {
		return q.blocks[len(q.blocks)*w/workers : len(q.blocks)*(w+1)/workers]
	}
	// at[w][j] counts worker w's entries of bucket j, then becomes where
	// its next one goes.
	at := make([][]int, workers)
	parallel(workers, func(w int) {
		c := make([]int, nb)
		for _, blk := range share(w) {
			for _, it := range blk {
				c[it.k>>shift]++
			}
		}
		at[w] = c
	})
	starts = make([]int, nb+1)
	pos := 0
	for j := range nb {
		starts[j] = pos
		for w := range workers {
			c := at[w][j]
			at[w][j] = pos
			pos += c
		}
	}
	starts[nb] = pos
	items = make([]loadItem, q.n)
	parallel(workers, func(w int) {
		c := at[w]
		for _, blk := range share(w) {
			for _, it := range blk {
				j := it.k >> shift
				items[c[j]] = it
				c[j]++
			}
		}
	})
	q.blocks, q.n = nil, 0
	return items, starts
}

// sortBuckets sorts each bucket of items (see bucketed) by stored key,
// then endpoint and tier, on up to workers goroutines, each owning a
// contiguous run of buckets, and returns the runs with their distinct
// keys and the arena words their sets need counted.
func sortBuckets(items []loadItem, starts []int, workers int) []loadRun {
	nb := len(starts) - 1
	workers = max(1, min(workers, nb))
	runs := make([]loadRun, workers)
	parallel(workers, func(w int) {
		r := &runs[w]
		r.from, r.to = nb*w/workers, nb*(w+1)/workers
		for j := r.from; j < r.to; j++ {
			bucket := items[starts[j]:starts[j+1]]
			sortLoadItems(bucket)
			for i := 0; i < len(bucket); {
				k := bucket[i].k
				holders := 0
				var last uint32
				for ; i < len(bucket) && bucket[i].k == k; i++ {
					if id := loadID(bucket[i].ref); holders == 0 || id != last {
						holders++
						last = id
					}
				}
				r.distinct++
				if holders > 1 {
					r.words += 1 + classCap(classFor(holders))
				}
			}
		}
	})
	return runs
}

// loadInsertionMax is the longest bucket sortLoadItems sorts by insertion.
const loadInsertionMax = 48

// sortLoadItems sorts a bucket by (k, ref): by insertion when short (the
// buckets average loadBucketEntries), which costs a few compares per item
// where a general sort's calls cost several times that (measured), else
// with slices.SortFunc.
func sortLoadItems(s []loadItem) {
	if len(s) > loadInsertionMax {
		slices.SortFunc(s, compareLoadItems)
		return
	}
	for i := 1; i < len(s); i++ {
		it := s[i]
		j := i
		for ; j > 0 && (s[j-1].k > it.k || s[j-1].k == it.k && s[j-1].ref > it.ref); j-- {
			s[j] = s[j-1]
		}
		s[j] = it
	}
}

func compareLoadItems(a, b loadItem) int {
	if c := cmp.Compare(a.k, b.k); c != 0 {
		return c
	}
	return cmp.Compare(a.ref, b.ref)
}
