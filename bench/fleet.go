package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/ingester"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/logging"
)

// FleetConfig configures RunFleet.
type FleetConfig struct {
	// Stream is the fleet's KV-event stream (BuildStream). Required.
	Stream *Stream
	// Partitions is the topic's partition count. Default 4.
	Partitions int32
	// Fraction sets the target rate as a fraction of the raw block-op
	// ceiling measured first. Default (zero) 0.5, DESIGN's freshness
	// condition; negative means no pacing: as fast as the pipeline takes
	// the records (with at most MaxInFlight unconfirmed).
	Fraction float64
	// Rate, when positive, is the target rate in block-ops/s, overriding
	// Fraction (the ceiling is still measured and reported): the fixed
	// rate of DESIGN's freshness goal (50,000).
	Rate float64
	// Duration, with Rate, cuts the stream to the records the pacer hands
	// out in that time (prefixFor); every part of the run (the ceilings,
	// the v1 reference, the paced and the unpaced runs) then works on
	// those records. Zero: the whole stream.
	Duration time.Duration
	// ProbeEvery probes the freshness of every ProbeEvery-th record.
	// Default 1 (every record).
	ProbeEvery int
	// CeilingProbeEvery is ProbeEvery in the unpaced end-to-end run that
	// measures the pipeline's ceiling, sparse so that waiting probes do
	// not hold the producer back. Default 64.
	CeilingProbeEvery int
	// MaxInFlight bounds the records produced but not yet seen on the
	// second replica (or acknowledged, when not probed); the pacer waits
	// when it is reached and counts a stall. Default 200, under indexd's
	// default bound on Lookups parked on a barrier (256), which an
	// unpaced run would otherwise exceed.
	MaxInFlight int
	// CeilingInFlight is MaxInFlight in the unpaced end-to-end run that
	// measures the pipeline's ceiling. Default MaxInFlight times
	// CeilingProbeEvery: as many probes wait on the second replica as in
	// a paced run probing every batch, and the producer is not what
	// bounds the run (a bound of MaxInFlight unacknowledged batches would
	// cap it at MaxInFlight per produce round trip).
	CeilingInFlight int
	// BarrierTimeout bounds each probe's wait. Default 30 s.
	BarrierTimeout time.Duration
	// WindowOps is the ingesters' Config.WindowOps (the block operations
	// that end a batch window), and the v1 writer's. Default the
	// ingester's.
	WindowOps int
	// MaxTxnOps is the ingesters' --max-txn-ops, the most operations per
	// transaction (they pack what etcd accepts up to it; the embedded etcd
	// takes 1,024, as deploy/ runs it), and the v1 writer's bound. Default
	// the ingester's (1,024).
	MaxTxnOps int
	// MaxTxnsInFlight is the transactions each reference writer keeps in
	// flight. Default DefaultTxnsInFlight.
	MaxTxnsInFlight int
	// Profile, when set, receives a CPU profile (pprof) of the paced run.
	Profile io.Writer
	// Setup is how etcd and the ingester run (fsync, hash mode), in the
	// ceiling's run and the measured one alike.
	Setup Setup
	// Logger receives the components' logs. Default: discard.
	Logger *slog.Logger
}

func (c *FleetConfig) defaults() error {
	if c.Stream == nil || len(c.Stream.Records) == 0 {
		return fmt.Errorf("bench: fleet needs a stream")
	}
	if err := c.Setup.check(); err != nil {
		return err
	}
	if c.Duration < 0 || (c.Duration > 0 && c.Rate <= 0) {
		return fmt.Errorf("bench: fleet duration %s needs a fixed rate", c.Duration)
	}
	if c.Partitions <= 0 {
		c.Partitions = 4
	}
	if c.Fraction == 0 {
		c.Fraction = 0.5
	}
	if c.ProbeEvery <= 0 {
		c.ProbeEvery = 1
	}
	if c.CeilingProbeEvery <= 0 {
		c.CeilingProbeEvery = 64
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 200
	}
	if c.CeilingInFlight <= 0 {
		c.CeilingInFlight = c.MaxInFlight * c.CeilingProbeEvery
	}
	if c.BarrierTimeout <= 0 {
		c.BarrierTimeout = 30 * time.Second
	}
	if c.MaxTxnsInFlight <= 0 {
		c.MaxTxnsInFlight = DefaultTxnsInFlight
	}
	if c.Logger == nil {
		c.Logger = logging.Discard()
	}
	return nil
}

