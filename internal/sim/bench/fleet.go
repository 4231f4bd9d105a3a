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
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/time/rate"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/ingester"
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
	// Fraction (the ceiling is still measured and reported).
	Rate float64
	// ProbeEvery probes the freshness of every ProbeEvery-th record.
	// Default 1 (every record).
	ProbeEvery int
	// MaxInFlight bounds the records produced but not yet seen on the
	// second replica (or acknowledged, when not probed); the pacer waits
	// when it is reached and counts a stall. Default 200, under indexd's
	// default bound on Lookups parked on a barrier (256), which an
	// unpaced run would otherwise exceed.
	MaxInFlight int
	// BarrierTimeout bounds each probe's wait. Default 30 s.
	BarrierTimeout time.Duration
	// WindowOps is the ingesters' Config.WindowOps (the block operations
	// that end a batch window). Default the ingester's.
	WindowOps int
	// MaxTxnOps is the ingesters' --max-txn-ops, the most operations per
	// transaction (they pack what etcd accepts up to it; the embedded etcd
	// takes 1,024, as deploy/ runs it). Default the ingester's (1,024).
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
	if c.Partitions <= 0 {
		c.Partitions = 4
	}
	if c.Fraction == 0 {
		c.Fraction = 0.5
	}
	if c.ProbeEvery <= 0 {
		c.ProbeEvery = 1
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 200
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

// FleetResult is what RunFleet measured.
type FleetResult struct {
	Partitions int32
	// Setup is the run's etcd and ingester settings.
	Setup Setup
	// Records, Events and BlockOps are the stream's.
	Records, Events, BlockOps int
	// CeilingOps and CeilingTime are the raw writer's block operations
	// (the captured transactions, after the ingester's coalescing) and
	// its time; CeilingTxns the transactions.
	CeilingOps  int64
	CeilingTime time.Duration
	CeilingTxns int
	// CeilingWriters are the raw writers' shares: pods hash to
	// partitions unevenly, and the ceiling's time is its slowest writer's.
	CeilingWriters []WriterShare
	// TargetRate is the pace in stream block-ops/s (0: unpaced) and
	// Fraction that pace over the ceiling (0: unpaced).
	TargetRate, Fraction float64
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
}

// CeilingRate is the raw block-op ceiling, in block-ops/s.
func (r *FleetResult) CeilingRate() float64 { return float64(r.CeilingOps) / r.CeilingTime.Seconds() }

// Figures returns the fleet's figures: end-to-end events/s and
// block-ops/s (the latter against the ceiling), the freshness
// distribution (p99 held to ≤ 50 ms at half the ceiling), and the
// ceiling.
func (r *FleetResult) Figures() []Figure {
	frac := "unpaced"
	if r.Fraction > 0 {
		frac = fmt.Sprintf("%.3g", r.Fraction)
	}
	labels := r.Setup.labels(map[string]string{"fraction": frac, "partitions": fmt.Sprint(r.Partitions)})
	ms := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }
	var p99Goal *Goal
	if r.Fraction == 0.5 {
		p99Goal = &Goal{Target: 50, AtMost: true}
	}
	secs := r.Elapsed.Seconds()
	return []Figure{
		{Name: "fleet_events_per_second", Labels: labels, Value: float64(r.Events) / secs, Unit: "events/s"},
		{Name: "fleet_block_ops_per_second", Labels: labels, Value: float64(r.BlockOps) / secs, Unit: "block-ops/s",
			Reference: r.CeilingRate(), HasReference: true, RefName: "raw etcd ceiling"},
		{Name: "fleet_freshness_p50", Labels: labels, Value: ms(r.Freshness.Percentile(0.5)), Unit: "ms"},
		{Name: "fleet_freshness_p99", Labels: labels, Value: ms(r.Freshness.Percentile(0.99)), Unit: "ms", Goal: p99Goal},
		{Name: "fleet_freshness_max", Labels: labels, Value: ms(r.Freshness.Max()), Unit: "ms"},
		{Name: "fleet_raw_ceiling_block_ops_per_second", Labels: labels, Value: r.CeilingRate(), Unit: "block-ops/s"},
	}
}

