package indexd

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/index"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// indexShape describes a synthetic index: prompts of promptLen blocks,
// each stored on holders distinct endpoints out of endpoints, a fraction
// cpuPct/100 of them also offloaded to the CPU tier, and optionally a
// shared system prefix of sysLen blocks (one of 8) that every endpoint holds.
type indexShape struct {
	name      string
	blocks    int // distinct block hashes in prompts (excluding the system prefixes)
	promptLen int
	endpoints int
	holders   int
	cpuPct    int
	sysLen    int
}

var benchShapes = []indexShape{
	{name: "one_holder", blocks: 1 << 20, promptLen: 256, endpoints: 64, holders: 1},
	{name: "four_holders_offload", blocks: 1 << 18, promptLen: 256, endpoints: 64, holders: 4, cpuPct: 50},
	{name: "system_prefix_64", blocks: 1 << 20, promptLen: 256, endpoints: 64, holders: 1, sysLen: 16},
}

type indexFixture struct {
	ix      *index.Index
	model   string
	prompts [][]uint64 // each a full query: system prefix (if any) + prompt blocks
	entries uint64
}

// buildIndex fills a fresh index with shape s (deterministic for a seed).
func buildIndex(tb testing.TB, s indexShape, seed uint64) *indexFixture {
	tb.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	ks := keyspace.Default()
	ix := index.New(ks)
	f := &indexFixture{ix: ix, model: "meta-llama/Llama-3.1-8B-Instruct"}
	ids := make([]keyspace.Endpoint, s.endpoints)
	for i := range ids {
		ids[i] = keyspace.Endpoint{Model: f.model, Pod: fmt.Sprintf("default/vllm-%d", i)}
	}
	put := func(id keyspace.Endpoint, t tier.Tier, h uint64) {
		if err := ix.Put(id, t, h); err != nil {
			tb.Fatal(err)
		}
	}
	var sys [8][]uint64
	if s.sysLen > 0 {
		for i := range sys {
			for range s.sysLen {
				h := rng.Uint64()
				sys[i] = append(sys[i], h)
				for _, id := range ids {
					put(id, tier.GPU, h)
				}
			}
		}
	}
	for p := 0; p < s.blocks/s.promptLen; p++ {
		q := make([]uint64, 0, s.sysLen+s.promptLen)
		if s.sysLen > 0 {
			q = append(q, sys[p%len(sys)]...)
		}
		holders := rng.Perm(s.endpoints)[:s.holders]
		for range s.promptLen {
			h := rng.Uint64()
			q = append(q, h)
			for _, e := range holders {
				put(ids[e], tier.GPU, h)
				if rng.IntN(100) < s.cpuPct {
					put(ids[e], tier.CPU, h)
				}
			}
		}
		f.prompts = append(f.prompts, q)
	}
	f.entries = ix.Stats().Entries
	return f
}

// BenchmarkLookup measures index.Lookup per looked-up hash against the
// reference of DESIGN's goal (Lookup ≤ 2× a bare map probe per hash): a
// loop probing a plain map[uint64]uint32 that holds the same keys, for the
// same queries, timed in the same run. Metrics: ns/hash (Lookup), map-ns/hash
// (reference) and x-map (their ratio).
func BenchmarkLookup(b *testing.B) {
	for _, s := range benchShapes {
		b.Run(s.name, func(b *testing.B) {
			f := buildIndex(b, s, 1)
			ref := make(map[uint64]uint32, f.ix.Stats().Blocks)
			for _, q := range f.prompts {
				for _, h := range q {
					ref[h]++
				}
			}
			// Visit prompts in a shuffled order so neither side gets a
			// warm cache from the previous query.
			order := rand.New(rand.NewPCG(2, 2)).Perm(len(f.prompts))
			var sc index.Scratch
			var sink uint32
			var lookupTime, mapTime time.Duration
			hashes := 0
			// Each iteration times one Lookup and then the reference probe
			// loop, so both see the same machine load. The reference probes
			// the query half the rotation away (not the one just looked
			// up, whose keys are now in cache); over the run both sides
			// cover the same queries.
			for i := 0; b.Loop(); i++ {
				q := f.prompts[order[i%len(order)]]
				t0 := time.Now()
				f.ix.Lookup(&sc, f.model, q, nil)
				t1 := time.Now()
				for _, h := range f.prompts[order[(i+len(order)/2)%len(order)]] {
					sink += ref[h]
				}
				t2 := time.Now()
				lookupTime += t1.Sub(t0)
				mapTime += t2.Sub(t1)
				if len(sc.Matches) == 0 || sc.Matches[0].Blocks != len(q) {
					b.Fatalf("lookup matched %d endpoints, first %d of %d blocks", len(sc.Matches), sc.Matches[0].Blocks, len(q))
				}
				hashes += len(q)
			}
			if sink == 1 {
				b.Log("unlikely") // keeps the probes from being optimised away
			}
			lookupNs := float64(lookupTime.Nanoseconds()) / float64(hashes)
			mapNs := float64(mapTime.Nanoseconds()) / float64(hashes)
			b.ReportMetric(lookupNs, "ns/hash")
			b.ReportMetric(mapNs, "map-ns/hash")
			b.ReportMetric(lookupNs/mapNs, "x-map")
		})
	}
}

// memoryShapes adds to benchShapes the size where an entry costs most in a
// sweep of sizes from 0.6M to 3.7M blocks: Go's map tables split when 7/8
// full, so the cost per entry is a sawtooth peaking just after a wave of
// splits (here about 2M one-holder blocks).
var memoryShapes = append(slices.Clone(benchShapes),
	indexShape{name: "one_holder_worst_fill", blocks: 2_000_000, promptLen: 256, endpoints: 64, holders: 1},
)

// BenchmarkIndexMemory measures heap bytes per (block, endpoint, tier)
// entry (DESIGN goal ≤ 48): the live-heap delta after building each shape,
// less the fixture's own query lists, divided by its entries (B/entry).
func BenchmarkIndexMemory(b *testing.B) {
	for _, s := range memoryShapes {
		b.Run(s.name, func(b *testing.B) {
			var perEntry float64
			for b.Loop() {
				perEntry = indexBytesPerEntry(b, s)
			}
			b.ReportMetric(perEntry, "B/entry")
		})
	}
}

// indexBytesPerEntry builds shape s and returns the index's live heap
// bytes per entry: heap after building, minus heap before, minus the
// fixture's query lists (which a real index does not hold).
func indexBytesPerEntry(tb testing.TB, s indexShape) float64 {
	before := liveHeap()
	f := buildIndex(tb, s, 3)
	after := liveHeap()
	var queryBytes uint64
	for _, q := range f.prompts {
		queryBytes += uint64(cap(q)) * 8
	}
	queryBytes += uint64(cap(f.prompts)) * 24
	runtime.KeepAlive(f)
	return float64(after-before-queryBytes) / float64(f.entries)
}

func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
