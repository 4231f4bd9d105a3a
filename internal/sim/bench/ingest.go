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

// IngestResult is what RunIngest measured, summed over its rounds.
type IngestResult struct {
	Partitions int32
	// Setup is the run's etcd and ingester settings.
	Setup  Setup
	Rounds int
	// Records and Events are one round's stream.
	Records, Events int
	// IngestOps are the block operations the timed ingesters wrote
	// (after coalescing); IngestTime is from Run's start (group join,
	// claims and first fetch included) until every stored offset was past
	// the produced records; SteadyTime from the first write transaction
	// to the same moment.
	IngestOps              int64
	IngestTime, SteadyTime time.Duration
	// RefOps are the block operations of the captured transactions the
	// reference wrote, RefTime its time, RefTxns their count per round.
	RefOps  int64
	RefTime time.Duration
	RefTxns int
}

// IngestRate is the ingest block-ops/s, Run's start included.
func (r *IngestResult) IngestRate() float64 { return float64(r.IngestOps) / r.IngestTime.Seconds() }

// SteadyRate is the ingest block-ops/s from the first transaction on.
func (r *IngestResult) SteadyRate() float64 { return float64(r.IngestOps) / r.SteadyTime.Seconds() }

// RawRate is the reference's block-ops/s: the raw etcd limit.
func (r *IngestResult) RawRate() float64 { return float64(r.RefOps) / r.RefTime.Seconds() }

// Figures returns the ingest figures: the rate against the raw etcd
// limit (goal ≥ 0.8), the steady rate, and the raw limit itself.
func (r *IngestResult) Figures() []Figure {
	labels := r.Setup.labels(map[string]string{"partitions": fmt.Sprint(r.Partitions), "rounds": fmt.Sprint(r.Rounds)})
	ref := "same txns straight to etcd"
	return []Figure{
		{Name: "ingest_block_ops_per_second", Labels: labels, Value: r.IngestRate(), Unit: "block-ops/s",
			Reference: r.RawRate(), HasReference: true, RefName: ref, Goal: &Goal{Target: 0.8, OnRatio: true}},
		{Name: "ingest_steady_block_ops_per_second", Labels: labels, Value: r.SteadyRate(), Unit: "block-ops/s",
			Reference: r.RawRate(), HasReference: true, RefName: ref},
		{Name: "raw_etcd_block_ops_per_second", Labels: labels, Value: r.RawRate(), Unit: "block-ops/s"},
	}
}

// RunIngest measures DESIGN's ingest goal: block operations per second
// through Kafka → ingester → etcd against the same transactions written
// straight to etcd by as many concurrent writers (one per partition). It
// is PrepareIngest, cfg.Rounds rounds, and Close.
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
	// Result sums the rounds run so far (Rounds counts them).
	Result *IngestResult
}

// PrepareIngest produces the stream to a fresh topic before anything is
// timed (so the broker does not compete for CPU while timing) and runs the
// capture: an ingester works through the records once, into a fresh etcd,
// while every write transaction it commits is recorded.
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
	run.end, err = produceAll(ctx, prod, cfg.Stream, run.topic)
	prod.Close()
	if err != nil {
		return nil, err
	}
	run.capture, err = captureRun(ctx, run.options(), cfg.Setup.etcd(), run.end)
	if err != nil {
		return nil, err
	}
	run.Result = &IngestResult{Partitions: cfg.Partitions, Setup: cfg.Setup, Records: len(cfg.Stream.Records),
		Events: cfg.Stream.Events, RefTxns: run.capture.transactions()}
	return run, nil
}

// options are the ingesters' shape (each run adds its etcd client).
func (r *IngestRun) options() ingesterOptions {
	return ingesterOptions{partitions: r.cfg.Partitions, maxTxnOps: r.cfg.MaxTxnOps, windowOps: r.cfg.WindowOps, inFlight: r.cfg.MaxTxnsInFlight,
		hashMode: r.cfg.Setup.hashMode(), log: r.cfg.Logger, brokers: r.kafka.ListenAddrs(), topic: r.topic}
}

// Close stops the broker.
func (r *IngestRun) Close() { r.kafka.Close() }

// Round runs the reference (the captured transactions, rawWrite) and a
// timed ingester over the same records, each on a fresh embedded etcd so
// both start from an empty database; odd rounds run the ingester first.
func (r *IngestRun) Round(ctx context.Context) error {
	steps := []func(context.Context) error{r.reference, r.timed}
	if r.Result.Rounds%2 == 1 {
		steps[0], steps[1] = steps[1], steps[0]
	}
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
	r.Result.RefOps += r.capture.blockOps()
	r.Result.RefTime += d
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
	var ops int64
	o.beforeTxn = func(_ context.Context, info ingester.TxnInfo) error {
		mu.Lock()
		if first.IsZero() {
			first = time.Now()
		}
		ops += int64(info.ChunkOps)
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
	r.Result.IngestOps += ops
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
