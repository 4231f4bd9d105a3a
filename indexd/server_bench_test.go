package indexd

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
)

// BenchmarkGRPCLookup measures Lookup through the client library over
// loopback gRPC against a replica serving the one_holder shape (1M blocks,
// 64 endpoints), each query a whole 256-block prompt, and reports the
// latency percentiles p50-us, p99-us (one caller at a time) and, with
// 8 concurrent callers, par8-p50-us and par8-p99-us.
func BenchmarkGRPCLookup(b *testing.B) {
	f := buildIndex(b, benchShapes[0], 1)
	e := testutil.StartEtcd(b)
	cfg := DefaultConfig()
	cfg.Etcd, cfg.ListenAddr = e.Client, "127.0.0.1:0"
	srv, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	waitReady(b, srv)
	// Serve the synthetic index instead of the (empty) listed one; nothing
	// writes to etcd during the benchmark.
	srv.refl.cur.Store(f.ix)

	c, err := client.New(srv.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	order := rand.New(rand.NewPCG(5, 5)).Perm(len(f.prompts))
	call := func(i int) time.Duration {
		q := f.prompts[order[i%len(order)]]
		t0 := time.Now()
		res, err := c.Lookup(context.Background(), f.model, q)
		d := time.Since(t0)
		if err != nil || len(res.Matches) != 1 || res.Matches[0].Blocks != len(q) {
			b.Fatalf("lookup: %v %v", err, res)
		}
		return d
	}
	for i := range 200 { // warm the connection and the pools
		call(i)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		lat = append(lat, call(i))
	}
	b.StopTimer()
	p50, p99 := percentiles(lat)
	b.ReportMetric(p50, "p50-us")
	b.ReportMetric(p99, "p99-us")

	// The same calls from 8 goroutines at once.
	const par = 8
	n := max(len(lat), 1000)
	var mu sync.Mutex
	plat := make([]time.Duration, 0, n)
	var g errgroup.Group
	for w := range par {
		g.Go(func() error {
			local := make([]time.Duration, 0, n/par)
			for i := w; i < n; i += par {
				local = append(local, call(i))
			}
			mu.Lock()
			plat = append(plat, local...)
			mu.Unlock()
			return nil
		})
	}
	_ = g.Wait()
	p50, p99 = percentiles(plat)
	b.ReportMetric(p50, "par8-p50-us")
	b.ReportMetric(p99, "par8-p99-us")
}

// percentiles returns the p50 and p99 of lat in microseconds.
func percentiles(lat []time.Duration) (float64, float64) {
	if len(lat) == 0 {
		return 0, 0
	}
	slices.Sort(lat)
	at := func(p float64) float64 {
		return float64(lat[min(int(p*float64(len(lat))), len(lat)-1)].Nanoseconds()) / 1e3
	}
	return at(0.50), at(0.99)
}

// waitReady blocks until srv's health service says SERVING.
func waitReady(tb testing.TB, srv *Server) {
	tb.Helper()
	conn, err := grpc.NewClient(srv.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	stream, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: serviceName})
	if err != nil {
		tb.Fatal(err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			tb.Fatalf("waiting for SERVING: %v", err)
		}
		if resp.Status == healthpb.HealthCheckResponse_SERVING {
			return
		}
	}
}

// coldStartEnv lists the entry counts BenchmarkColdStart loads, comma
// separated (for example "1000000,5000000"). Unset, the benchmark skips:
// loading millions of keys into etcd takes minutes.
const coldStartEnv = "KVINDEX_BENCH_COLDSTART"

// BenchmarkColdStart measures indexd's time to ready (New + Run until gRPC
// health says SERVING) on N block keys, against the DESIGN reference
// measured in the same run: one unpaged Get of the same blocks/ prefix
// from the same etcd. Rounds alternate reference and indexd; the metrics
// are medians: ref-s, indexd-s, x-get (their ratio, goal ≤ 1.25) and
// indexd-B/entry (the replica's live heap after ready, over N); for
// comparison also a keys-only unpaged Get (ref-keys-only-s,
// x-keys-only-get), since indexd's lists read keys only.
//
// Keys are written as the ingester writes them (empty values, one model,
// 100 endpoints, GPU tier) but without leases, which a list does not read.
func BenchmarkColdStart(b *testing.B) {
	spec := os.Getenv(coldStartEnv)
	if spec == "" {
		b.Skipf("set %s=1000000,5000000 to run", coldStartEnv)
	}
	for _, s := range strings.Split(spec, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			b.Fatalf("%s: bad count %q", coldStartEnv, s)
		}
		b.Run(fmt.Sprintf("entries_%d", n), func(b *testing.B) { coldStart(b, n) })
	}
}

