package bench

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/internal/index"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/logging"
	"github.com/kvindex/kvindex/internal/sim/fleetsim"
	"github.com/kvindex/kvindex/internal/tier"
)

// LookupCost measures Index.Lookup per looked-up hash against DESIGN's
// reference (Lookup ≤ 2× a bare map probe per hash): a loop probing a
// plain map[uint64]uint32 holding the same keys, over the same queries.
// Each Step times one Lookup and then the reference loop, so both see the
// same machine load; the reference probes the query half a rotation away
// (not the one just looked up, whose keys are now in cache), and over a
// whole rotation both sides cover every query once. Queries are visited
// in a shuffled order so neither side gets a warm cache from the previous
// query.
type LookupCost struct {
	ix      *index.Index
	model   string
	queries [][]uint64
	ref     map[uint64]uint32
	order   []int
	sc      index.Scratch
	sink    uint32

	// LookupTime and MapTime sum the timed Lookups and reference loops;
	// Hashes counts the hashes each side probed; Steps the steps taken.
	LookupTime, MapTime time.Duration
	Hashes, Steps       int
}

// NewLookupCost prepares the comparison: keys calls its argument with
// every block hash of the index (the reference map holds exactly those).
// Every query must be held in full by some endpoint of ix (so Lookup walks
// all of it); Step checks that.
func NewLookupCost(ix *index.Index, model string, queries [][]uint64, keys func(yield func(uint64)), seed uint64) *LookupCost {
	ref := make(map[uint64]uint32, ix.Stats().Blocks)
	keys(func(h uint64) { ref[h]++ })
	return &LookupCost{ix: ix, model: model, queries: queries, ref: ref,
		order: rand.New(rand.NewPCG(seed, seed)).Perm(len(queries))}
}

// Step times the Lookup of query i (in the shuffled order, wrapping) and
// the reference loop over query i + len/2. It fails when the Lookup does
// not match the whole query on its first endpoint.
func (c *LookupCost) Step(i int) error {
	n := len(c.order)
	q := c.queries[c.order[i%n]]
	t0 := time.Now()
	c.ix.Lookup(&c.sc, c.model, q, nil)
	t1 := time.Now()
	for _, h := range c.queries[c.order[(i+n/2)%n]] {
		c.sink += c.ref[h]
	}
	t2 := time.Now()
	c.LookupTime += t1.Sub(t0)
	c.MapTime += t2.Sub(t1)
	c.Hashes += len(q)
	c.Steps++
	if len(c.sc.Matches) == 0 || c.sc.Matches[0].Blocks != len(q) {
		got := 0
		if len(c.sc.Matches) > 0 {
			got = c.sc.Matches[0].Blocks
		}
		return fmt.Errorf("bench: lookup of a %d-block query matched %d endpoints, the first %d blocks", len(q), len(c.sc.Matches), got)
	}
	return nil
}

// Rotation is the number of steps that visit every query once.
func (c *LookupCost) Rotation() int { return len(c.order) }

// LookupNs is Lookup's nanoseconds per hash so far.
func (c *LookupCost) LookupNs() float64 {
	return float64(c.LookupTime.Nanoseconds()) / float64(c.Hashes)
}

// MapNs is the reference's nanoseconds per hash so far.
func (c *LookupCost) MapNs() float64 { return float64(c.MapTime.Nanoseconds()) / float64(c.Hashes) }

// Sink keeps the reference loop's loads from being optimised away.
func (c *LookupCost) Sink() uint32 { return c.sink }

// HeapBytes returns the live heap that build leaves behind: the heap after
// it (two GCs before each reading) minus the heap before, with what build
// returns kept alive across the second reading.
func HeapBytes(build func() any) int64 {
	before := LiveHeap()
	keep := build()
	after := LiveHeap()
	runtime.KeepAlive(keep)
	return int64(after) - int64(before)
}