// FreshnessGoalRate is DESIGN's fixed rate for the freshness goal, in
// block-ops/s: above the whole v1 raw ceiling on the benchmark machine,
// about 40 busy vLLM pods.
const FreshnessGoalRate = 50_000

// FleetResult is what RunFleet measured. Every per-block-op figure and
// every block-op rate is over the block operations of the run's stream as
// published (BlockOps: each BlockStored or BlockRemoved hash, before the
// ingester's coalescing), a count that does not depend on the layout.
type FleetResult struct {
	Partitions int32
	// Setup is the run's etcd and ingester settings.
	Setup Setup
	// Records, Events and BlockOps are the run's stream (the Duration's
	// prefix when one was given).
	Records, Events, BlockOps int
	// CeilingTime is the raw writer's time for the captured transactions
	// (the ingester's own, written straight to a fresh etcd by one writer
	// per partition); Captured are their counts and CeilingDB the etcd
	// database's growth while they were written.
	CeilingTime time.Duration
	Captured    captureCounts
	CeilingDB   dbSize
	// CeilingWriters are the raw writers' shares: pods hash to
	// partitions unevenly, and the ceiling's time is its slowest writer's.
	CeilingWriters []WriterShare
	// V1Time, V1 and V1DB are the same for the v1 layout (buildV1Txns:
	// one key per block, the same records, windows and transaction
	// bound), written on a fresh etcd of its own.
	V1Time time.Duration
	V1     v1Counts
	V1DB   dbSize
	// TargetRate is the pace in stream block-ops/s (0: unpaced) and
	// Fraction that pace over the ceiling (0: unpaced).
	TargetRate, Fraction float64
	// Paced is the measured run at TargetRate.
	Paced FleetRun
	// E2E is the unpaced run that measures the pipeline's end-to-end
	// ceiling (its freshness is not a figure: the run saturates).
	E2E FleetRun
}

// FleetRun is one run of the whole pipeline over the stream.
type FleetRun struct {
	// Elapsed is from the first record handed to the producer until the
	// first replica had applied the last one.
	Elapsed time.Duration
	// Freshness holds each probed record's time from being handed to the
	// producer until a Lookup with a barrier on it answered on the second
	// replica; Visible counts the probes whose answer showed the record's
	// endpoint holding at least one block of its request.
	Freshness Latencies
	Visible   int
	// Acks, Sent and Shown split each probed record's freshness into
	// stages: Acks from being handed to the producer to the broker's
	// acknowledgement; Sent from then until the ingester started sending
	// the transaction that stores an offset past the record (fetch,
	// decode, coalescing, and the window's earlier transactions); Shown
	// from then until the second replica answered (etcd's commit and
	// apply, the watch, the replica's apply, the barrier's answer).
	Acks, Sent, Shown Latencies
	// Stalls counts records the pacer held back because MaxInFlight were
	// unconfirmed.
	Stalls int
	// Txns and Ops count the ingester's write transactions and their
	// operations (Config.BeforeTxn's TxnInfo.Ops).
	Txns, Ops int64
	// DB is etcd's database growth from before the first record to after
	// the last was applied.
	DB dbSize
	// WatchEvents and WatchBytes are what a dedicated watcher of the
	// keyspace prefix received over the same span (watchCounter).
	WatchEvents, WatchBytes int64
}

// CeilingRate is the raw block-op ceiling of the ingester's own
// transactions, in block-ops/s.
func (r *FleetResult) CeilingRate() float64 { return float64(r.BlockOps) / r.CeilingTime.Seconds() }

// V1CeilingRate is the v1 layout's raw block-op ceiling, in block-ops/s.
func (r *FleetResult) V1CeilingRate() float64 { return float64(r.BlockOps) / r.V1Time.Seconds() }

// E2ERate is the unpaced pipeline's end-to-end rate, in block-ops/s.
func (r *FleetResult) E2ERate() float64 { return float64(r.BlockOps) / r.E2E.Elapsed.Seconds() }

