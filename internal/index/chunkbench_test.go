package index_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/bench"
	"github.com/kvindex/kvindex/bench/paired"
	"github.com/kvindex/kvindex/internal/index"
	"github.com/kvindex/kvindex/internal/index/indextest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// The two ways a reader can know what a chunk held before a put (issue
// 23, DESIGN "Reads (indexd)"), measured side by side:
//
//   - prev_kv (kept): the watch carries each event's previous value, and
//     the index keeps no chunk state;
//   - kept keys (measured, not kept): the reader keeps each chunk's key
//     hashes itself, as a width-8 chunk value per chunk in a map keyed by
//     (endpoint, tier, seq), and diffs a put against them. keptChunks is
//     that design, built on the index's public API exactly as it would
//     sit inside it: the same bytes per chunk, the same diff.

// keptChunks is the kept-keys design's chunk state.
type keptChunks struct {
	ks   keyspace.Keyspace
	ids  map[string]uint32 // endpoint chunk prefix → small ID
	held map[keptKey][]byte
}

type keptKey struct {
	id  uint32
	t   tier.Tier
	seq uint64
}

func newKeptChunks(ks keyspace.Keyspace) *keptChunks {
	return &keptChunks{ks: ks, ids: map[string]uint32{}, held: map[keptKey][]byte{}}
}

// apply applies a watched chunk event without its prev_kv, diffing
// against the kept keys, and keeps the new ones.
func (k *keptChunks) apply(ix *index.Index, key string, value []byte) error {
	prefix, t, seq, err := k.ks.SplitChunkKey(key)
	if err != nil {
		return err
	}
	id, ok := k.ids[prefix]
	if !ok {
		id = uint32(len(k.ids))
		k.ids[prefix] = id
	}
	kk := keptKey{id: id, t: t, seq: seq}
	prev := k.held[kk]
	if value == nil {
		_, err = ix.ApplyDelete(key, prev)
		delete(k.held, kk)
		return err
	}
	_, err = ix.ApplyPut(key, prev, value)
	cv, perr := keyspace.ParseChunkValue(value)
	if perr != nil {
		delete(k.held, kk)
		return err
	}
	keys := append(prev[:0], keyspace.ChunkWidthKey)
	if cap(keys) < keyspace.ChunkValueLen(cv.Len(), false) {
		keys = make([]byte, 1, keyspace.ChunkValueLen(cv.Len(), false))
		keys[0] = keyspace.ChunkWidthKey
	}
	for i := range cv.Len() {
		h := cv.Key(i)
		keys = append(keys, byte(h>>56), byte(h>>48), byte(h>>40), byte(h>>32), byte(h>>24), byte(h>>16), byte(h>>8), byte(h))
	}
	k.held[kk] = keys
	return err
}

// traceChunks returns n trace entries over 16 endpoints (as `kvindex
// bench lookup` builds them) as the chunk puts of a writer that stored
// them in that order: per endpoint, chunks of keyspace.DefaultChunkSize in
// insertion order, the last one partly full. tokenMode writes width-16
// entries. It also returns the entries' queries and keys for LookupCost.
func traceChunks(tb testing.TB, n int, tokenMode bool) (ops []indextest.ChunkOp, queries [][]uint64, keys func(func(uint64))) {
	tb.Helper()
	trace, err := bench.LoadTrace("")
	if err != nil {
		tb.Fatal(err)
	}
	src, err := bench.NewTraceEntries(trace, 16)
	if err != nil {
		tb.Fatal(err)
	}
	ks := keyspace.Default()
	byEp := map[keyspace.Endpoint][]keyspace.ChunkEntry{}
	var order []keyspace.Endpoint
	cov := src.Each(n, func(ep keyspace.Endpoint, h uint64) bool {
		if _, ok := byEp[ep]; !ok {
			order = append(order, ep)
		}
		byEp[ep] = append(byEp[ep], keyspace.ChunkEntry{Key: h, Engine: ^h})
		return true
	})
	for _, ep := range order {
		es := byEp[ep]
		for seq := 0; seq*keyspace.DefaultChunkSize < len(es); seq++ {
			part := es[seq*keyspace.DefaultChunkSize : min(len(es), (seq+1)*keyspace.DefaultChunkSize)]
			ops = append(ops, indextest.ChunkOp{Key: ks.ChunkKey(ep, tier.GPU, uint64(seq)), Value: keyspace.AppendChunkValue(nil, part, tokenMode)})
		}
	}
	keys = func(yield func(uint64)) {
		src.Each(n, func(_ keyspace.Endpoint, h uint64) bool { yield(h); return true })
	}
	return ops, src.Queries(cov), keys
}