// LiveHeap is the live heap after two garbage collections.
func LiveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// Latencies are the per-call latencies of a run of calls.
type Latencies struct {
	Sorted  []time.Duration
	Elapsed time.Duration
}

// Percentile returns the latency at p (0..1).
func (l Latencies) Percentile(p float64) time.Duration {
	if len(l.Sorted) == 0 {
		return 0
	}
	return l.Sorted[min(int(p*float64(len(l.Sorted))), len(l.Sorted)-1)]
}

// Max is the largest latency.
func (l Latencies) Max() time.Duration {
	if len(l.Sorted) == 0 {
		return 0
	}
	return l.Sorted[len(l.Sorted)-1]
}

// PerSecond is the calls completed per second.
func (l Latencies) PerSecond() float64 { return float64(len(l.Sorted)) / l.Elapsed.Seconds() }

// MeasureCalls runs call from concurrency goroutines at once, each call
// numbered, until n calls have completed or d has passed (whichever is
// first; n or d zero means no such bound, not both), and returns every
// call's latency. It stops at the first error.
func MeasureCalls(ctx context.Context, concurrency, n int, d time.Duration, call func(i int) error) (Latencies, error) {
	if n <= 0 && d <= 0 {
		return Latencies{}, fmt.Errorf("bench: MeasureCalls needs a count or a duration")
	}
	var (
		mu    sync.Mutex
		lat   []time.Duration
		next  int
		first error
	)
	began := time.Now()
	deadline := began.Add(d)
	var wg sync.WaitGroup
	for range max(concurrency, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]time.Duration, 0, 1024)
			defer func() {
				mu.Lock()
				lat = append(lat, local...)
				mu.Unlock()
			}()
			for {
				mu.Lock()
				i := next
				stop := first != nil || ctx.Err() != nil || (n > 0 && i >= n) || (d > 0 && time.Now().After(deadline))
				next++
				mu.Unlock()
				if stop {
					return
				}
				t0 := time.Now()
				err := call(i)
				local = append(local, time.Since(t0))
				if err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(began)
	if first == nil {
		first = ctx.Err()
	}
	slices.Sort(lat)
	return Latencies{Sorted: lat, Elapsed: elapsed}, first
}

// GRPCCalls are the calls of the gRPC measurement against a replica
// (addr) serving the queries' index: Lookup of query i (in a shuffled
// order) through the client library, checked to match in full, and the
// reference, a gRPC health Check on the same replica: the cost of a gRPC
// round trip that does no work.
type GRPCCalls struct {
	c       *client.Client
	conn    *grpc.ClientConn
	hc      healthpb.HealthClient
	model   string
	queries [][]uint64
	order   []int
}

// NewGRPCCalls dials addr twice (the client library, and a plain
// connection for the health Checks) and warms both with 200 calls each.
func NewGRPCCalls(ctx context.Context, addr, model string, queries [][]uint64) (*GRPCCalls, error) {
	c, err := client.New(addr, client.WithTimeout(30*time.Second))
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		c.Close()
		return nil, err
	}
	g := &GRPCCalls{c: c, conn: conn, hc: healthpb.NewHealthClient(conn), model: model, queries: queries,
		order: rand.New(rand.NewPCG(5, 5)).Perm(len(queries))}
	for i := range 200 { // warm both connections and the server's pools
		if err := g.Lookup(ctx, i); err != nil {
			g.Close()
			return nil, err
		}
		if err := g.Health(ctx, i); err != nil {
			g.Close()
			return nil, err
		}
	}
	return g, nil
}

// Lookup looks up query i and checks it matched in full.
func (g *GRPCCalls) Lookup(ctx context.Context, i int) error {
	q := g.queries[g.order[i%len(g.order)]]
	res, err := g.c.Lookup(ctx, g.model, q)
	if err != nil {
		return err
	}
	if len(res.Matches) == 0 || res.Matches[0].Blocks != len(q) {
		return fmt.Errorf("bench: gRPC lookup of a %d-block query matched %d endpoints", len(q), len(res.Matches))
	}
	return nil
}