// perOp is x per block op of the run's stream.
func (r *FleetResult) perOp(x int64) float64 { return float64(x) / float64(r.BlockOps) }

// freshnessGoal is the goal the paced run's freshness p99 is held to: 50
// ms at DESIGN's half of the ceiling, or at DESIGN's fixed rate of
// FreshnessGoalRate or more; nil otherwise.
func (r *FleetResult) freshnessGoal() *Goal {
	if r.Fraction == 0.5 || r.TargetRate >= FreshnessGoalRate {
		return &Goal{Target: 50, AtMost: true}
	}
	return nil
}

// Figures returns the fleet's figures: of the paced run, end-to-end
// events/s and block-ops/s (against the ceiling), the freshness
// distribution (p99 held to ≤ 50 ms, freshnessGoal) and its stages, etcd
// operations per block op (≤ 0.1, with the v1 layout's beside it), etcd
// DB growth per block op against the v1 layout's (≤ 0.25×) and watch
// bytes per block op; the raw ceiling of the ingester's transactions
// against the v1 layout's and its DB growth against v1's; the unpaced
// end-to-end ceiling against the v1 layout's raw ceiling (≥ 5×).
func (r *FleetResult) Figures() []Figure {
	frac, pace := "unpaced", "unpaced"
	if r.Fraction > 0 {
		frac = fmt.Sprintf("%.3g", r.Fraction)
	}
	if r.TargetRate > 0 {
		pace = strconv.FormatFloat(r.TargetRate, 'f', 0, 64)
	}
	labels := r.Setup.labels(map[string]string{"fraction": frac, "rate": pace, "partitions": fmt.Sprint(r.Partitions), "layout": r.Captured.Layout})
	ms := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }
	p := &r.Paced
	secs := p.Elapsed.Seconds()
	v1 := "v1 layout straight to etcd"
	return []Figure{
		{Name: "fleet_events_per_second", Labels: labels, Value: float64(r.Events) / secs, Unit: "events/s"},
		{Name: "fleet_block_ops_per_second", Labels: labels, Value: float64(r.BlockOps) / secs, Unit: "block-ops/s",
			Reference: r.CeilingRate(), HasReference: true, RefName: "raw etcd ceiling"},
		{Name: "fleet_freshness_p50", Labels: labels, Value: ms(p.Freshness.Percentile(0.5)), Unit: "ms"},
		{Name: "fleet_freshness_p99", Labels: labels, Value: ms(p.Freshness.Percentile(0.99)), Unit: "ms", Goal: r.freshnessGoal()},
		{Name: "fleet_freshness_max", Labels: labels, Value: ms(p.Freshness.Max()), Unit: "ms"},
		{Name: "fleet_freshness_ack_p99", Labels: labels, Value: ms(p.Acks.Percentile(0.99)), Unit: "ms"},
		{Name: "fleet_freshness_ingester_p99", Labels: labels, Value: ms(p.Sent.Percentile(0.99)), Unit: "ms"},
		{Name: "fleet_freshness_replica_p99", Labels: labels, Value: ms(p.Shown.Percentile(0.99)), Unit: "ms"},
		{Name: "etcd_ops_per_block_op", Labels: labels, Value: r.perOp(p.Ops), Unit: "ops/block-op",
			Reference: r.perOp(int64(r.V1.Ops)), HasReference: true, RefName: v1, Goal: &Goal{Target: 0.1, AtMost: true}},
		{Name: "etcd_db_bytes_per_block_op_vs_v1", Labels: labels, Value: r.perOp(p.DB.InUse), Unit: "B/block-op",
			Reference: r.perOp(r.V1DB.InUse), HasReference: true, RefName: v1, Goal: &Goal{Target: 0.25, AtMost: true, OnRatio: true}},
		{Name: "watch_bytes_per_block_op", Labels: labels, Value: r.perOp(p.WatchBytes), Unit: "B/block-op"},
		{Name: "fleet_raw_ceiling_block_ops_per_second", Labels: labels, Value: r.CeilingRate(), Unit: "block-ops/s",
			Reference: r.V1CeilingRate(), HasReference: true, RefName: v1},
		{Name: "etcd_db_bytes_per_block_op_raw_vs_v1", Labels: labels, Value: r.perOp(r.CeilingDB.InUse), Unit: "B/block-op",
			Reference: r.perOp(r.V1DB.InUse), HasReference: true, RefName: v1},
		{Name: "fleet_ceiling_vs_v1_raw", Labels: labels, Value: r.E2ERate(), Unit: "block-ops/s",
			Reference: r.V1CeilingRate(), HasReference: true, RefName: v1 + " (raw ceiling)", Goal: &Goal{Target: 5, OnRatio: true}},
	}
}