func coldStart(b *testing.B, n int) {
	e := testutil.StartEtcd(b)
	ks := keyspace.Default()
	const endpoints = 100
	loadStart := time.Now()
	loadEtcd(b, e.Client, ks, n, endpoints)
	b.Logf("loaded %d keys in %s", n, time.Since(loadStart).Round(time.Millisecond))

	var refs, keysOnly, cold, heaps []float64
	rounds := 0
	for b.Loop() {
		rounds++
		refs = append(refs, referenceGet(b, e.Endpoints, ks, n))
		keysOnly = append(keysOnly, referenceGet(b, e.Endpoints, ks, n, clientv3.WithKeysOnly()))
		d, heap := indexdColdStart(b, e.Endpoints, n)
		cold = append(cold, d)
		heaps = append(heaps, heap)
	}
	ref, idx := median(refs), median(cold)
	b.ReportMetric(ref, "ref-s")
	b.ReportMetric(median(keysOnly), "ref-keys-only-s")
	b.ReportMetric(idx, "indexd-s")
	b.ReportMetric(idx/ref, "x-get")
	b.ReportMetric(idx/median(keysOnly), "x-keys-only-get")
	b.ReportMetric(median(heaps), "indexd-B/entry")
	b.Logf("%d rounds: reference %v, keys-only reference %v, indexd %v", rounds, refs, keysOnly, cold)
}

// loadEtcd writes n block keys over endpoints endpoints, their records and
// an offset, in transactions of 1024 puts from 4 writers.
func loadEtcd(b *testing.B, cli *clientv3.Client, ks keyspace.Keyspace, n, endpoints int) {
	ctx := context.Background()
	const model = "meta-llama/Llama-3.1-8B-Instruct"
	eps := make([]keyspace.Endpoint, endpoints)
	var recOps []clientv3.Op
	for i := range eps {
		eps[i] = keyspace.Endpoint{Model: model, Pod: fmt.Sprintf("default/vllm-%d", i)}
		rec, _ := (&keyspace.EndpointRecord{HashMode: keyspace.HashModeEngine, BlockSize: 16, LastRecord: time.Now().UTC()}).Marshal()
		recOps = append(recOps, clientv3.OpPut(ks.EndpointKey(eps[i]), string(rec)))
	}
	recOps = append(recOps, clientv3.OpPut(ks.OffsetKey(keyspace.Partition{Topic: "kvindex-events"}), "1"))
	if _, err := cli.Txn(ctx).Then(recOps...).Commit(); err != nil {
		b.Fatal(err)
	}
	const txnOps, writers = 1024, 4
	var g errgroup.Group
	for w := range writers {
		g.Go(func() error {
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			ops := make([]clientv3.Op, 0, txnOps)
			for i := w; i < n; i += writers {
				ops = append(ops, clientv3.OpPut(ks.BlockKey(eps[i%endpoints], tier.GPU, rng.Uint64()), ""))
				if len(ops) == txnOps || i+writers >= n {
					if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
						return err
					}
					ops = ops[:0]
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
}

// referenceGet times one unpaged Get of the blocks/ prefix on a fresh
// client, with opts, and checks it returns n keys.
func referenceGet(b *testing.B, endpoints []string, ks keyspace.Keyspace, n int, opts ...clientv3.OpOption) float64 {
	cli, err := testutil.NewEtcdClient(endpoints)
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Get(context.Background(), "warm-up"); err != nil {
		b.Fatal(err)
	}
	runtime.GC()
	start := time.Now()
	resp, err := cli.Get(context.Background(), ks.BlocksPrefix(), append(opts, clientv3.WithPrefix())...)
	d := time.Since(start)
	if err != nil || len(resp.Kvs) != n {
		b.Fatalf("reference Get: %v, %d keys of %d", err, len(resp.Kvs), n)
	}
	return d.Seconds()
}

// indexdColdStart times a fresh replica from New to SERVING and returns
// that and its live heap per entry once ready.
func indexdColdStart(b *testing.B, endpoints []string, n int) (float64, float64) {
	cli, err := testutil.NewEtcdClient(endpoints)
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Get(context.Background(), "warm-up"); err != nil {
		b.Fatal(err)
	}
	before := liveHeap()
	cfg := DefaultConfig()
	cfg.Etcd, cfg.ListenAddr = cli, "127.0.0.1:0"
	start := time.Now()
	srv, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	waitReady(b, srv)
	d := time.Since(start)
	if st := srv.refl.current().Stats(); st.Entries != uint64(n) {
		b.Fatalf("indexd holds %d entries, want %d", st.Entries, n)
	}
	heap := float64(liveHeap()-before) / float64(n)
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	return d.Seconds(), heap
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
