package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"runtime"
	"slices"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/ingester"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/logging"
	"github.com/kvindex/kvindex/internal/sim/fleetsim"
	"github.com/kvindex/kvindex/internal/tier"
)

// ErrReaderNotV2 reports that the indexd linked into this binary did not
// read the v2 keyspace the cold start loaded: it was ready holding no
// entry of it (an indexd that still reads v1 block keys).
var ErrReaderNotV2 = errors.New("bench: indexd read no entry of the v2 keyspace")

// ColdStartConfig configures RunColdStart.
type ColdStartConfig struct {
	// Trace is the request trace the entries come from (TraceEntries).
	// Required.
	Trace []fleetsim.Request
	// Entries is how many (block, endpoint, tier) entries etcd holds.
	// Default 5M.
	Entries int
	// Endpoints is how many endpoints (with endpoint records) hold them.
	// Default 16.
	Endpoints int
	// HashMode is the endpoints' hash mode: in token mode (the default,
	// as the ingester's) each v2 chunk entry carries an engine hash (16
	// bytes an entry) and each v1 block value one (16 hex digits); in
	// engine-hash mode entries are 8 bytes and v1 values empty.
	HashMode keyspace.HashMode
	// ChunkSize is the entries per v2 chunk. Default
	// keyspace.DefaultChunkSize.
	ChunkSize int
	// Rounds is how many times the reference Gets, the v1 list and a
	// fresh indexd run; figures are medians. Default 3.
	Rounds int
	// QuotaBytes is each embedded etcd's --quota-backend-bytes. Default
	// 8 GiB (etcd's own default, 2 GiB, is too small for 5M v1 keys with
	// their history).
	QuotaBytes int64
	// Logger receives the components' logs. Default: discard.
	Logger *slog.Logger
}

func (c *ColdStartConfig) defaults() error {
	if len(c.Trace) == 0 {
		return fmt.Errorf("bench: cold start needs a trace")
	}
	if c.HashMode == "" {
		c.HashMode = ingester.DefaultConfig().HashMode
	}
	if _, err := keyspace.ParseHashMode(string(c.HashMode)); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if c.Entries <= 0 {
		c.Entries = 5_000_000
	}
	if c.Endpoints <= 0 {
		c.Endpoints = 16
	}
	if c.ChunkSize <= 0 {
		c.ChunkSize = keyspace.DefaultChunkSize
	}
	if c.ChunkSize > keyspace.MaxChunkEntries {
		return fmt.Errorf("bench: chunk size %d: at most %d", c.ChunkSize, keyspace.MaxChunkEntries)
	}
	if c.Rounds <= 0 {
		c.Rounds = 3
	}
	if c.QuotaBytes <= 0 {
		c.QuotaBytes = 8 << 30
	}
	if c.Logger == nil {
		c.Logger = logging.Discard()
	}
	return nil
}

// ColdStartResult is what RunColdStart measured; the slices hold one value
// per round.
type ColdStartResult struct {
	Entries, Endpoints int
	HashMode           keyspace.HashMode
	// Chunks is the v2 keys the entries took; LoadV2 and LoadV1 the time
	// each layout took to load.
	Chunks         int
	LoadV2, LoadV1 time.Duration
	// Get is the v2 reference: one unpaged Get of the chunks/ prefix;
	// Ready a fresh indexd from New to gRPC health SERVING on the v2
	// keyspace; HeapPerEntry that replica's live heap growth over the
	// entries.
	Get, Ready   []time.Duration
	HeapPerEntry []float64
	// V1Get is one unpaged Get of the v1 layout's blocks/ prefix; V1List
	// the v1 reader's list of it (listV1).
	V1Get, V1List []time.Duration
	// GetBytes and V1GetBytes are the protobuf sizes of the two Gets'
	// responses.
	GetBytes, V1GetBytes int
}

