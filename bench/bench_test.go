package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/index"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/logging"
	"github.com/kvindex/kvindex/internal/tier"
)

// The Go benchmarks of the system-level figures. They share their
// measuring code with `kvindex-bench` (LookupCost, HeapBytes, GRPCLookup,
// IngestRun, ColdStartRun); here the workloads are the synthetic index
// shapes BENCHMARKS.md reports next to the trace-based ones.

// indexShape describes a synthetic index: prompts of promptLen blocks,
// each stored on holders distinct endpoints out of endpoints, a fraction
// cpuPct/100 of them also offloaded to the CPU tier, and optionally a
// shared system prefix of sysLen blocks (one of 8) that every endpoint
// holds.
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

// memoryShapes adds to benchShapes the size where an entry costs most in a
// sweep of sizes from 0.6M to 3.7M blocks: Go's map tables split when 7/8
// full, so the cost per entry is a sawtooth peaking just after a wave of
// splits (here about 2M one-holder blocks).
var memoryShapes = append(slices.Clone(benchShapes),
	indexShape{name: "one_holder_worst_fill", blocks: 2_000_000, promptLen: 256, endpoints: 64, holders: 1},
)

const shapeModel = "meta-llama/Llama-3.1-8B-Instruct"

// shapeFixture is a built shape: the index and its full-prompt queries.
type shapeFixture struct {
	ix      *index.Index
	prompts [][]uint64 // each a full query: system prefix (if any) + prompt blocks
}

