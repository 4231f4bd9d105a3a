package bench

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kvindex/kvindex/ingester"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/logging"
)

// DefaultTxnsInFlight is the transactions a reference writer keeps in
// flight unless configured otherwise.
const DefaultTxnsInFlight = 4

// IngestConfig configures RunIngest.
type IngestConfig struct {
	// Stream is the KV-event stream to ingest (BuildStream). Required.
	Stream *Stream
	// Partitions is the topic's partition count, and so the number of
	// ingester workers and of reference writers. Default 4.
	Partitions int32
	// MaxTxnOps is the ingester's --max-txn-ops, the most operations per
	// transaction. Default the ingester's (1,024).
	MaxTxnOps int
	// WindowOps is the ingester's Config.WindowOps. Default the
	// ingester's.
	WindowOps int
	// MaxTxnsInFlight is the transactions each reference writer keeps in
	// flight (the ingester writes a window in one transaction). Default
	// DefaultTxnsInFlight.
	MaxTxnsInFlight int
	// Rounds is how many times the reference and the timed ingest run,
	// alternating which goes first. Default 1.
	Rounds int
	// Setup is how etcd and the ingesters run (fsync, hash mode); the
	// reference writes the same transactions to an etcd run the same way.
	Setup Setup
	// Logger receives the components' logs. Default: discard.
	Logger *slog.Logger
}

func (c *IngestConfig) defaults() error {
	if c.Stream == nil || len(c.Stream.Records) == 0 {
		return fmt.Errorf("bench: ingest needs a stream")
	}
	if err := c.Setup.check(); err != nil {
		return err
	}
	if c.Partitions <= 0 {
		c.Partitions = 4
	}
	if c.Rounds <= 0 {
		c.Rounds = 1
	}
	if c.MaxTxnsInFlight <= 0 {
		c.MaxTxnsInFlight = DefaultTxnsInFlight
	}
	if c.Logger == nil {
		c.Logger = logging.Discard()
	}
	return nil
}

// IngestResult is what RunIngest measured, summed over its rounds. Every
// rate is over the stream's block operations as published (StreamOps per
// round, before the ingester's coalescing): a count that does not depend
// on the layout, so the v2 writers and the v1 writer compare on the same
// work.
type IngestResult struct {
	Partitions int32
	// Setup is the run's etcd and ingester settings.
	Setup  Setup
	Rounds int
	// Records, Events and StreamOps are one round's stream.
	Records, Events int
	StreamOps       int64
	// IngestTime is from Run's start (group join, claims and first fetch
	// included) until every stored offset was past the produced records;
	// SteadyTime from the first write transaction to the same moment.
	IngestTime, SteadyTime time.Duration
	// RefTime is the reference's time: the captured transactions written
	// straight to etcd; Captured are their counts (one round's).
	RefTime  time.Duration
	Captured captureCounts
	// V1Time is the v1-layout raw writer's time (buildV1Txns: one key per
	// block, the same stream, windows and transaction bound); V1 are its
	// counts (one round's).
	V1Time time.Duration
	V1     v1Counts
}

func (r *IngestResult) rate(d time.Duration) float64 {
	return float64(r.StreamOps) * float64(r.Rounds) / d.Seconds()
}

// IngestRate is the ingest block-ops/s, Run's start included.
func (r *IngestResult) IngestRate() float64 { return r.rate(r.IngestTime) }

// SteadyRate is the ingest block-ops/s from the first transaction on.
func (r *IngestResult) SteadyRate() float64 { return r.rate(r.SteadyTime) }

// RawRate is the reference's block-ops/s: the raw etcd limit of the
// ingester's own transactions.
func (r *IngestResult) RawRate() float64 { return r.rate(r.RefTime) }

// V1RawRate is the v1-layout raw writer's block-ops/s.
func (r *IngestResult) V1RawRate() float64 { return r.rate(r.V1Time) }