// RunFleet drives the pipeline with a simulated fleet's stream and
// measures its sustained rate and its freshness (DESIGN "Performance
// goals": freshness p99 ≤ 50 ms at half the measured raw block-op
// ceiling, or at a fixed 50,000 block-ops/s), and what the layout
// costs etcd against the v1 layout in the same run.
//
// First the ceilings: the stream is produced and ingested once while its
// write transactions are captured, and the captured transactions are
// written straight to a fresh etcd by one writer per partition (as in
// RunIngest); then the v1 layout's transactions for the same records
// (buildV1Txns) are written the same way to another fresh etcd. Each
// gives a raw ceiling and etcd's DB growth.
//
// Then the measured run, on a fresh etcd and broker: an ingester and two
// indexd replicas, each with its own etcd client, and a dedicated watcher
// of the keyspace counting the bytes it receives. A token-bucket pacer
// hands the records to the producer at the target rate (Rate, or Fraction
// × the ceiling, in the stream's block operations). For each probed
// record, once the broker acknowledges it with its (partition, offset),
// a Lookup of the record's request on the second replica with a
// read-your-events barrier on that record returns exactly when the record
// is visible there; its freshness is the time from handing the record to
// the producer to that answer. The run ends when the first replica has
// applied the last record. Last, the same run unpaced, probing every
// CeilingProbeEvery-th record, gives the end-to-end ceiling.
func RunFleet(ctx context.Context, cfg FleetConfig) (*FleetResult, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	burst := cfg.Stream.MaxBlockOps
	s := cfg.Stream
	if cfg.Rate > 0 {
		s = s.Prefix(prefixFor(s, cfg.Rate, cfg.Duration))
	}
	if len(s.Records) == 0 {
		return nil, fmt.Errorf("bench: no record of the stream fits %s at %.0f block-ops/s", cfg.Duration, cfg.Rate)
	}
	res := &FleetResult{Partitions: cfg.Partitions, Setup: cfg.Setup, Records: len(s.Records), Events: s.Events, BlockOps: s.BlockOps}
	if err := fleetCeiling(ctx, cfg, s, res); err != nil {
		return nil, err
	}
	switch {
	case cfg.Rate > 0:
		res.TargetRate = cfg.Rate
		res.Fraction = cfg.Rate / res.CeilingRate()
	case cfg.Fraction > 0:
		res.TargetRate = cfg.Fraction * res.CeilingRate()
		res.Fraction = cfg.Fraction
	}
	var err error
	if res.Paced, err = fleetRun(ctx, cfg, s, runShape{rate: res.TargetRate, burst: burst, probeEvery: cfg.ProbeEvery, inFlight: cfg.MaxInFlight, profile: cfg.Profile, count: true}); err != nil {
		return nil, err
	}
	if res.E2E, err = fleetRun(ctx, cfg, s, runShape{probeEvery: cfg.CeilingProbeEvery, inFlight: cfg.CeilingInFlight}); err != nil {
		return nil, err
	}
	return res, nil
}