// BenchmarkChunkMemory measures heap bytes per (block, endpoint, tier)
// (DESIGN goal 48; the goal for the reader with its chunk state
// included: 24) on the trace entries of `kvindex-bench lookup` (16
// endpoints, GPU), three ways in one run: "put" builds the index entry by
// entry with Index.Put (no chunk state: the layout v1's block keys built,
// today's figure); "prev_kv" applies the entries' chunk puts, as a list
// does, with no chunk state (the design kept); "kept_keys" applies them
// while keeping each chunk's key hashes (the alternative). The chunk
// values themselves are built before the measurement and are not counted
// (a list's response buffers are garbage once applied). Metric: B/entry.
func BenchmarkChunkMemory(b *testing.B) {
	for _, n := range []int{1_000_000, 5_000_000} {
		ops, _, _ := traceChunks(b, n, true)
		b.Run(sizeName(n), func(b *testing.B) {
			for _, design := range []string{"put", "prev_kv", "kept_keys"} {
				b.Run(design, func(b *testing.B) {
					var perEntry float64
					for b.Loop() {
						var ix *index.Index
						heap := bench.HeapBytes(func() any {
							ix = index.New(keyspace.Default())
							switch design {
							case "put":
								ks := keyspace.Default()
								for _, op := range ops {
									c, _ := ks.ParseChunkKey(op.Key)
									cv, _ := keyspace.ParseChunkValue(op.Value)
									for i := range cv.Len() {
										if err := ix.Put(c.Endpoint, c.Tier, cv.Key(i)); err != nil {
											b.Fatal(err)
										}
									}
								}
								return ix
							case "prev_kv":
								for _, op := range ops {
									if _, err := ix.ApplyPut(op.Key, nil, op.Value); err != nil {
										b.Fatal(err)
									}
								}
								return ix
							default:
								kept := newKeptChunks(keyspace.Default())
								for _, op := range ops {
									if err := kept.apply(ix, op.Key, op.Value); err != nil {
										b.Fatal(err)
									}
								}
								return []any{ix, kept}
							}
						})
						if got := ix.Stats().Entries; got != uint64(n) {
							b.Fatalf("index holds %d entries, want %d", got, n)
						}
						perEntry = float64(heap) / float64(n)
					}
					b.ReportMetric(perEntry, "B/entry")
				})
			}
		})
	}
}

func sizeName(n int) string {
	if n%1_000_000 == 0 {
		return string(rune('0'+n/1_000_000)) + "M"
	}
	return "n"
}

// chunkStream is a repeatable stream of chunk revisions over 16
// endpoints: LRU caches of 4,096 GPU blocks each, fed prompts of 16-48
// new blocks, evicting the oldest (fleetsim's order) or, with tailFirst,
// a finished request's blocks tail first, until every block is stored
// once and then evicted, so the index is empty again at the end. Each
// revision is one window of the writer (indextest.Chunker, chunks of 64,
// merge below 16): about 256 block ops.
type chunkStream struct {
	revs     [][]indextest.ChunkOp
	blockOps int
	// hashes lists the key hash of every block op, for the reference.
	hashes []uint64
	stored []bool
}

func newChunkStream(tailFirst bool) *chunkStream {
	ks := keyspace.Default()
	rng := rand.New(rand.NewPCG(23, 1))
	c := indextest.NewChunker(ks)
	s := &chunkStream{}
	const endpoints, capacity, total = 16, 4096, 200_000
	caches := make([][][]uint64, endpoints) // per endpoint, its requests' blocks, oldest first
	held := make([]int, endpoints)
	eps := make([]keyspace.Endpoint, endpoints)
	for i := range eps {
		eps[i] = keyspace.Endpoint{Model: "m", Pod: "vllm-" + string(rune('a'+i))}
	}
	var next uint64
	ops := 0
	evict := func(e int) {
		req := caches[e][0]
		if tailFirst {
			// A finished request frees its blocks tail first.
			slices.Reverse(req)
		}
		for _, h := range req {
			c.Remove(eps[e], tier.GPU, h)
			s.hashes, s.stored = append(s.hashes, h), append(s.stored, false)
			ops++
		}
		held[e] -= len(req)
		caches[e] = caches[e][1:]
	}
	flush := func() {
		s.revs = append(s.revs, c.Flush())
		s.blockOps += ops
		ops = 0
	}
	for produced := 0; produced < total; {
		e := rng.IntN(endpoints)
		req := make([]uint64, 16+rng.IntN(33))
		for i := range req {
			next++
			req[i] = next * 0x9e3779b97f4a7c15
			c.Store(eps[e], tier.GPU, req[i], req[i])
			s.hashes, s.stored = append(s.hashes, req[i]), append(s.stored, true)
		}
		ops += len(req)
		produced += len(req)
		caches[e] = append(caches[e], req)
		held[e] += len(req)
		for held[e] > capacity {
			evict(e)
		}
		if ops >= 256 {
			flush()
		}
	}
	for e := range caches {
		for len(caches[e]) > 0 {
			evict(e)
		}
	}
	flush()
	return s
}

