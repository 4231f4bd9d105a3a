package ingester

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/semaphore"

	"github.com/kvindex/kvindex/internal/backoff"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/logging"
)

// inputSlots is how many fetches a worker may have queued; QueueBytes is
// the bound that matters (a paced partition's fetches hold a record or
// two each, so a count of fetches would block the poll loop, and with it
// every other partition, long before a byte bound would).
const inputSlots = 1024

// maxPollRecords bounds the records one poll hands out, so the poll loop
// comes back to AllowRebalance (BlockRebalanceOnPoll holds rebalances off
// between a poll and it) after a bounded amount of work.
const maxPollRecords = 10_000

// heldRetry is how long a poll waits for new records while an input is
// held for a paused partition, before it tries to hand the input over
// again.
const heldRetry = 20 * time.Millisecond

// Fetch errors: a broker that answers every fetch with one (a topic
// deleted under the group: UNKNOWN_TOPIC_ID) would otherwise spin the
// poll loop and log tens of thousands of lines a second. The warning is
// logged at most once per fetchErrLogEvery, with the number of errors
// since the last one; a poll that brought errors and no records waits
// fetchErrBackoffMin, doubling up to fetchErrBackoffMax, before the next.
const (
	fetchErrLogEvery   = 10 * time.Second
	fetchErrBackoffMin = 10 * time.Millisecond
	fetchErrBackoffMax = time.Second
)

// fetchErrLog is the poll loop's rate limit on the fetch-error warning.
type fetchErrLog struct {
	last       time.Time // when the warning was last logged
	suppressed int       // errors since then, not logged
}

// warn logs err (of partition p) unless a warning went out less than
// fetchErrLogEvery before now, in which case it only counts it.
func (l *fetchErrLog) warn(log *slog.Logger, now time.Time, p int32, err error) {
	if !l.last.IsZero() && now.Sub(l.last) < fetchErrLogEvery {
		l.suppressed++
		return
	}
	log.Warn("fetch error", "partition", p, "err", err, "errors_not_logged", l.suppressed)
	l.last, l.suppressed = now, 0
}

// Ingester is one consumer-group member writing the index. Create it with
// New and start it with Run; it is single use.
type Ingester struct {
	cfg    Config
	log    *slog.Logger
	m      *metrics
	kv     pb.KVClient
	leases *leaseManager

	// runCtx is Run's context (canceled with the cause of a fatal error);
	// workers derive theirs from it.
	runCtx  context.Context
	fail    context.CancelCauseFunc
	cl      *kgo.Client // set by Run before polling; used by the poll loop only
	ready   atomic.Bool
	workers sync.WaitGroup

	mu    sync.Mutex
	parts map[int32]*partition

	// outage judges topic-wide outages for every partition's applier (set
	// by Run before the client starts, so before any claim).
	outage *outageWatch

	// assigned wakes the registration loop after an assignment change
	// (buffered, one slot; never closed).
	assigned chan struct{}
}

// partition is a running worker and the handles to stop it.
type partition struct {
	w    *worker
	from int64      // the offset fetching starts at
	in   chan input // sent to by the poll loop only; never closed
	// queued bounds the payload bytes of the inputs in in (QueueBytes):
	// the poll loop acquires an input's bytes before sending it, the
	// worker releases them when it takes the input.
	queued *semaphore.Weighted
	ctx    context.Context // ends when the worker stops
	drain  chan struct{}   // closed (once, by stop) to ask for a graceful stop
	once   sync.Once
	cancel context.CancelFunc
	done   chan struct{} // closed when the worker returned
	err    error         // the worker's result, set before done closes

	committed atomic.Int64 // stored next offset, for Kafka lag commits
	// stored is the next offset stored in etcd, from the start (the
	// offset fetching starts at): the lag gauge's base (updateLag).
	stored atomic.Int64
	kafka  int64 // last offset committed to Kafka (poll loop only)
	// held is the input the poll loop could not hand over without waiting
	// (the worker's queue was full); fetching the partition is paused
	// until it is handed over (poll loop only).
	held *input
}

// New validates cfg and returns an Ingester.
func New(cfg Config) (*Ingester, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	m, err := newMetrics(cfg.Registry)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger.With("component", "ingester", "topic", cfg.Topic, "group", cfg.Group)
	return &Ingester{
		cfg:    cfg,
		log:    log,
		m:      m,
		kv:     clientv3.RetryKVClient(cfg.Etcd),
		leases: newLeaseManager(&cfg, log, m),
		parts:  make(map[int32]*partition),
		// assigned has room for one wake-up of the registration loop.
		assigned: make(chan struct{}, 1),
	}, nil
}