// buildShape fills a fresh index with shape s (deterministic for a seed).
func buildShape(tb testing.TB, s indexShape, seed uint64) *shapeFixture {
	tb.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	f := &shapeFixture{ix: index.New(keyspace.Default())}
	eps := make([]keyspace.Endpoint, s.endpoints)
	for i := range eps {
		eps[i] = keyspace.Endpoint{Model: shapeModel, Pod: fmt.Sprintf("default/vllm-%d", i)}
	}
	put := func(ep keyspace.Endpoint, t tier.Tier, h uint64) {
		if err := f.ix.Put(ep, t, h); err != nil {
			tb.Fatal(err)
		}
	}
	var sys [8][]uint64
	if s.sysLen > 0 {
		for i := range sys {
			for range s.sysLen {
				h := rng.Uint64()
				sys[i] = append(sys[i], h)
				for _, ep := range eps {
					put(ep, tier.GPU, h)
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
				put(eps[e], tier.GPU, h)
				if rng.IntN(100) < s.cpuPct {
					put(eps[e], tier.CPU, h)
				}
			}
		}
		f.prompts = append(f.prompts, q)
	}
	return f
}

// keys yields every block hash of the fixture (all are in some prompt).
func (f *shapeFixture) keys(yield func(uint64)) {
	for _, q := range f.prompts {
		for _, h := range q {
			yield(h)
		}
	}
}

// BenchmarkLookup measures Index.Lookup per looked-up hash against the
// reference of DESIGN's goal (Lookup ≤ 2× a bare map probe per hash),
// timed in the same loop (LookupCost): ns/hash (Lookup), map-ns/hash (the
// reference), x-map (their ratio). Every query is a whole prompt that
// matches in full, so every hash is probed.
func BenchmarkLookup(b *testing.B) {
	for _, s := range benchShapes {
		b.Run(s.name, func(b *testing.B) {
			f := buildShape(b, s, 1)
			benchLookupCost(b, NewLookupCost(f.ix, shapeModel, f.prompts, f.keys, 2))
		})
	}
}

// BenchmarkTraceLookup is BenchmarkLookup on the trace workload of
// `kvindex-bench lookup`: 1M entries of the bundled trace over 16
// endpoints, each query a trace request.
func BenchmarkTraceLookup(b *testing.B) {
	const n = 1_000_000
	trace := loadTestTrace(b)
	src, err := NewTraceEntries(trace, 16)
	if err != nil {
		b.Fatal(err)
	}
	ix := index.New(keyspace.Default())
	cov := src.Each(n, func(ep keyspace.Endpoint, h uint64) bool { return ix.Put(ep, tier.GPU, h) == nil })
	if ix.Stats().Entries != n {
		b.Fatalf("index holds %d entries, want %d", ix.Stats().Entries, n)
	}
	keys := func(yield func(uint64)) {
		src.Each(n, func(_ keyspace.Endpoint, h uint64) bool { yield(h); return true })
	}
	benchLookupCost(b, NewLookupCost(ix, Model, src.Queries(cov), keys, 1))
}

func benchLookupCost(b *testing.B, c *LookupCost) {
	for i := 0; b.Loop(); i++ {
		if err := c.Step(i); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(c.LookupNs(), "ns/hash")
	b.ReportMetric(c.MapNs(), "map-ns/hash")
	b.ReportMetric(c.LookupNs()/c.MapNs(), "x-map")
}

// BenchmarkIndexMemory measures heap bytes per (block, endpoint, tier)
// entry (DESIGN goal ≤ 48): the live-heap delta of building each shape
// (HeapBytes), less the fixture's own query lists, divided by its entries
// (B/entry).
func BenchmarkIndexMemory(b *testing.B) {
	for _, s := range memoryShapes {
		b.Run(s.name, func(b *testing.B) {
			var perEntry float64
			for b.Loop() {
				var f *shapeFixture
				heap := HeapBytes(func() any {
					f = buildShape(b, s, 3)
					return f
				})
				var queryBytes int64
				for _, q := range f.prompts {
					queryBytes += int64(cap(q)) * 8
				}
				queryBytes += int64(cap(f.prompts)) * 24
				perEntry = float64(heap-queryBytes) / float64(f.ix.Stats().Entries)
			}
			b.ReportMetric(perEntry, "B/entry")
		})
	}
}

// BenchmarkGRPCLookup measures Lookup through the client library over
// loopback gRPC against a replica serving the one_holder shape, each call
// a whole 256-block prompt (GRPCCalls): one caller at a time, a call per
// iteration (p50-us, p99-us), then as many calls from 8 concurrent
// callers (par8-p50-us, par8-p99-us), each against the reference measured
// in the same run with as many calls, the gRPC health Check (health-...).
func BenchmarkGRPCLookup(b *testing.B) {
	ctx := context.Background()
	f := buildShape(b, benchShapes[0], 1)
	log := logging.Discard()
	node, err := startEtcd(ctx, log, etcdOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer node.close()
	replica, err := startIndexd(ctx, node, log)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := replica.stop(); err != nil {
			b.Error(err)
		}
	}()
	replica.srv.ServeIndex(f.ix)
	g, err := NewGRPCCalls(ctx, replica.srv.Addr().String(), shapeModel, f.prompts)
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	var lat []time.Duration
	for i := 0; b.Loop(); i++ {
		t0 := time.Now()
		if err := g.Lookup(ctx, i); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	n := max(len(lat), 1000)
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	report := func(prefix string, l Latencies) {
		b.ReportMetric(us(l.Percentile(0.5)), prefix+"p50-us")
		b.ReportMetric(us(l.Percentile(0.99)), prefix+"p99-us")
	}
	measure := func(par int, call func(context.Context, int) error) Latencies {
		l, err := MeasureCalls(ctx, par, n, 0, func(i int) error { return call(ctx, i) })
		if err != nil {
			b.Fatal(err)
		}
		return l
	}
	report("", sortedLatencies(lat, 0))
	report("health-", measure(1, g.Health))
	report("par8-", measure(8, g.Lookup))
	report("par8-health-", measure(8, g.Health))
}

// coldStartEnv lists the entry counts BenchmarkColdStart loads, comma
// separated (for example "1000000,5000000"). Unset, the benchmark skips:
// loading millions of keys into etcd takes minutes.
const coldStartEnv = "KVINDEX_BENCH_COLDSTART"

// BenchmarkColdStart measures indexd's time to ready on N entries of the
// trace in the v2 layout against one unpaged Get of the same keys in the
// same run, with the same fleet in the v1 layout beside it (ColdStartRun);
// each iteration is a round. Metrics are medians: ref-s (the v2 Get),
// indexd-s, x-get (goal ≤ 1.25), v1-get-s, v1-list-s (the v1 reader's
// list), x-v1-list (indexd against it) and indexd-B/entry.
func BenchmarkColdStart(b *testing.B) {
	spec := os.Getenv(coldStartEnv)
	if spec == "" {
		b.Skipf("set %s=1000000,5000000 to run", coldStartEnv)
	}
	trace := loadTestTrace(b)
	for _, s := range strings.Split(spec, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			b.Fatalf("%s: bad count %q", coldStartEnv, s)
		}
		b.Run(fmt.Sprintf("entries_%d", n), func(b *testing.B) {
			ctx := context.Background()
			run, err := PrepareColdStart(ctx, ColdStartConfig{Trace: trace, Entries: n})
			if err != nil {
				b.Fatal(err)
			}
			defer run.Close()
			b.Logf("loaded %d entries in %d chunks in %s, as v1 block keys in %s", n, run.Result.Chunks,
				run.Result.LoadV2.Round(time.Millisecond), run.Result.LoadV1.Round(time.Millisecond))
			for b.Loop() {
				if err := run.Round(ctx); err != nil {
					b.Fatal(err)
				}
			}
			r := run.Result
			ref, ready := medianDuration(r.Get).Seconds(), medianDuration(r.Ready).Seconds()
			v1Get, v1List := medianDuration(r.V1Get).Seconds(), medianDuration(r.V1List).Seconds()
			b.ReportMetric(ref, "ref-s")
			b.ReportMetric(ready, "indexd-s")
			b.ReportMetric(ready/ref, "x-get")
			b.ReportMetric(v1Get, "v1-get-s")
			b.ReportMetric(v1List, "v1-list-s")
			b.ReportMetric(ready/v1List, "x-v1-list")
			for _, f := range r.Figures() {
				if f.Name == "coldstart_heap_bytes_per_entry" {
					b.ReportMetric(f.Value, "indexd-B/entry")
				}
			}
			b.Logf("%d rounds: reference %v, indexd %v, v1 Get %v, v1 list %v", len(r.Ready), r.Get, r.Ready, r.V1Get, r.V1List)
		})
	}
}

// BenchmarkIngest measures block ops/s through Kafka → ingester → etcd
// against the same transactions written straight to etcd by as many
// concurrent writers, and the v1 layout's transactions written the same
// way (IngestRun), for the fleet stream of the first 4,000 trace requests
// on 16 endpoints and 4 partitions; each iteration is a round (the three,
// in rotating order). Metrics: ingest-block-ops/s (from Run's start),
// ingest-steady-block-ops/s (from the first transaction),
// raw-etcd-block-ops/s, ratio (goal ≥ 0.8), v1-raw-block-ops/s and
// x-v1-raw (the raw limit against v1's).
func BenchmarkIngest(b *testing.B) {
	ctx := context.Background()
	s, err := BuildStream(loadTestTrace(b), StreamConfig{Requests: 4000})
	if err != nil {
		b.Fatal(err)
	}
	run, err := PrepareIngest(ctx, IngestConfig{Stream: s})
	if err != nil {
		b.Fatal(err)
	}
	defer run.Close()
	for b.Loop() {
		if err := run.Round(ctx); err != nil {
			b.Fatal(err)
		}
	}
	r := run.Result
	b.ReportMetric(r.IngestRate(), "ingest-block-ops/s")
	b.ReportMetric(r.SteadyRate(), "ingest-steady-block-ops/s")
	b.ReportMetric(r.RawRate(), "raw-etcd-block-ops/s")
	b.ReportMetric(r.IngestRate()/r.RawRate(), "ratio")
	b.ReportMetric(r.V1RawRate(), "v1-raw-block-ops/s")
	b.ReportMetric(r.RawRate()/r.V1RawRate(), "x-v1-raw")
}