// fleetCeiling measures the raw block-op ceilings of s: the ingester's own
// transactions, captured, then the v1 layout's.
func fleetCeiling(ctx context.Context, cfg FleetConfig, s *Stream, res *FleetResult) error {
	const topic = "bench-ceiling"
	kafka, err := startKafka(cfg.Logger, topic, cfg.Partitions)
	if err != nil {
		return err
	}
	defer kafka.Close()
	prod, err := newProducer(kafka.ListenAddrs(), cfg.Logger)
	if err != nil {
		return err
	}
	end, at, err := produceAll(ctx, prod, s, topic)
	prod.Close()
	if err != nil {
		return err
	}
	capture, err := captureRun(ctx, ingesterOptions{partitions: cfg.Partitions, windowOps: cfg.WindowOps, linger: cfg.Setup.windowLinger(), maxTxnOps: cfg.MaxTxnOps, inFlight: cfg.MaxTxnsInFlight,
		hashMode: cfg.Setup.hashMode(), chunkSize: cfg.Setup.ChunkSize, chunkOpenAt: cfg.Setup.ChunkOpenAt, log: cfg.Logger, brokers: kafka.ListenAddrs(), topic: topic}, cfg.Setup.etcd(), end)
	if err != nil {
		return err
	}
	if res.CeilingTime, res.CeilingDB, err = rawWriteMeasured(ctx, cfg, capture, topic); err != nil {
		return err
	}
	res.Captured = capture.counts()
	for p, d := range capture.writerTime {
		res.CeilingWriters = append(res.CeilingWriters, WriterShare{Partition: p, Ops: res.Captured.PartitionDataOps[p], Time: d})
	}
	slices.SortFunc(res.CeilingWriters, func(a, b WriterShare) int { return cmp.Compare(a.Partition, b.Partition) })
	v1, counts, err := buildV1Txns(s, at, v1Options{ks: keyspace.Default(), topic: topic, mode: cfg.Setup.hashMode(), windowOps: cfg.WindowOps, maxTxnOps: cfg.MaxTxnOps})
	if err != nil {
		return err
	}
	res.V1 = counts
	res.V1Time, res.V1DB, err = rawWriteMeasured(ctx, cfg, v1, topic)
	return err
}

// rawWriteMeasured writes c straight to a fresh etcd (rawWrite) and
// returns the time that took and the database's growth.
func rawWriteMeasured(ctx context.Context, cfg FleetConfig, c *txnCapture, topic string) (time.Duration, dbSize, error) {
	node, err := startEtcd(ctx, cfg.Logger, cfg.Setup.etcd())
	if err != nil {
		return 0, dbSize{}, err
	}
	defer node.close()
	before, err := dbSizeOf(ctx, node)
	if err != nil {
		return 0, dbSize{}, err
	}
	d, err := c.rawWrite(ctx, node.cli, topic, cfg.MaxTxnsInFlight)
	if err != nil {
		return 0, dbSize{}, err
	}
	after, err := dbSizeOf(ctx, node)
	if err != nil {
		return 0, dbSize{}, err
	}
	return d, before.growth(after), nil
}

// runShape is what differs between the paced and the unpaced run.
type runShape struct {
	// rate is the pace in block-ops/s (0: unpaced) with a bucket of
	// burst.
	rate       float64
	burst      int
	probeEvery int
	// inFlight bounds the batches produced but not yet confirmed.
	inFlight int
	profile  io.Writer
	// count runs the dedicated watcher and reads the DB size (the paced
	// run; the unpaced one measures the pipeline alone).
	count bool
}

