package bench

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/logging"
	"github.com/kvindex/kvindex/internal/sim/fleetsim"
	"github.com/kvindex/kvindex/internal/tier"
)

// ColdStartConfig configures RunColdStart.
type ColdStartConfig struct {
	// Trace is the request trace the entries come from (TraceEntries).
	// Required.
	Trace []fleetsim.Request
	// Entries is how many block keys etcd holds. Default 5M.
	Entries int
	// Endpoints is how many endpoints (with endpoint records) hold them.
	// Default 16.
	Endpoints int
	// Rounds is how many times the reference Gets and a fresh indexd run;
	// figures are medians. Default 3.
	Rounds int
	// QuotaBytes is the embedded etcd's --quota-backend-bytes. Default
	// 8 GiB (etcd's own default, 2 GiB, is too small for 5M keys with
	// their history).
	QuotaBytes int64
	// Logger receives the components' logs. Default: discard.
	Logger *slog.Logger
}

func (c *ColdStartConfig) defaults() error {
	if len(c.Trace) == 0 {
		return fmt.Errorf("bench: cold start needs a trace")
	}
	if c.Entries <= 0 {
		c.Entries = 5_000_000
	}
	if c.Endpoints <= 0 {
		c.Endpoints = 16
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
	Load               time.Duration
	// Get is the reference: one unpaged Get of the blocks/ prefix;
	// KeysOnlyGet the same with WithKeysOnly (indexd's lists read keys
	// only); Ready a fresh indexd from New to gRPC health SERVING.
	Get, KeysOnlyGet, Ready []time.Duration
	// HeapPerEntry is the process's live heap growth from before the
	// replica started to after it was ready, over the entries.
	HeapPerEntry []float64
}

func medianDuration(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// Figures returns the cold-start figures: indexd's time to ready against
// one unpaged Get (goal ratio ≤ 1.25), against the keys-only Get, and the
// replica's heap per entry after ready.
func (r *ColdStartResult) Figures() []Figure {
	labels := map[string]string{"entries": fmt.Sprint(r.Entries), "rounds": fmt.Sprint(len(r.Ready))}
	ready := medianDuration(r.Ready).Seconds()
	heaps := slices.Clone(r.HeapPerEntry)
	slices.Sort(heaps)
	return []Figure{
		{Name: "coldstart_ready_seconds", Labels: labels, Value: ready, Unit: "s", Reference: medianDuration(r.Get).Seconds(),
			HasReference: true, RefName: "one unpaged Get", Goal: &Goal{Target: 1.25, AtMost: true, OnRatio: true}},
		{Name: "coldstart_ready_vs_keys_only_seconds", Labels: labels, Value: ready, Unit: "s", Reference: medianDuration(r.KeysOnlyGet).Seconds(),
			HasReference: true, RefName: "one unpaged keys-only Get"},
		{Name: "coldstart_heap_bytes_per_entry", Labels: labels, Value: heaps[len(heaps)/2], Unit: "B/entry"},
	}
}

// RunColdStart measures DESIGN's cold-start goal: the time for a fresh
// indexd to be ready against an etcd holding Entries block keys, against
// the reference measured in the same run, one unpaged Get of the same
// keys. It is PrepareColdStart, cfg.Rounds rounds, and Close.
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

// ColdStartRun is a prepared cold-start measurement: an embedded etcd
// loaded with the entries.
type ColdStartRun struct {
	cfg  ColdStartConfig
	node *etcdNode
	// Result holds the rounds run so far.
	Result *ColdStartResult
}

// PrepareColdStart loads a fresh embedded etcd with cfg.Entries entries
// of TraceEntries, written as the ingester writes them (empty values,
// endpoint records, an offset; no leases, which a list does not read),
// 1,024 puts per transaction from 4 writers.
func PrepareColdStart(ctx context.Context, cfg ColdStartConfig) (_ *ColdStartRun, err error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	src, err := NewTraceEntries(cfg.Trace, cfg.Endpoints)
	if err != nil {
		return nil, err
	}
	node, err := startEtcd(ctx, cfg.Logger, etcdOptions{quota: cfg.QuotaBytes})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			node.close()
		}
	}()
	run := &ColdStartRun{cfg: cfg, node: node, Result: &ColdStartResult{Entries: cfg.Entries, Endpoints: cfg.Endpoints}}
	began := time.Now()
	if err := loadEntries(ctx, node.cli, src, cfg.Entries); err != nil {
		return nil, err
	}
	run.Result.Load = time.Since(began)
	return run, nil
}