// Health is the reference call.
func (g *GRPCCalls) Health(ctx context.Context, _ int) error {
	_, err := g.hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "kvindex.v1.IndexService"})
	return err
}

// Close closes both connections.
func (g *GRPCCalls) Close() {
	g.c.Close()
	g.conn.Close()
}

// GRPCLookup measures the health Check reference, then Lookup, each with
// concurrency callers for n calls or d, whichever ends first
// (MeasureCalls).
func GRPCLookup(ctx context.Context, addr, model string, queries [][]uint64, concurrency, n int, d time.Duration) (lookup, health Latencies, err error) {
	g, err := NewGRPCCalls(ctx, addr, model, queries)
	if err != nil {
		return lookup, health, err
	}
	defer g.Close()
	if health, err = MeasureCalls(ctx, concurrency, n, d, func(i int) error { return g.Health(ctx, i) }); err != nil {
		return lookup, health, err
	}
	lookup, err = MeasureCalls(ctx, concurrency, n, d, func(i int) error { return g.Lookup(ctx, i) })
	return lookup, health, err
}

// LookupConfig configures RunLookup.
type LookupConfig struct {
	// Trace is the request trace the index entries and queries come from.
	// Required.
	Trace []fleetsim.Request
	// Entries are the index sizes to measure, in (block, endpoint, tier)
	// entries. Default 1M, 5M and 10M.
	Entries []int
	// Endpoints is how many endpoints hold the entries. Default 16.
	Endpoints int
	// MinTime is the least time the in-process comparison runs per size
	// (it always looks up every trace request at least once). Default 2 s.
	MinTime time.Duration
	// Concurrency is the number of concurrent gRPC callers. Default 8.
	Concurrency int
	// GRPCTime is how long each gRPC measurement (Lookup, then the
	// reference) runs per size. Default 3 s.
	GRPCTime time.Duration
	// Logger receives the components' logs. Default: discard.
	Logger *slog.Logger
}

// LookupResult is one size's measurement.
type LookupResult struct {
	Entries uint64
	Blocks  int
	// Queries is the number of trace requests looked up (each once or
	// more: Steps in all).
	Queries, Steps int
	// LookupNs and MapNs are nanoseconds per hash: Lookup and the bare
	// map probe.
	LookupNs, MapNs float64
	// HeapPerEntry is the index's live heap per entry.
	HeapPerEntry float64
	// GRPC and Health are the loopback gRPC Lookup and the health Check
	// reference at Concurrency.
	GRPC, Health Latencies
	Concurrency  int
}

// Figures returns the size's figures: Lookup ns/hash against the bare map
// (goal ratio ≤ 2), heap bytes per entry (goal ≤ 48), and gRPC Lookup
// latency and throughput against a health Check.
func (r *LookupResult) Figures() []Figure {
	labels := map[string]string{"entries": fmt.Sprint(r.Entries)}
	glabels := map[string]string{"entries": fmt.Sprint(r.Entries), "concurrency": fmt.Sprint(r.Concurrency)}
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	return []Figure{
		{Name: "lookup_ns_per_hash", Labels: labels, Value: r.LookupNs, Unit: "ns/hash", Reference: r.MapNs, HasReference: true,
			RefName: "bare map probe", Goal: &Goal{Target: 2, AtMost: true, OnRatio: true}},
		{Name: "index_bytes_per_entry", Labels: labels, Value: r.HeapPerEntry, Unit: "B/entry", Goal: &Goal{Target: 48, AtMost: true}},
		{Name: "grpc_lookup_p50", Labels: glabels, Value: us(r.GRPC.Percentile(0.5)), Unit: "us", Reference: us(r.Health.Percentile(0.5)),
			HasReference: true, RefName: "gRPC health Check"},
		{Name: "grpc_lookup_p99", Labels: glabels, Value: us(r.GRPC.Percentile(0.99)), Unit: "us", Reference: us(r.Health.Percentile(0.99)),
			HasReference: true, RefName: "gRPC health Check"},
		{Name: "grpc_lookup_throughput", Labels: glabels, Value: r.GRPC.PerSecond(), Unit: "calls/s", Reference: r.Health.PerSecond(),
			HasReference: true, RefName: "gRPC health Check"},
	}
}

