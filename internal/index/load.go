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
// key order (loadQueue): measured at 1M entries, 0.51-0.56× a bare Go
// map insert per entry where put by put takes 1.09-1.12× in the same
// run, and a cold start ready in 101-124 ms where it was 134-215 ms,
// alternating the two in one session.
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
// block yet (every table of a cold start) is built in order: the queue is
// cut into buckets by key, the buckets are sorted on up to GOMAXPROCS
// goroutines (each bucket is one goroutine's), the table is sized for the
// distinct keys found (load 3/4), and one pass appends the keys in order,
// each key's holders gathered into its slot value: no search, no shift,
// one sequential walk of the table. A table with blocks takes the entries
// one by one, bucket by bucket. It returns the entries it skipped and the
// first error.
func (ix *Index) loadQueue(q *loadQueue) (int, error) {
	if q.n == 0 {
		return 0, nil
	}
	m := &q.tbl.blocks
	items, starts := q.bucketed()
	if m.n > 0 {
		return ix.loadEach(m, items)
	}
	distinct := sortBuckets(items, starts)
	m.resize(max(blockMapMinHomes, distinct*4/3+1))
	var skipped int
	var first error
	next := 0
	for i := 0; i < len(items); {
		k := items[i].k
		var v uint32
		h := unmix(k)
		for ; i < len(items) && items[i].k == k; i++ {
			nv, _, err := ix.hold(v, loadID(items[i].ref), loadTier(items[i].ref), h)
			if err != nil {
				skipped++
				if first == nil {
					first = err
				}
				continue
			}
			v = nv
		}
		if v != 0 {
			next = m.appendSorted(next, k, v)
		}
	}
	return skipped, first
}

// loadEach adds items one by one (addRef) to m, a table that already
// holds blocks, grown first for all of them.
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

// bucketed moves q's entries into one slice, cut into buckets of about
// loadBucketEntries by the high bits of their stored keys (bucket j is
// items[starts[j]:starts[j+1]]), and empties q.
func (q *loadQueue) bucketed() (items []loadItem, starts []int) {
	b := min(bits.Len(uint(q.n/loadBucketEntries)), loadMaxBucketBits)
	shift := uint(64 - b) // b == 0: every key in bucket 0 (x >> 64 == 0)
	starts = make([]int, 1<<b+1)
	for _, blk := range q.blocks {
		for _, it := range blk {
			starts[it.k>>shift+1]++
		}
	}
	for i := 1; i < len(starts); i++ {
		starts[i] += starts[i-1]
	}
	at := slices.Clone(starts[:len(starts)-1])
	items = make([]loadItem, q.n)
	for _, blk := range q.blocks {
		for _, it := range blk {
			j := it.k >> shift
			items[at[j]] = it
			at[j]++
		}
	}
	q.blocks, q.n = nil, 0
	return items, starts
}

// loadParallelMin is the fewest entries sortBuckets spreads over more
// than one goroutine.
const loadParallelMin = 1 << 16

// sortBuckets sorts each bucket of items (see bucketed) by stored key,
// then endpoint and tier, and returns the number of distinct keys. It
// runs on up to GOMAXPROCS goroutines, each owning a contiguous run of
// buckets, and returns once all are done.
func sortBuckets(items []loadItem, starts []int) int {
	workers := 1
	if len(items) >= loadParallelMin {
		workers = min(runtime.GOMAXPROCS(0), len(starts)-1)
	}
	counts := make([]int, workers)
	var wg sync.WaitGroup
	nb := len(starts) - 1
	for w := range workers {
		from, to := nb*w/workers, nb*(w+1)/workers
		wg.Go(func() {
			n := 0
			for j := from; j < to; j++ {
				bucket := items[starts[j]:starts[j+1]]
				sortLoadItems(bucket)
				for i := range bucket {
					if i == 0 || bucket[i].k != bucket[i-1].k {
						n++
					}
				}
			}
			counts[w] = n
		})
	}
	wg.Wait()
	var n int
	for _, c := range counts {
		n += c
	}
	return n
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