// Close stops etcd and deletes its data.
func (r *ColdStartRun) Close() { r.node.close() }

// Round takes the reference Get, the keys-only Get and a fresh replica's
// cold start, each on a fresh client, and appends them to Result.
func (r *ColdStartRun) Round(ctx context.Context) error {
	ks := keyspace.Default()
	d, err := timeGet(ctx, r.node, ks, r.cfg.Entries)
	if err != nil {
		return err
	}
	r.Result.Get = append(r.Result.Get, d)
	if d, err = timeGet(ctx, r.node, ks, r.cfg.Entries, clientv3.WithKeysOnly()); err != nil {
		return err
	}
	r.Result.KeysOnlyGet = append(r.Result.KeysOnlyGet, d)
	d, heap, err := timeReady(ctx, r.node, r.cfg.Entries, r.cfg.Logger)
	if err != nil {
		return err
	}
	r.Result.Ready = append(r.Result.Ready, d)
	r.Result.HeapPerEntry = append(r.Result.HeapPerEntry, heap)
	return nil
}

// loadEntries writes the endpoints' records, n block keys of src and an
// offset key, in transactions of 1,024 puts from 4 writers.
func loadEntries(ctx context.Context, cli *clientv3.Client, src *TraceEntries, n int) error {
	ks := keyspace.Default()
	var recOps []clientv3.Op
	for _, ep := range src.Pods {
		rec, err := (&keyspace.EndpointRecord{HashMode: keyspace.HashModeEngine, BlockSize: 16, LastRecord: time.Now().UTC()}).Marshal()
		if err != nil {
			return err
		}
		recOps = append(recOps, clientv3.OpPut(ks.EndpointKey(ep), string(rec)))
	}
	recOps = append(recOps, clientv3.OpPut(ks.OffsetKey(keyspace.Partition{Topic: "kvindex-events"}), "1"))
	if _, err := cli.Txn(ctx).Then(recOps...).Commit(); err != nil {
		return fmt.Errorf("bench: loading etcd: %w", err)
	}
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
		src.Each(n, func(ep keyspace.Endpoint, h uint64) bool {
			ops = append(ops, clientv3.OpPut(ks.BlockKey(ep, tier.GPU, h), ""))
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

// timeGet times one unpaged Get of the blocks/ prefix, with opts, on a
// fresh client, and checks it returns n keys.
func timeGet(ctx context.Context, node *etcdNode, ks keyspace.Keyspace, n int, opts ...clientv3.OpOption) (time.Duration, error) {
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
	resp, err := cli.Get(ctx, ks.BlocksPrefix(), append(opts, clientv3.WithPrefix())...)
	d := time.Since(began)
	if err != nil {
		return 0, fmt.Errorf("bench: reference Get: %w", err)
	}
	if len(resp.Kvs) != n {
		return 0, fmt.Errorf("bench: reference Get returned %d keys, want %d", len(resp.Kvs), n)
	}
	return d, nil
}

// timeReady times a fresh replica from New to SERVING, checks it holds n
// entries, and returns that time and its heap per entry.
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
	if held != uint64(n) {
		return 0, 0, fmt.Errorf("bench: the replica holds %d entries, want %d", held, n)
	}
	return d, heap, nil
}