// BenchmarkApplyChunks measures applying a chunk stream (newChunkStream)
// to the index, one revision per Write, both ways: "prev_kv" diffs each
// put against the event's previous value; "kept_keys" against the keys
// it keeps per chunk (and keeps the new ones). The reference, timed in
// the same loop (paired.Timer), is the stream's block ops applied to a
// plain map[uint64]uint32 (a set or delete per block op): the work with
// no chunk to read. "lru" is fleetsim's eviction order, "tail_first"
// vLLM's. Metrics: ns/blockop, map-ns/blockop, x-map.
func BenchmarkApplyChunks(b *testing.B) {
	for _, order := range []struct {
		name      string
		tailFirst bool
	}{{"lru", false}, {"tail_first", true}} {
		s := newChunkStream(order.tailFirst)
		for _, design := range []string{"prev_kv", "kept_keys"} {
			b.Run(order.name+"/"+design, func(b *testing.B) {
				ix := index.New(keyspace.Default())
				kept := newKeptChunks(keyspace.Default())
				ref := make(map[uint64]uint32)
				var tm paired.Timer
				for b.Loop() {
					tm.Step(s.blockOps, func() {
						for r, ops := range s.revs {
							ix.Write(int64(r+1), func() {
								for _, op := range ops {
									var err error
									switch {
									case design == "kept_keys":
										err = kept.apply(ix, op.Key, op.Value)
									case op.Value == nil:
										_, err = ix.ApplyDelete(op.Key, op.Prev)
									default:
										_, err = ix.ApplyPut(op.Key, op.Prev, op.Value)
									}
									if err != nil {
										b.Fatal(err)
									}
								}
							})
						}
					}, func() {
						for i, h := range s.hashes {
							if s.stored[i] {
								ref[h] = uint32(i)
							} else {
								delete(ref, h)
							}
						}
					})
					if st := ix.Stats(); st.Entries != 0 || st.Endpoints != 0 || len(ref) != 0 {
						b.Fatalf("after the stream the index holds %+v, the map %d", st, len(ref))
					}
				}
				b.ReportMetric(float64(len(s.revs)), "revisions")
				tm.Report(b, "blockop", "map")
			})
		}
	}
}

// BenchmarkTraceLookupChunks is bench's BenchmarkTraceLookup
// on an index built from the same entries' chunk puts (1M entries, 16
// endpoints, token-mode values): Lookup per hash against a bare map probe
// over the same keys (LookupCost). Metrics: ns/hash, map-ns/hash, x-map.
func BenchmarkTraceLookupChunks(b *testing.B) {
	const n = 1_000_000
	ops, queries, keys := traceChunks(b, n, true)
	ix := index.New(keyspace.Default())
	for _, op := range ops {
		if _, err := ix.ApplyPut(op.Key, nil, op.Value); err != nil {
			b.Fatal(err)
		}
	}
	ops = nil
	if got := ix.Stats().Entries; got != n {
		b.Fatalf("index holds %d entries, want %d", got, n)
	}
	c := bench.NewLookupCost(ix, bench.Model, queries, keys, 1)
	for i := 0; b.Loop(); i++ {
		if err := c.Step(i); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(c.LookupNs(), "ns/hash")
	b.ReportMetric(c.MapNs(), "map-ns/hash")
	b.ReportMetric(c.LookupNs()/c.MapNs(), "x-map")
}

// BenchmarkListChunks measures building an index from a list, as a cold
// start did before the Loader: 1M trace entries over 16 endpoints, the
// chunk puts of token-mode chunks of 64 applied with no previous value
// (ApplyPut), one by one. The reference, timed in the same loop
// (paired.Timer), inserts the same entries' key hashes into a Go
// map[uint64]uint32, the index's table before blockMap, with no chunk to
// parse and no endpoint set to keep. Metrics: ns/entry, map-ns/entry,
// x-map.
func BenchmarkListChunks(b *testing.B) {
	benchList(b, func(ix *index.Index, ops []indextest.ChunkOp) {
		for _, op := range ops {
			if _, err := ix.ApplyPut(op.Key, nil, op.Value); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkLoadChunks is BenchmarkListChunks with the list applied as a
// cold start now applies it, through a Loader (load.go): the same 1M
// entries' chunk puts queued, then Finish. Same reference and metrics.
func BenchmarkLoadChunks(b *testing.B) {
	benchList(b, func(ix *index.Index, ops []indextest.ChunkOp) {
		ld := ix.Loader()
		for _, op := range ops {
			if _, err := ld.ApplyPut(op.Key, op.Value); err != nil {
				b.Fatal(err)
			}
		}
		if err := ld.Finish(); err != nil {
			b.Fatal(err)
		}
	})
}

// benchList times build, which applies the 1M trace entries' chunk puts
// ops to a fresh index, against the bare map reference of
// BenchmarkListChunks.
func benchList(b *testing.B, build func(ix *index.Index, ops []indextest.ChunkOp)) {
	const n = 1_000_000
	ops, _, keys := traceChunks(b, n, true)
	hashes := make([]uint64, 0, n)
	keys(func(h uint64) { hashes = append(hashes, h) })
	var tm paired.Timer
	for b.Loop() {
		var ix *index.Index
		tm.Step(n, func() {
			ix = index.New(keyspace.Default())
			build(ix, ops)
		}, func() {
			m := make(map[uint64]uint32)
			for _, h := range hashes {
				m[h]++
			}
		})
		if got := ix.Stats().Entries; got != n {
			b.Fatalf("index holds %d entries, want %d", got, n)
		}
	}
	tm.Report(b, "entry", "map")
}