func (c *LookupConfig) defaults() error {
	if len(c.Trace) == 0 {
		return fmt.Errorf("bench: lookup needs a trace")
	}
	if len(c.Entries) == 0 {
		c.Entries = []int{1_000_000, 5_000_000, 10_000_000}
	}
	for _, n := range c.Entries {
		if n <= 0 {
			return fmt.Errorf("bench: entries %d: want a positive count", n)
		}
	}
	if c.Endpoints <= 0 {
		c.Endpoints = 16
	}
	if c.MinTime <= 0 {
		c.MinTime = 2 * time.Second
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 8
	}
	if c.GRPCTime <= 0 {
		c.GRPCTime = 3 * time.Second
	}
	if c.Logger == nil {
		c.Logger = logging.Discard()
	}
	return nil
}

// RunLookup measures, for each size: an index of that many entries of
// the trace (TraceEntries), its heap per entry, Lookup of every trace
// request against the bare map probe (LookupCost), and gRPC Lookup over
// loopback from a replica serving that index (GRPCLookup). One indexd on
// an empty embedded etcd serves each index in turn (indexd.ServeIndex).
func RunLookup(ctx context.Context, cfg LookupConfig) (_ []*LookupResult, err error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	src, err := NewTraceEntries(cfg.Trace, cfg.Endpoints)
	if err != nil {
		return nil, err
	}
	node, err := startEtcd(ctx, cfg.Logger, etcdOptions{})
	if err != nil {
		return nil, err
	}
	defer node.close()
	replica, err := startIndexd(ctx, node, cfg.Logger)
	if err != nil {
		return nil, err
	}
	defer func() {
		if serr := replica.stop(); serr != nil && err == nil {
			err = serr
		}
	}()
	ks := keyspace.Default()
	var out []*LookupResult
	for _, n := range cfg.Entries {
		replica.srv.ServeIndex(index.New(ks)) // let the previous size go
		var ix *index.Index
		var cov Coverage
		var buildErr error
		heap := HeapBytes(func() any {
			ix = index.New(ks)
			cov = src.Each(n, func(ep keyspace.Endpoint, h uint64) bool {
				buildErr = ix.Put(ep, tier.GPU, h)
				return buildErr == nil
			})
			return ix
		})
		if buildErr != nil {
			return nil, buildErr
		}
		st := ix.Stats()
		res := &LookupResult{Entries: st.Entries, Blocks: st.Blocks, HeapPerEntry: float64(heap) / float64(st.Entries), Concurrency: cfg.Concurrency}
		queries := src.Queries(cov)
		res.Queries = len(queries)
		cost := NewLookupCost(ix, Model, queries, func(yield func(uint64)) {
			src.Each(n, func(_ keyspace.Endpoint, h uint64) bool { yield(h); return true })
		}, 1)
		began := time.Now()
		for i := 0; i < cost.Rotation() || time.Since(began) < cfg.MinTime; i++ {
			if err := cost.Step(i); err != nil {
				return nil, err
			}
		}
		res.LookupNs, res.MapNs, res.Steps = cost.LookupNs(), cost.MapNs(), cost.Steps
		cost = nil
		replica.srv.ServeIndex(ix)
		res.GRPC, res.Health, err = GRPCLookup(ctx, replica.srv.Addr().String(), Model, queries, cfg.Concurrency, 0, cfg.GRPCTime)
		if err != nil {
			return nil, err
		}
		out = append(out, res)
	}
	return out, nil
}