// Ready reports nil once the ingester has joined its group and is
// consuming, else why not (for /readyz).
func (in *Ingester) Ready() error {
	if !in.ready.Load() {
		return errors.New("ingester: not consuming yet")
	}
	return nil
}

// Partitions returns the partitions this member owns, sorted.
func (in *Ingester) Partitions() []int32 {
	in.mu.Lock()
	defer in.mu.Unlock()
	out := make([]int32, 0, len(in.parts))
	for p := range in.parts {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// Run consumes until ctx ends or a fatal error (etcd unreachable while
// claiming, a BeforeTxn hook error), which it returns; a fenced partition
// is not fatal. Shutdown order: stop polling, stop the workers (their open
// windows are abandoned, a successor replays them), leave the group, stop
// renewing leases; meanwhile, from the moment ctx ends, the registration
// revokes its own lease (so ingesters/{ID} goes at once).
func (in *Ingester) Run(ctx context.Context) error {
	runCtx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	in.runCtx, in.fail = runCtx, fail

	// Before any partition is claimed: every worker's builders are sized
	// from MaxTxnOps.
	if err := in.sizeTxns(runCtx); err != nil {
		return err
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(in.cfg.Brokers...),
		kgo.ConsumerGroup(in.cfg.Group),
		kgo.ConsumeTopics(in.cfg.Topic),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.FetchMaxWait(in.cfg.FetchMaxWait),
		kgo.SessionTimeout(in.cfg.SessionTimeout),
		kgo.RebalanceTimeout(in.cfg.RebalanceTimeout),
		kgo.HeartbeatInterval(min(3*time.Second, in.cfg.SessionTimeout/3)),
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
		kgo.OnPartitionsAssigned(in.onAssigned),
		kgo.OnPartitionsRevoked(in.onRevoked),
		kgo.OnPartitionsLost(in.onLost),
		kgo.AdjustFetchOffsetsFn(in.adjustOffsets),
		// franz-go names the group itself; the client's lines carry their
		// own component instead of the ingester's.
		kgo.WithLogger(logging.Kgo(in.cfg.Logger.With("component", "kafka-client", "topic", in.cfg.Topic))),
	}
	in.outage = newOutageWatch(in.cfg.Clock, in.cfg.OutageThreshold)
	in.outage.onEnds = in.updateLag
	in.outage.onEnd = func(start, end time.Time) {
		in.m.outages.WithLabelValues("topic").Inc()
		in.m.outageSeconds.Add(end.Sub(start).Seconds())
		in.log.Warn("topic outage ended: no record reached the topic for longer than --outage-threshold; that time aged nobody, and every endpoint gets --outage-grace",
			"silent_from", start, "until", end, "seconds", end.Sub(start).Seconds(), "grace", in.cfg.OutageGrace)
	}
	cl, err := kgo.NewClient(append(opts, in.cfg.KafkaOptions...)...)
	if err != nil {
		return fmt.Errorf("ingester: kafka client: %w", err)
	}
	in.cl = cl

	// The end offsets of every partition, mine or not, are the outage
	// watch's view of the whole topic.
	stopEnds := background(runCtx, func(ctx context.Context) {
		every := min(max(in.cfg.OutageThreshold/5, 10*time.Millisecond), time.Second)
		in.outage.watchEnds(ctx, kadm.NewClient(cl), in.cfg.Topic, every, max(every, in.cfg.OutageThreshold/2))
	})
	// The keep-alive outlives ctx: it stops only after the workers and
	// the group.
	stopKeeper := background(context.WithoutCancel(ctx), func(ctx context.Context) { _ = in.leases.run(ctx) })
	stopReg := background(runCtx, in.register)

	in.poll(runCtx)
	stopEnds()

	// Shutdown: workers first (no more writes), then the group, then the
	// keepalives.
	in.stopAll()
	in.leaveGroup(cl)
	in.stopAll() // a revoke during close may not have run
	in.workers.Wait()
	stopKeeper()
	stopReg()
	in.ready.Store(false)
	if cause := context.Cause(runCtx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return nil
}

// leaveGroup leaves the consumer group and closes the client, giving the
// leave at most SessionTimeout: past it the broker has expired the member
// anyway, and a broker that stopped answering would otherwise hold the
// stop for Kafka's request timeouts (70 s in a fault attack, longer than
// a pod's usual termination grace period).
func (in *Ingester) leaveGroup(cl *kgo.Client) {
	cl.AllowRebalance()
	ctx, cancel := context.WithTimeout(context.Background(), in.cfg.SessionTimeout)
	defer cancel()
	if err := cl.LeaveGroupContext(ctx); err != nil && ctx.Err() != nil {
		in.log.Warn("leaving the consumer group timed out; the broker expires the member after its session timeout", "group", in.cfg.Group, "timeout", in.cfg.SessionTimeout)
	}
	cl.Close()
}

// background runs fn in a goroutine of its own on a context derived from
// parent. The returned stop cancels that context and waits for fn to
// return; it must be called exactly once.
func background(parent context.Context, fn func(context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(parent)
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

// poll is the consume loop: it hands each partition's records to its
// worker, in order, until ctx ends. It never waits for a worker: when a
// worker's queue is full (QueueBytes, or its input slots), the partition's
// records are held and its fetching paused until the worker has room, so
// a stalled partition neither stops the others nor keeps the loop from
// allowing rebalances (a member that does not is kicked from the group).
func (in *Ingester) poll(ctx context.Context) {
	lastCommit := time.Now()
	var errLog fetchErrLog
	errWait := backoff.New(fetchErrBackoffMin, fetchErrBackoffMax, nil)
	for {
		pctx, cancel := ctx, context.CancelFunc(func() {})
		if in.offerHeld(ctx) {
			pctx, cancel = context.WithTimeout(ctx, heldRetry)
		}
		fs := in.cl.PollRecords(pctx, maxPollRecords)
		cancel()
		if ctx.Err() != nil || fs.IsClientClosed() {
			in.cl.AllowRebalance()
			return
		}
		fetchErrs := 0
		fs.EachError(func(topic string, p int32, err error) {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return // the poll's own deadline (heldRetry) or the stop
			}
			fetchErrs++
			in.m.fetchErrors.Inc()
			if errors.Is(err, kerr.OffsetOutOfRange) && topic == in.cfg.Topic {
				in.outOfRange(ctx, p)
				return
			}
			if errors.Is(err, kerr.InvalidSessionTimeout) {
				// A configuration error no retry fixes.
				in.fail(fmt.Errorf("ingester: joining group %s: %w (SessionTimeout %v is outside what the brokers allow)", in.cfg.Group, err, in.cfg.SessionTimeout))
				return
			}
			errLog.warn(in.log, time.Now(), p, err)
		})
		fs.EachPartition(func(fp kgo.FetchTopicPartition) {
			if len(fp.Records) == 0 || fp.Topic != in.cfg.Topic {
				return
			}
			in.mu.Lock()
			part := in.parts[fp.Partition]
			in.mu.Unlock()
			if part == nil {
				return
			}
			in.deliver(ctx, part, input{recs: fp.Records, hwm: fp.HighWatermark, reset: -1})
		})
		if time.Since(lastCommit) >= time.Second {
			in.commitKafka(ctx, false)
			lastCommit = time.Now()
		}
		in.cl.AllowRebalance()
		if fetchErrs == 0 || fs.NumRecords() > 0 {
			errWait.Reset()
			continue
		}
		if backoff.Sleep(ctx, nil, errWait.Next()) != nil {
			return
		}
	}
}

// deliver hands x to part's worker, or holds it and pauses the partition
// when the worker has no room. Records of a partition already holding an
// input (fetched before the pause took effect) join the held input, in
// order.
func (in *Ingester) deliver(ctx context.Context, part *partition, x input) {
	if h := part.held; h != nil {
		h.recs = append(h.recs, x.recs...)
		h.hwm = max(h.hwm, x.hwm)
		return
	}
	if in.offer(ctx, part, &x) {
		return
	}
	part.held = &x
	in.cl.PauseFetchPartitions(map[string][]int32{in.cfg.Topic: {part.w.p.Partition}})
}

// offer hands x to part's worker if its queue has room now, and reports
// whether x is taken care of (handed over, or the worker is gone and its
// successor refetches).
func (in *Ingester) offer(ctx context.Context, part *partition, x *input) bool {
	n := min(fetchBytes(x.recs), int64(in.cfg.QueueBytes))
	if !part.queued.TryAcquire(n) {
		return false
	}
	x.bytes = n
	select {
	case part.in <- *x:
		return true
	case <-part.done:
		return true
	case <-ctx.Done():
		return true
	default:
		part.queued.Release(n) // every input slot is taken
		return false
	}
}

// offerHeld tries to hand every held input over, resuming the partitions
// whose input was taken, and reports whether some input is still held.
func (in *Ingester) offerHeld(ctx context.Context) bool {
	in.mu.Lock()
	var held []*partition
	for _, part := range in.parts {
		if part.held != nil {
			held = append(held, part)
		}
	}
	in.mu.Unlock()
	still := false
	for _, part := range held {
		if !in.offer(ctx, part, part.held) {
			still = true
			continue
		}
		part.held = nil
		select {
		case <-part.done: // stopped (fenced, say): stays paused
		default:
			in.cl.ResumeFetchPartitions(map[string][]int32{in.cfg.Topic: {part.w.p.Partition}})
		}
	}
	return still
}

// outOfRange restarts a partition whose fetch offset left the log while
// consuming (retention passed it): the worker drops the partition's
// endpoints and stores the log start, and fetching resumes there.
func (in *Ingester) outOfRange(ctx context.Context, p int32) {
	in.mu.Lock()
	part := in.parts[p]
	in.mu.Unlock()
	if part == nil {
		return
	}
	if part.held != nil {
		// Records before the offset that left the log: the restart
		// replays from the log start instead.
		part.held = nil
		in.cl.ResumeFetchPartitions(map[string][]int32{in.cfg.Topic: {p}})
	}
	starts, err := kadm.NewClient(in.cl).ListStartOffsets(ctx, in.cfg.Topic)
	if err == nil {
		err = starts.Error()
	}
	o, ok := starts.Lookup(in.cfg.Topic, p)
	if err != nil || !ok {
		in.log.Error("listing the log start after an out-of-range fetch failed", "partition", p, "err", err)
		return
	}
	select {
	case part.in <- input{reset: o.Offset}:
	case <-part.done:
		return
	case <-ctx.Done():
		return
	}
	in.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{in.cfg.Topic: {p: {Epoch: -1, Offset: o.Offset}}})
}

// commitKafka commits the stored offsets to Kafka, for lag monitoring
// only (the etcd offset is the truth). sync waits for the commit.
func (in *Ingester) commitKafka(ctx context.Context, sync bool, only ...int32) {
	offs := map[int32]kgo.EpochOffset{}
	in.mu.Lock()
	for p, part := range in.parts {
		if len(only) > 0 && !slices.Contains(only, p) {
			continue
		}
		if c := part.committed.Load(); c >= 0 && c != part.kafka {
			offs[p] = kgo.EpochOffset{Epoch: -1, Offset: c}
			part.kafka = c
		}
	}
	in.mu.Unlock()
	if len(offs) == 0 {
		return
	}
	all := map[string]map[int32]kgo.EpochOffset{in.cfg.Topic: offs}
	done := func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, _ *kmsg.OffsetCommitResponse, err error) {
		if err != nil && ctx.Err() == nil {
			in.log.Debug("committing offsets to Kafka failed (lag monitoring only)", "err", err)
		}
	}
	if sync {
		in.cl.CommitOffsetsSync(ctx, all, done)
	} else {
		in.cl.CommitOffsets(ctx, all, done)
	}
}

// adjustOffsets starts each newly assigned partition at the offset stored
// in etcd, not at Kafka's committed offset.
func (in *Ingester) adjustOffsets(_ context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for p := range offsets[in.cfg.Topic] {
		if part := in.parts[p]; part != nil {
			offsets[in.cfg.Topic][p] = kgo.NewOffset().At(part.from).WithEpoch(-1)
		}
	}
	return offsets, nil
}

func (in *Ingester) onAssigned(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
	ctx := in.runCtx
	if ps := assigned[in.cfg.Topic]; len(ps) > 0 {
		if err := in.claim(ctx, cl, ps); err != nil {
			if ctx.Err() == nil {
				in.log.Error("claiming partitions failed", "partitions", ps, "err", err)
				in.fail(err)
			}
			return
		}
	}
	in.ready.Store(true)
	in.assignmentChanged()
}

func (in *Ingester) onRevoked(_ context.Context, cl *kgo.Client, revoked map[string][]int32) {
	ps := revoked[in.cfg.Topic]
	if len(ps) == 0 {
		return
	}
	graceful := in.runCtx.Err() == nil
	in.stop(ps, graceful)
	if graceful {
		ctx, cancel := context.WithTimeout(in.runCtx, in.cfg.RebalanceTimeout/4)
		in.commitKafka(ctx, true, ps...)
		cancel()
	}
	in.forget(ps)
	in.assignmentChanged()
}

func (in *Ingester) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	ps := lost[in.cfg.Topic]
	in.stop(ps, false)
	in.forget(ps)
	in.assignmentChanged()
}

func (in *Ingester) assignmentChanged() {
	ps := in.Partitions()
	in.m.partitions.Set(float64(len(ps)))
	// Wake the registration loop; one pending wake-up is enough, it reads
	// the current assignment.
	select {
	case in.assigned <- struct{}{}:
	default:
	}
	if in.cfg.OnAssigned != nil {
		in.cfg.OnAssigned(ps)
	}
}

// stop stops the workers of ps: gracefully (write what was queued, within
// half the rebalance timeout) or at once.
func (in *Ingester) stop(ps []int32, graceful bool) {
	in.mu.Lock()
	var parts []*partition
	for _, p := range ps {
		if part := in.parts[p]; part != nil {
			parts = append(parts, part)
		}
	}
	in.mu.Unlock()
	for _, part := range parts {
		if graceful {
			part.once.Do(func() { close(part.drain) })
		} else {
			part.cancel()
		}
	}
	deadline := time.NewTimer(in.cfg.RebalanceTimeout / 2)
	defer deadline.Stop()
	for _, part := range parts {
		select {
		case <-part.done:
		case <-deadline.C:
			in.log.Warn("a revoked partition did not finish its window in time; abandoning it", "partition", part.w.p.Partition)
			part.cancel()
			<-part.done
		}
		part.cancel()
	}
}

// stopAll stops every worker at once.
func (in *Ingester) stopAll() {
	in.mu.Lock()
	ps := make([]int32, 0, len(in.parts))
	for p := range in.parts {
		ps = append(ps, p)
	}
	in.mu.Unlock()
	in.stop(ps, false)
	in.forget(ps)
}

func (in *Ingester) forget(ps []int32) {
	in.mu.Lock()
	for _, p := range ps {
		delete(in.parts, p)
	}
	in.mu.Unlock()
}

// start runs w, whose partition is to be fetched from offset from.
func (in *Ingester) start(cl *kgo.Client, w *worker, from int64) {
	ctx, cancel := context.WithCancel(in.runCtx)
	part := &partition{w: w, from: from, in: make(chan input, inputSlots), queued: semaphore.NewWeighted(int64(in.cfg.QueueBytes)),
		ctx: ctx, drain: make(chan struct{}), cancel: cancel, done: make(chan struct{})}
	w.dequeued = func(n int64) { part.queued.Release(n) }
	part.committed.Store(-1)
	part.stored.Store(from)
	part.kafka = -1
	w.onCommit = func(next int64) {
		part.committed.Store(next)
		part.stored.Store(next)
	}
	in.mu.Lock()
	in.parts[w.p.Partition] = part
	in.mu.Unlock()
	in.workers.Add(1)
	go func() {
		defer in.workers.Done()
		defer close(part.done)
		defer cancel()
		err := w.run(ctx, part.in, part.drain)
		part.err = err
		var hook *hookError
		switch {
		case err == nil || errors.Is(err, context.Canceled):
		case errors.Is(err, ErrFenced):
			in.log.Error("partition fenced: another ingester claimed it; stopping its worker", "partition", w.p.Partition)
			cl.PauseFetchPartitions(map[string][]int32{in.cfg.Topic: {w.p.Partition}})
		case errors.As(err, &hook):
			in.fail(hook.err)
		default:
			in.log.Error("partition worker failed", "partition", w.p.Partition, "err", err)
			in.fail(err)
		}
	}()
}

// keyspaceLease renders a lease ID as etcdctl does, for logs.
func keyspaceLease(id clientv3.LeaseID) string { return keyspace.LeaseID(id).String() }

// fetchBytes approximates the memory a fetch's records hold: their keys,
// values and headers.
func fetchBytes(recs []*kgo.Record) int64 {
	var n int64
	for _, r := range recs {
		n += int64(len(r.Key) + len(r.Value))
		for _, h := range r.Headers {
			n += int64(len(h.Key) + len(h.Value))
		}
	}
	return n
}

// updateLag sets kvindex_ingester_lag_records of every owned partition
// from a listing of the topic's end offsets: what the partition has that
// etcd does not. The listing runs every second whatever the workers do, so
// the lag of a worker stuck retrying etcd grows as records arrive (its own
// updates come only when it takes fetched records).
func (in *Ingester) updateLag(ends map[int32]int64) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for p, part := range in.parts {
		end, ok := ends[p]
		if !ok || part.ctx.Err() != nil {
			continue // a stopping worker deletes its gauge
		}
		in.m.lag.WithLabelValues(partitionLabel(p)).Set(float64(max(end-part.stored.Load(), 0)))
	}
}