// Figures returns the ingest figures: the rate against the raw etcd
// limit of the same transactions (goal ≥ 0.8), the steady rate, the raw
// limit itself, and the raw limit against the v1 layout's. The label
// layout says which layout the captured transactions wrote.
func (r *IngestResult) Figures() []Figure {
	labels := r.Setup.labels(map[string]string{"partitions": fmt.Sprint(r.Partitions), "rounds": fmt.Sprint(r.Rounds), "layout": r.Captured.Layout})
	ref := "same txns straight to etcd"
	return []Figure{
		{Name: "ingest_block_ops_per_second", Labels: labels, Value: r.IngestRate(), Unit: "block-ops/s",
			Reference: r.RawRate(), HasReference: true, RefName: ref, Goal: &Goal{Target: 0.8, OnRatio: true}},
		{Name: "ingest_steady_block_ops_per_second", Labels: labels, Value: r.SteadyRate(), Unit: "block-ops/s",
			Reference: r.RawRate(), HasReference: true, RefName: ref},
		{Name: "raw_etcd_block_ops_per_second", Labels: labels, Value: r.RawRate(), Unit: "block-ops/s"},
		{Name: "raw_etcd_vs_v1_raw_block_ops_per_second", Labels: labels, Value: r.RawRate(), Unit: "block-ops/s",
			Reference: r.V1RawRate(), HasReference: true, RefName: "v1 layout straight to etcd"},
	}
}

// RunIngest measures DESIGN's ingest goal: block operations per second
// through Kafka → ingester → etcd against the same transactions written
// straight to etcd by as many concurrent writers (one per partition), and
// those against the v1 layout's transactions for the same records written
// the same way. It is PrepareIngest, cfg.Rounds rounds, and
// Close.
func RunIngest(ctx context.Context, cfg IngestConfig) (*IngestResult, error) {
	run, err := PrepareIngest(ctx, cfg)
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

// IngestRun is a prepared ingest measurement: the stream produced to a
// topic of an in-process broker and the captured transactions.
type IngestRun struct {
	cfg     IngestConfig
	kafka   *kfake.Cluster
	topic   string
	end     map[int32]int64
	capture *txnCapture
	// v1 is the v1-layout writer's transactions for the same records.
	v1 *txnCapture
	// Result sums the rounds run so far (Rounds counts them).
	Result *IngestResult
}

// PrepareIngest produces the stream to a fresh topic before anything is
// timed (so the broker does not compete for CPU while timing) and runs the
// capture: an ingester works through the records once, into a fresh etcd,
// while every write transaction it commits is recorded. It also builds the
// v1 layout's transactions for the records where they were produced
// (buildV1Txns, with the ingester's window and transaction bounds).
func PrepareIngest(ctx context.Context, cfg IngestConfig) (_ *IngestRun, err error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	run := &IngestRun{cfg: cfg, topic: "bench-ingest"}
	if run.kafka, err = startKafka(cfg.Logger, run.topic, cfg.Partitions); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			run.kafka.Close()
		}
	}()
	prod, err := newProducer(run.kafka.ListenAddrs(), cfg.Logger)
	if err != nil {
		return nil, err
	}
	var at []placement
	run.end, at, err = produceAll(ctx, prod, cfg.Stream, run.topic)
	prod.Close()
	if err != nil {
		return nil, err
	}
	run.capture, err = captureRun(ctx, run.options(), cfg.Setup.etcd(), run.end)
	if err != nil {
		return nil, err
	}
	run.Result = &IngestResult{Partitions: cfg.Partitions, Setup: cfg.Setup, Records: len(cfg.Stream.Records),
		Events: cfg.Stream.Events, StreamOps: int64(cfg.Stream.BlockOps), Captured: run.capture.counts()}
	if run.v1, run.Result.V1, err = buildV1Txns(cfg.Stream, at, v1Options{ks: keyspace.Default(), topic: run.topic,
		mode: cfg.Setup.hashMode(), windowOps: cfg.WindowOps, maxTxnOps: cfg.MaxTxnOps}); err != nil {
		return nil, err
	}
	return run, nil
}

// options are the ingesters' shape (each run adds its etcd client).
func (r *IngestRun) options() ingesterOptions {
	return ingesterOptions{partitions: r.cfg.Partitions, maxTxnOps: r.cfg.MaxTxnOps, windowOps: r.cfg.WindowOps, inFlight: r.cfg.MaxTxnsInFlight,
		linger: r.cfg.Setup.windowLinger(), hashMode: r.cfg.Setup.hashMode(), chunkSize: r.cfg.Setup.ChunkSize, chunkOpenAt: r.cfg.Setup.ChunkOpenAt, log: r.cfg.Logger, brokers: r.kafka.ListenAddrs(), topic: r.topic}
}