// RunFleet drives the pipeline with a simulated fleet's stream and
// measures its sustained rate and its freshness (DESIGN "Performance
// goals": freshness p99 ≤ 50 ms at half the measured raw block-op
// ceiling).
//
// First the ceiling: the stream is produced and ingested once while its
// write transactions are captured, and the captured transactions are
// written straight to a fresh etcd by one writer per partition (as in
// RunIngest); block operations per second is the ceiling.
//
// Then the measured run, on a fresh etcd and broker: an ingester and two
// indexd replicas, each with its own etcd client. A token-bucket pacer
// hands the records to the producer at the target rate (Fraction × the
// ceiling, in the stream's block operations). For each probed record,
// once the broker acknowledges it with its (partition, offset), a Lookup
// of the record's request on the second replica with a read-your-events
// barrier on that record returns exactly when the record is visible
// there; its freshness is the time from handing the record to the
// producer to that answer. The run ends when the first replica has
// applied the last record.
func RunFleet(ctx context.Context, cfg FleetConfig) (*FleetResult, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	s := cfg.Stream
	res := &FleetResult{Partitions: cfg.Partitions, Setup: cfg.Setup, Records: len(s.Records), Events: s.Events, BlockOps: s.BlockOps}
	if err := fleetCeiling(ctx, cfg, res); err != nil {
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
	if err := fleetRun(ctx, cfg, res); err != nil {
		return nil, err
	}
	return res, nil
}

// fleetCeiling measures the raw block-op ceiling of the stream.
func fleetCeiling(ctx context.Context, cfg FleetConfig, res *FleetResult) error {
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
	end, err := produceAll(ctx, prod, cfg.Stream, topic)
	prod.Close()
	if err != nil {
		return err
	}
	capture, err := captureRun(ctx, ingesterOptions{partitions: cfg.Partitions, windowOps: cfg.WindowOps, maxTxnOps: cfg.MaxTxnOps, inFlight: cfg.MaxTxnsInFlight,
		hashMode: cfg.Setup.hashMode(), log: cfg.Logger, brokers: kafka.ListenAddrs(), topic: topic}, cfg.Setup.etcd(), end)
	if err != nil {
		return err
	}
	node, err := startEtcd(ctx, cfg.Logger, cfg.Setup.etcd())
	if err != nil {
		return err
	}
	defer node.close()
	if res.CeilingTime, err = capture.rawWrite(ctx, node.cli, topic, cfg.MaxTxnsInFlight); err != nil {
		return err
	}
	res.CeilingOps, res.CeilingTxns = capture.blockOps(), capture.transactions()
	ops := capture.partitionOps()
	for p, d := range capture.writerTime {
		res.CeilingWriters = append(res.CeilingWriters, WriterShare{Partition: p, Ops: ops[p], Time: d})
	}
	slices.SortFunc(res.CeilingWriters, func(a, b WriterShare) int { return cmp.Compare(a.Partition, b.Partition) })
	return nil
}

// fleetRun is the measured run.
func fleetRun(ctx context.Context, cfg FleetConfig, res *FleetResult) (err error) {
	log := cfg.Logger
	const topic = "bench-fleet"
	kafka, err := startKafka(log, topic, cfg.Partitions)
	if err != nil {
		return err
	}
	defer kafka.Close()
	node, err := startEtcd(ctx, log, cfg.Setup.etcd())
	if err != nil {
		return err
	}
	defer node.close()
	// Stop order: the replicas and the ingester, then etcd and the broker
	// (the defers above).
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
		return err
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
	ir, err := startIngester(ctx, ingesterOptions{cli: icli, brokers: kafka.ListenAddrs(), topic: topic, partitions: cfg.Partitions, windowOps: cfg.WindowOps, maxTxnOps: cfg.MaxTxnOps, inFlight: cfg.MaxTxnsInFlight, log: log,
		hashMode: cfg.Setup.hashMode(), beforeTxn: func(_ context.Context, info ingester.TxnInfo) error {
			if info.Offset >= 0 {
				at := time.Now()
				commitMu.Lock()
				commits[info.Partition] = append(commits[info.Partition], commitAt{next: info.Offset, at: at})
				commitMu.Unlock()
			}
			return nil
		}})
	if err != nil {
		return err
	}
	stops = append(stops, ir.stop)
	var replicas [2]*client.Client
	for i := range replicas {
		r, err := startIndexd(ctx, node, log)
		if err != nil {
			return err
		}
		stops = append(stops, r.stop)
		c, err := client.New(r.srv.Addr().String(), client.WithTimeout(cfg.BarrierTimeout+10*time.Second))
		if err != nil {
			return err
		}
		stops = append(stops, c.Close)
		replicas[i] = c
	}
	if err := ir.waitAssigned(ctx); err != nil {
		return err
	}
	prod, err := newProducer(kafka.ListenAddrs(), log)
	if err != nil {
		return err
	}
	stops = append(stops, func() error { prod.Close(); return nil })

	var lim *rate.Limiter
	if res.TargetRate > 0 {
		lim = rate.NewLimiter(rate.Limit(res.TargetRate), max(cfg.Stream.MaxBlockOps, 1))
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
	sem := make(chan struct{}, cfg.MaxInFlight)
	pctx, cancel := context.WithCancel(ctx)
	// On every return: end the probes still waiting (an error cut the run
	// short) and wait for them, before the replicas and the producer stop.
	defer func() {
		cancel()
		probes.Wait()
	}()
	if cfg.Profile != nil {
		if err := pprof.StartCPUProfile(cfg.Profile); err != nil {
			return fmt.Errorf("bench: cpu profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	began := time.Now()
	for i := range cfg.Stream.Records {
		if err := failed(); err != nil {
			return err
		}
		select {
		case sem <- struct{}{}:
		default:
			res.Stalls++
			select {
			case sem <- struct{}{}:
			case <-pctx.Done():
				return pctx.Err()
			}
		}
		rec := &cfg.Stream.Records[i]
		if lim != nil {
			if err := lim.WaitN(pctx, rec.BlockOps); err != nil {
				return fmt.Errorf("bench: pacer: %w", err)
			}
		}
		probe := i%cfg.ProbeEvery == 0
		t0 := time.Now()
		prod.Produce(pctx, cfg.Stream.KafkaRecord(topic, i), func(kr *kgo.Record, err error) {
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
		return fmt.Errorf("bench: flushing the producer: %w", err)
	}
	// The end: the first replica has applied the last record of every
	// partition.
	mu.Lock()
	var barrier []client.PartitionOffset
	for p, off := range last {
		barrier = append(barrier, client.PartitionOffset{Topic: topic, Partition: p, Offset: off})
	}
	mu.Unlock()
	if _, err := replicas[0].Lookup(pctx, Model, cfg.Stream.Records[0].LookupKeys(cfg.Setup.hashMode()), client.WithBarrier(cfg.BarrierTimeout, barrier...)); err != nil {
		return fmt.Errorf("bench: waiting for the first replica: %w", err)
	}
	res.Elapsed = time.Since(began)
	probes.Wait()
	if err := failed(); err != nil {
		return err
	}
	if len(probed) == 0 {
		return errors.New("bench: no freshness probe completed")
	}
	var fresh, acks, sent, shown []time.Duration
	commitMu.Lock()
	defer commitMu.Unlock()
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
	return nil
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