// fleetRun runs the whole pipeline over s once.
func fleetRun(ctx context.Context, cfg FleetConfig, s *Stream, shape runShape) (res FleetRun, err error) {
	log := cfg.Logger
	const topic = "bench-fleet"
	kafka, err := startKafka(log, topic, cfg.Partitions)
	if err != nil {
		return res, err
	}
	defer kafka.Close()
	node, err := startEtcd(ctx, log, cfg.Setup.etcd())
	if err != nil {
		return res, err
	}
	defer node.close()
	// Stop order: the watcher, the replicas and the ingester, then etcd
	// and the broker (the defers above).
	var stops []func() error
	defer func() {
		for i := len(stops) - 1; i >= 0; i-- {
			if serr := stops[i](); serr != nil && err == nil {
				err = serr
			}
		}
	}()
	icli, err := node.client()
	if err != nil {
		return res, err
	}
	stops = append(stops, func() error { icli.Close(); return nil })
	// The ingester's offset-storing transactions, per partition, in order:
	// when each began to be sent and the next offset it stores.
	type commitAt struct {
		next int64
		at   time.Time
	}
	var commitMu sync.Mutex
	commits := map[int32][]commitAt{}
	var txns, ops int64
	ir, err := startIngester(ctx, ingesterOptions{cli: icli, brokers: kafka.ListenAddrs(), topic: topic, partitions: cfg.Partitions, windowOps: cfg.WindowOps, linger: cfg.Setup.windowLinger(), maxTxnOps: cfg.MaxTxnOps, inFlight: cfg.MaxTxnsInFlight, log: log,
		hashMode: cfg.Setup.hashMode(), chunkSize: cfg.Setup.ChunkSize, chunkOpenAt: cfg.Setup.ChunkOpenAt, beforeTxn: func(_ context.Context, info ingester.TxnInfo) error {
			at := time.Now()
			commitMu.Lock()
			defer commitMu.Unlock()
			txns++
			ops += int64(info.Ops)
			if info.Offset >= 0 {
				commits[info.Partition] = append(commits[info.Partition], commitAt{next: info.Offset, at: at})
			}
			return nil
		}})
	if err != nil {
		return res, err
	}
	stops = append(stops, ir.stop)
	var replicas [2]*client.Client
	for i := range replicas {
		r, err := startIndexd(ctx, node, log)
		if err != nil {
			return res, err
		}
		stops = append(stops, r.stop)
		c, err := client.New(r.srv.Addr().String(), client.WithTimeout(cfg.BarrierTimeout+10*time.Second))
		if err != nil {
			return res, err
		}
		stops = append(stops, c.Close)
		replicas[i] = c
	}
	if err := ir.waitAssigned(ctx); err != nil {
		return res, err
	}
	prod, err := newProducer(kafka.ListenAddrs(), log)
	if err != nil {
		return res, err
	}
	stops = append(stops, func() error { prod.Close(); return nil })
	// The watcher and the DB size start from here: the claims are written,
	// no record is.
	var (
		wcli     *clientv3.Client
		watch    *watchCounter
		dbBefore dbSize
	)
	if shape.count {
		if wcli, err = node.client(); err != nil {
			return res, err
		}
		stops = append(stops, func() error { wcli.Close(); return nil })
		if dbBefore, err = dbSizeOf(ctx, node); err != nil {
			return res, err
		}
		head, err := node.cli.Get(ctx, "bench-revision")
		if err != nil {
			return res, fmt.Errorf("bench: %w", err)
		}
		watch = startWatchCounter(ctx, wcli, keyspace.Default().Prefix(), head.Header.Revision+1)
		stops = append(stops, func() error { watch.stop(); return nil })
	}

	var pace *pacer
	if shape.rate > 0 {
		if pace, err = newPacer(shape.rate, max(shape.burst, s.MaxBlockOps)); err != nil {
			return res, err
		}
	}
	var (
		mu       sync.Mutex
		probed   []probeTimes
		visible  int
		last     = map[int32]int64{}
		firstErr error
		probes   sync.WaitGroup
	)
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	failed := func() error {
		mu.Lock()
		defer mu.Unlock()
		return firstErr
	}
	sem := make(chan struct{}, shape.inFlight)
	pctx, cancel := context.WithCancel(ctx)
	// On every return: end the probes still waiting (an error cut the run
	// short) and wait for them, before the replicas and the producer stop.
	defer func() {
		cancel()
		probes.Wait()
	}()
	if shape.profile != nil {
		if err := pprof.StartCPUProfile(shape.profile); err != nil {
			return res, fmt.Errorf("bench: cpu profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	began := time.Now()
	for i := range s.Records {
		if err := failed(); err != nil {
			return res, err
		}
		select {
		case sem <- struct{}{}:
		default:
			res.Stalls++
			select {
			case sem <- struct{}{}:
			case <-pctx.Done():
				return res, pctx.Err()
			}
		}
		rec := &s.Records[i]
		if pace != nil {
			if err := pace.wait(pctx, rec.BlockOps); err != nil {
				return res, fmt.Errorf("bench: pacer: %w", err)
			}
		}
		probe := i%shape.probeEvery == 0
		t0 := time.Now()
		prod.Produce(pctx, s.KafkaRecord(topic, i), func(kr *kgo.Record, err error) {
			if err != nil {
				<-sem
				fail(fmt.Errorf("bench: producing: %w", err))
				return
			}
			acked := time.Now()
			mu.Lock()
			last[kr.Partition] = max(last[kr.Partition], kr.Offset)
			mu.Unlock()
			if !probe {
				<-sem
				return
			}
			probes.Add(1)
			go func() {
				defer probes.Done()
				defer func() { <-sem }()
				ans, err := replicas[1].Lookup(pctx, Model, rec.LookupKeys(cfg.Setup.hashMode()), client.WithBarrier(cfg.BarrierTimeout,
					client.PartitionOffset{Topic: topic, Partition: kr.Partition, Offset: kr.Offset}))
				shown := time.Now()
				if err != nil {
					fail(fmt.Errorf("bench: freshness probe: %w", err))
					return
				}
				seen := slices.ContainsFunc(ans.Matches, func(m client.Match) bool { return m.Endpoint.Pod == rec.Pod })
				mu.Lock()
				probed = append(probed, probeTimes{partition: kr.Partition, offset: kr.Offset, handed: t0, acked: acked, shown: shown})
				if seen {
					visible++
				}
				mu.Unlock()
			}()
		})
	}
	if err := prod.Flush(pctx); err != nil {
		return res, fmt.Errorf("bench: flushing the producer: %w", err)
	}
	// The end: the first replica has applied the last record of every
	// partition.
	mu.Lock()
	var barrier []client.PartitionOffset
	for p, off := range last {
		barrier = append(barrier, client.PartitionOffset{Topic: topic, Partition: p, Offset: off})
	}
	mu.Unlock()
	if _, err := replicas[0].Lookup(pctx, Model, s.Records[0].LookupKeys(cfg.Setup.hashMode()), client.WithBarrier(cfg.BarrierTimeout, barrier...)); err != nil {
		return res, fmt.Errorf("bench: waiting for the first replica: %w", err)
	}
	res.Elapsed = time.Since(began)
	probes.Wait()
	if err := failed(); err != nil {
		return res, err
	}
	if len(probed) == 0 {
		return res, errors.New("bench: no freshness probe completed")
	}
	if shape.count {
		// What etcd holds and sent: every record is applied, so the
		// writes they caused are done.
		tail, err := node.cli.Get(ctx, "bench-revision")
		if err != nil {
			return res, fmt.Errorf("bench: %w", err)
		}
		if err := watch.waitRevision(ctx, wcli, tail.Header.Revision); err != nil {
			return res, err
		}
		res.WatchEvents, res.WatchBytes = watch.events.Load(), watch.bytes.Load()
		dbAfter, err := dbSizeOf(ctx, node)
		if err != nil {
			return res, err
		}
		res.DB = dbBefore.growth(dbAfter)
	}
	var fresh, acks, sent, shown []time.Duration
	commitMu.Lock()
	defer commitMu.Unlock()
	res.Txns, res.Ops = txns, ops
	for _, pt := range probed {
		fresh = append(fresh, pt.shown.Sub(pt.handed))
		acks = append(acks, pt.acked.Sub(pt.handed))
		cs := commits[pt.partition]
		// The first transaction storing a next offset past the record.
		i, _ := slices.BinarySearchFunc(cs, pt.offset+1, func(c commitAt, next int64) int { return cmp.Compare(c.next, next) })
		if i < len(cs) {
			sent = append(sent, cs[i].at.Sub(pt.acked))
			shown = append(shown, pt.shown.Sub(cs[i].at))
		}
	}
	res.Freshness = sortedLatencies(fresh, res.Elapsed)
	res.Acks = sortedLatencies(acks, res.Elapsed)
	res.Sent = sortedLatencies(sent, res.Elapsed)
	res.Shown = sortedLatencies(shown, res.Elapsed)
	res.Visible = visible
	return res, nil
}

// WriterShare is one partition's raw writer in the ceiling measurement:
// its block operations and when it finished.
type WriterShare struct {
	Partition int32
	Ops       int64
	Time      time.Duration
}

// probeTimes is one freshness probe's timeline.
type probeTimes struct {
	partition            int32
	offset               int64
	handed, acked, shown time.Time
}

func sortedLatencies(ds []time.Duration, elapsed time.Duration) Latencies {
	slices.Sort(ds)
	return Latencies{Sorted: ds, Elapsed: elapsed}
}