// Close stops the broker.
func (r *IngestRun) Close() { r.kafka.Close() }

// Round runs the reference (the captured transactions, rawWrite), the
// v1-layout raw writer and a timed ingester over the same records, each
// on a fresh embedded etcd so each starts from an empty database; round k
// starts with step k mod 3 of that order, so no step always runs first.
func (r *IngestRun) Round(ctx context.Context) error {
	steps := []func(context.Context) error{r.reference, r.v1Reference, r.timed}
	k := r.Result.Rounds % len(steps)
	steps = append(steps[k:], steps[:k]...)
	for _, step := range steps {
		if err := step(ctx); err != nil {
			return err
		}
	}
	r.Result.Rounds++
	return nil
}

func (r *IngestRun) reference(ctx context.Context) error {
	node, err := startEtcd(ctx, r.cfg.Logger, r.cfg.Setup.etcd())
	if err != nil {
		return err
	}
	defer node.close()
	d, err := r.capture.rawWrite(ctx, node.cli, r.topic, r.cfg.MaxTxnsInFlight)
	if err != nil {
		return err
	}
	r.Result.RefTime += d
	return nil
}

// v1Reference writes the v1 layout's transactions for the same records
// straight to a fresh etcd, as the reference writes the captured ones.
func (r *IngestRun) v1Reference(ctx context.Context) error {
	node, err := startEtcd(ctx, r.cfg.Logger, r.cfg.Setup.etcd())
	if err != nil {
		return err
	}
	defer node.close()
	d, err := r.v1.rawWrite(ctx, node.cli, r.topic, r.cfg.MaxTxnsInFlight)
	if err != nil {
		return err
	}
	r.Result.V1Time += d
	return nil
}

func (r *IngestRun) timed(ctx context.Context) error {
	node, err := startEtcd(ctx, r.cfg.Logger, r.cfg.Setup.etcd())
	if err != nil {
		return err
	}
	defer node.close()
	o := r.options()
	if o.cli, err = node.client(); err != nil {
		return err
	}
	defer o.cli.Close()
	var mu sync.Mutex
	var first time.Time
	o.beforeTxn = func(_ context.Context, info ingester.TxnInfo) error {
		mu.Lock()
		if first.IsZero() {
			first = time.Now()
		}
		mu.Unlock()
		return nil
	}
	began := time.Now()
	ir, err := startIngester(ctx, o)
	if err != nil {
		return err
	}
	done, werr := waitApplied(ctx, node.cli, keyspace.Default(), r.topic, r.end)
	if err := ir.stop(); err != nil && werr == nil {
		werr = fmt.Errorf("bench: ingester: %w", err)
	}
	if werr != nil {
		return werr
	}
	mu.Lock()
	defer mu.Unlock()
	r.Result.IngestTime += done.Sub(began)
	r.Result.SteadyTime += done.Sub(first)
	return nil
}

// captureRun ingests the produced records once into a fresh etcd, with
// an ingester shaped by o (its etcd client is captureRun's own) and an
// etcd shaped by eo, and
// returns the write transactions it committed.
func captureRun(ctx context.Context, o ingesterOptions, eo etcdOptions, end map[int32]int64) (*txnCapture, error) {
	ks := keyspace.Default()
	node, err := startEtcd(ctx, o.log, eo)
	if err != nil {
		return nil, err
	}
	defer node.close()
	capture := newTxnCapture(ks)
	if o.cli, err = node.client(capture.dialOption()); err != nil {
		return nil, err
	}
	defer o.cli.Close()
	ir, err := startIngester(ctx, o)
	if err != nil {
		return nil, err
	}
	_, werr := waitApplied(ctx, node.cli, ks, o.topic, end)
	if err := ir.stop(); err != nil && werr == nil {
		werr = fmt.Errorf("bench: capture ingester: %w", err)
	}
	if werr != nil {
		return nil, werr
	}
	return capture, nil
}