func medianDuration(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// Figures returns the cold-start figures: indexd's time to ready on the
// v2 keyspace against one unpaged Get of it (goal ratio ≤ 1.25) and
// against the v1 reader's list of the same fleet in the v1 layout; the v1
// list against one unpaged Get of the v1 layout; the two Gets' times and
// sizes; the replica's heap per entry after ready.
func (r *ColdStartResult) Figures() []Figure {
	labels := map[string]string{"entries": fmt.Sprint(r.Entries), "rounds": fmt.Sprint(len(r.Ready)), "hash_mode": string(r.HashMode)}
	ready := medianDuration(r.Ready).Seconds()
	get, v1Get, v1List := medianDuration(r.Get).Seconds(), medianDuration(r.V1Get).Seconds(), medianDuration(r.V1List).Seconds()
	heaps := slices.Clone(r.HeapPerEntry)
	slices.Sort(heaps)
	return []Figure{
		{Name: "coldstart_ready_seconds", Labels: labels, Value: ready, Unit: "s", Reference: get,
			HasReference: true, RefName: "one unpaged Get (v2)", Goal: &Goal{Target: 1.25, AtMost: true, OnRatio: true}},
		{Name: "coldstart_ready_vs_v1_list_seconds", Labels: labels, Value: ready, Unit: "s", Reference: v1List,
			HasReference: true, RefName: "the v1 reader's list of the v1 layout"},
		{Name: "coldstart_v1_list_seconds", Labels: labels, Value: v1List, Unit: "s", Reference: v1Get,
			HasReference: true, RefName: "one unpaged Get (v1)"},
		{Name: "coldstart_get_seconds_vs_v1", Labels: labels, Value: get, Unit: "s", Reference: v1Get,
			HasReference: true, RefName: "one unpaged Get (v1)"},
		{Name: "coldstart_get_bytes_vs_v1", Labels: labels, Value: float64(r.GetBytes), Unit: "B", Reference: float64(r.V1GetBytes),
			HasReference: true, RefName: "one unpaged Get (v1)"},
		{Name: "coldstart_heap_bytes_per_entry", Labels: labels, Value: heaps[len(heaps)/2], Unit: "B/entry"},
	}
}

// RunColdStart measures DESIGN's cold-start goal: the time for a fresh
// indexd to be ready against an etcd holding Entries entries in the v2
// layout, against the reference measured in the same run, one unpaged Get
// of the same keys; and beside it the same fleet in the v1 layout. It is
// PrepareColdStart, cfg.Rounds rounds, and Close.
func RunColdStart(ctx context.Context, cfg ColdStartConfig) (*ColdStartResult, error) {
	run, err := PrepareColdStart(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer run.Close()
	for range run.cfg.Rounds {
		if err := run.Round(ctx); err != nil {
			return nil, err
		}
	}
	return run.Result, nil
}

// ColdStartRun is a prepared cold-start measurement: two embedded etcds
// loaded with the same entries, one in each layout.
type ColdStartRun struct {
	cfg    ColdStartConfig
	v2, v1 *etcdNode
	// Result holds the rounds run so far.
	Result *ColdStartResult
}

// PrepareColdStart loads two fresh embedded etcds with cfg.Entries
// entries of TraceEntries (GPU tier), each with the endpoints' records
// and an offset (no leases, which a list does not read), in transactions
// of 1,024 puts from 4 writers: one in the v2 layout, as the ingester
// writes it (each endpoint's entries in insertion order in chunks of
// ChunkSize, keyspace.AppendChunkValue), the other in the v1 layout (a key
// per entry, v1layout.go).
func PrepareColdStart(ctx context.Context, cfg ColdStartConfig) (_ *ColdStartRun, err error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	src, err := NewTraceEntries(cfg.Trace, cfg.Endpoints)
	if err != nil {
		return nil, err
	}
	run := &ColdStartRun{cfg: cfg, Result: &ColdStartResult{Entries: cfg.Entries, Endpoints: cfg.Endpoints, HashMode: cfg.HashMode}}
	defer func() {
		if err != nil {
			run.Close()
		}
	}()
	ks := keyspace.Default()
	for _, layout := range []struct {
		node *(*etcdNode)
		took *time.Duration
		load func(*clientv3.Client) error
	}{
		{&run.v2, &run.Result.LoadV2, func(cli *clientv3.Client) error {
			n, err := loadV2Entries(ctx, cli, ks, src, cfg)
			run.Result.Chunks = n
			return err
		}},
		{&run.v1, &run.Result.LoadV1, func(cli *clientv3.Client) error { return loadV1Entries(ctx, cli, ks, src, cfg.Entries, cfg.HashMode) }},
	} {
		if *layout.node, err = startEtcd(ctx, cfg.Logger, etcdOptions{quota: cfg.QuotaBytes}); err != nil {
			return nil, err
		}
		cli := (*layout.node).cli
		began := time.Now()
		if err := loadRecords(ctx, cli, ks, src, cfg.HashMode); err != nil {
			return nil, err
		}
		if err := layout.load(cli); err != nil {
			return nil, err
		}
		*layout.took = time.Since(began)
	}
	return run, nil
}

// Close stops both etcds and deletes their data.
func (r *ColdStartRun) Close() {
	for _, n := range []*etcdNode{r.v2, r.v1} {
		if n != nil {
			n.close()
		}
	}
}

// Round takes, each on a fresh client: the v1 layout's unpaged Get and
// the v1 reader's list of it, the v2 layout's unpaged Get, and a fresh
// replica's cold start on the v2 layout; it appends them to Result.
func (r *ColdStartRun) Round(ctx context.Context) error {
	ks := keyspace.Default()
	res := r.Result
	d, size, err := timeGet(ctx, r.v1, v1BlocksPrefix(ks), r.cfg.Entries)
	if err != nil {
		return err
	}
	res.V1Get, res.V1GetBytes = append(res.V1Get, d), size
	if d, err = timeV1List(ctx, r.v1, ks, r.cfg.Entries); err != nil {
		return err
	}
	res.V1List = append(res.V1List, d)
	if d, size, err = timeGet(ctx, r.v2, ks.ChunksPrefix(), res.Chunks); err != nil {
		return err
	}
	res.Get, res.GetBytes = append(res.Get, d), size
	d, heap, err := timeReady(ctx, r.v2, r.cfg.Entries, r.cfg.Logger)
	if err != nil {
		return err
	}
	res.Ready = append(res.Ready, d)
	res.HeapPerEntry = append(res.HeapPerEntry, heap)
	return nil
}

// loadRecords writes the endpoints' records and an offset key, as the
// ingester writes them (minus leases).
func loadRecords(ctx context.Context, cli *clientv3.Client, ks keyspace.Keyspace, src *TraceEntries, mode keyspace.HashMode) error {
	var ops []clientv3.Op
	for _, ep := range src.Pods {
		rec, err := (&keyspace.EndpointRecord{HashMode: mode, BlockSize: 16, LastRecord: time.Now().UTC(), Topic: "kvindex-events"}).Marshal()
		if err != nil {
			return err
		}
		ops = append(ops, clientv3.OpPut(ks.EndpointKey(ep), string(rec)))
	}
	ops = append(ops, clientv3.OpPut(ks.OffsetKey(keyspace.Partition{Topic: "kvindex-events"}), "1"))
	if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
		return fmt.Errorf("bench: loading etcd: %w", err)
	}
	return nil
}

// engineOf is the engine hash a token-mode entry of key hash h carries:
// a fixed bijective mix of h (the cold start has no engine; the value
// needs an engine hash's size and entropy, not its meaning).
func engineOf(h uint64) uint64 { return bits.RotateLeft64(h, 29) ^ 0x9e3779b97f4a7c15 }

// loadV2Entries writes n entries of src as v2 chunks: each endpoint's
// entries, in the order src produces them, fill its chunks 0, 1, ... of
// cfg.ChunkSize entries each (the last one partly). It returns the
// chunks written.
func loadV2Entries(ctx context.Context, cli *clientv3.Client, ks keyspace.Keyspace, src *TraceEntries, cfg ColdStartConfig) (int, error) {
	type open struct {
		prefix  string
		seq     uint64
		entries []keyspace.ChunkEntry
	}
	eps := map[string]*open{}
	for _, ep := range src.Pods {
		eps[ep.Pod] = &open{prefix: ks.EndpointChunksPrefix(ep)}
	}
	withEngine := cfg.HashMode == keyspace.HashModeToken
	chunks := 0
	put := func(o *open, emit func(clientv3.Op) bool) bool {
		key := keyspace.AppendChunkKey(nil, o.prefix, tier.GPU, o.seq)
		val := keyspace.AppendChunkValue(nil, o.entries, withEngine)
		o.seq++
		o.entries = o.entries[:0]
		chunks++
		return emit(clientv3.OpPut(string(key), string(val)))
	}
	err := loadOps(ctx, cli, func(emit func(clientv3.Op) bool) {
		ok := true
		src.Each(cfg.Entries, func(ep keyspace.Endpoint, h uint64) bool {
			o := eps[ep.Pod]
			o.entries = append(o.entries, keyspace.ChunkEntry{Key: h, Engine: engineOf(h)})
			if len(o.entries) == cfg.ChunkSize {
				ok = put(o, emit)
			}
			return ok
		})
		for _, ep := range src.Pods {
			if o := eps[ep.Pod]; ok && len(o.entries) > 0 {
				ok = put(o, emit)
			}
		}
	})
	return chunks, err
}

// loadV1Entries writes n entries of src as v1 block keys (GPU, the
// engine hash as the value in token mode, empty in engine-hash mode).
func loadV1Entries(ctx context.Context, cli *clientv3.Client, ks keyspace.Keyspace, src *TraceEntries, n int, mode keyspace.HashMode) error {
	prefixes := map[string]string{}
	for _, ep := range src.Pods {
		prefixes[ep.Pod] = v1EndpointPrefix(ks, ep)
	}
	return loadOps(ctx, cli, func(emit func(clientv3.Op) bool) {
		src.Each(n, func(ep keyspace.Endpoint, h uint64) bool {
			key := appendV1BlockKey(nil, prefixes[ep.Pod], tier.GPU, h)
			return emit(clientv3.OpPut(string(key), string(appendV1Value(nil, mode, engineOf(h)))))
		})
	})
}

// loadOps writes the puts gen emits in transactions of 1,024 from 4
// writers. gen must stop emitting once emit returns false (the load
// failed).
func loadOps(ctx context.Context, cli *clientv3.Client, gen func(emit func(clientv3.Op) bool)) error {
	const txnOps, writers = 1024, 4
	g, gctx := errgroup.WithContext(ctx)
	batches := make(chan []clientv3.Op, writers)
	g.Go(func() error {
		// The generator owns batches: it closes it when done.
		defer close(batches)
		ops := make([]clientv3.Op, 0, txnOps)
		var sendErr error
		flush := func() bool {
			select {
			case batches <- ops:
				ops = make([]clientv3.Op, 0, txnOps)
				return true
			case <-gctx.Done():
				sendErr = gctx.Err()
				return false
			}
		}
		gen(func(op clientv3.Op) bool {
			ops = append(ops, op)
			return len(ops) < txnOps || flush()
		})
		if sendErr == nil && len(ops) > 0 {
			flush()
		}
		return sendErr
	})
	for range writers {
		g.Go(func() error {
			for ops := range batches {
				if _, err := cli.Txn(gctx).Then(ops...).Commit(); err != nil {
					return fmt.Errorf("bench: loading etcd: %w", err)
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// timeGet times one unpaged Get of prefix on a fresh client, checks it
// returns n keys, and returns its time and its response's protobuf size.
func timeGet(ctx context.Context, node *etcdNode, prefix string, n int) (time.Duration, int, error) {
	cli, err := node.client()
	if err != nil {
		return 0, 0, err
	}
	defer cli.Close()
	if _, err := cli.Get(ctx, "warm-up"); err != nil {
		return 0, 0, fmt.Errorf("bench: %w", err)
	}
	runtime.GC()
	began := time.Now()
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
	d := time.Since(began)
	if err != nil {
		return 0, 0, fmt.Errorf("bench: reference Get: %w", err)
	}
	if len(resp.Kvs) != n {
		return 0, 0, fmt.Errorf("bench: reference Get of %s returned %d keys, want %d", prefix, len(resp.Kvs), n)
	}
	return d, proto.Size((*pb.RangeResponse)(resp)), nil
}

// timeV1List times the v1 reader's list (listV1) on a fresh client and
// checks it read n block keys.
func timeV1List(ctx context.Context, node *etcdNode, ks keyspace.Keyspace, n int) (time.Duration, error) {
	cli, err := node.client()
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	if _, err := cli.Get(ctx, "warm-up"); err != nil {
		return 0, fmt.Errorf("bench: %w", err)
	}
	runtime.GC()
	began := time.Now()
	got, err := listV1(ctx, cli, ks)
	d := time.Since(began)
	if err != nil {
		return 0, err
	}
	if got != n {
		return 0, fmt.Errorf("bench: the v1 list read %d block keys, want %d", got, n)
	}
	return d, nil
}

// timeReady times a fresh replica from New to SERVING, checks it holds n
// entries, and returns that time and its heap per entry. A replica that
// holds none is ErrReaderNotV2.
func timeReady(ctx context.Context, node *etcdNode, n int, log *slog.Logger) (_ time.Duration, _ float64, err error) {
	cli, err := node.client()
	if err != nil {
		return 0, 0, err
	}
	if _, err := cli.Get(ctx, "warm-up"); err != nil {
		cli.Close()
		return 0, 0, fmt.Errorf("bench: %w", err)
	}
	before := LiveHeap()
	began := time.Now()
	r, err := startIndexdOn(ctx, cli, log)
	if err != nil {
		cli.Close()
		return 0, 0, err
	}
	d := time.Since(began)
	defer func() {
		if serr := r.stop(); serr != nil && err == nil {
			err = serr
		}
	}()
	heap := float64(int64(LiveHeap())-int64(before)) / float64(n)
	c, err := client.New(r.srv.Addr().String())
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	list, err := c.ListEndpoints(ctx, "")
	if err != nil {
		return 0, 0, err
	}
	var held uint64
	for _, e := range list.Endpoints {
		held += e.GPUBlocks + e.CPUBlocks + e.DiskBlocks
	}
	switch {
	case held == 0 && n > 0:
		return 0, 0, fmt.Errorf("%w (%d entries in chunks): this build's indexd does not read chunks", ErrReaderNotV2, n)
	case held != uint64(n):
		return 0, 0, fmt.Errorf("bench: the replica holds %d entries, want %d", held, n)
	}
	return d, heap, nil
}
