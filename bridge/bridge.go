package bridge

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/jonboulle/clockwork"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kvindex/kvindex/internal/contract"
	"github.com/kvindex/kvindex/internal/logging"
)

// Bridge forwards KV-event batches from ZMQ PUB sockets to Kafka: one
// engine endpoint's, which it dials (the dial mode, described here), or
// those of every engine that connects to the endpoint it binds
// (Config.Listen, the bind mode: bind.go). Create it with New and call Run
// once.
//
// Goroutines, all started and waited for by Run: the SUB reader (dials the
// engine, reads its PUB socket, reconnects), the sequencer (Run's own
// goroutine: orders batches, heals gaps from the replay socket, sends
// heartbeats) and the producer (hands records to the Kafka client). Two
// bounded channels join them: in (reader → sequencer, closed by the
// reader) and out (sequencer → producer, closed by the sequencer).
//
// Shutdown order, when Run's context ends: the reader closes its
// connection and in; the sequencer produces what it had received that
// continues the stream and closes out; the producer finishes; the Kafka
// client flushes (bounded by FlushTimeout); then Run probes the engine for
// GracePeriod and produces a goodbye only if the engine went away; then
// it closes the Kafka client and returns.
type Bridge struct {
	cfg   Config
	log   *slog.Logger
	clock clockwork.Clock
	m     *metrics

	// Dial mode: addr is the host:port of the PUB socket, one the single
	// endpoint (Config.Pod, Model, DPRank, ReplayEndpoint).
	addr string
	one  *stream
	// Bind mode (Config.Listen): topics parses publishers' topics,
	// replay their replay addresses, listening is set once the listener is
	// bound, boundAddr is its address.
	topics    topicPattern
	replay    replayPattern
	listening atomic.Bool
	boundAddr atomic.Pointer[string]

	started   atomic.Bool
	connected atomic.Bool // dial mode: the PUB socket is connected
	caughtUp  atomic.Bool // dial mode: the catch-up after the latest connection is done
	client    atomic.Pointer[kgo.Client]
	queues    atomic.Pointer[queues]
	// cells routes records by the cell map (Config.Cells); nil without.
	cells *cellRouter

	fatalMu sync.Mutex
	fatal   error

	// refusedMu guards refused, the records Kafka refused as too large
	// (MESSAGE_TOO_LARGE) in the order their callbacks ran, which the
	// produce loop retries one by one (retryRefused); refusedDone is set
	// once it has ended, after which a refusal is counted as lost.
	// refusedCh wakes the produce loop.
	refusedMu   sync.Mutex
	refused     []refusal
	refusedDone bool
	refusedCh   chan struct{}

	// subMu guards sub, the current PUB connection, so the sequencer can
	// force a reconnection (dropSub).
	subMu sync.Mutex
	sub   *zconn
}

// queues are Run's two channels, kept for the queue-depth gauge.
type queues struct {
	in  chan inEvent
	out chan *kgo.Record
}

// New validates cfg and registers the bridge's metrics. It does no I/O.
func New(cfg Config) (*Bridge, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	b := &Bridge{
		cfg:       cfg,
		log:       cfg.Logger,
		clock:     cfg.Clock,
		refusedCh: make(chan struct{}, 1),
	}
	if b.log == nil {
		b.log = logging.Discard()
	}
	if b.clock == nil {
		b.clock = clockwork.NewRealClock()
	}
	if cfg.Listen != "" {
		b.topics, _ = parseTopicPattern(cfg.TopicPattern)
		b.replay, _ = parseReplayPattern(cfg.ReplayPattern)
	} else {
		b.log = b.log.With("pod", cfg.Pod, "dp_rank", cfg.DPRank)
		b.addr, _ = dialAddr(cfg.Endpoint)
		var replayAddr string
		if cfg.ReplayEndpoint != "" {
			replayAddr, _ = dialAddr(cfg.ReplayEndpoint)
		}
		b.one = newStream(cfg.Pod, cfg.Model, cfg.DPRank, replayAddr, b.log)
		b.one.drop = b.dropSub
		b.one.state = func(connected, caughtUp bool) {
			b.connected.Store(connected)
			b.caughtUp.Store(caughtUp)
		}
	}
	var err error
	b.m, err = newMetrics(cfg.Registry,
		func() float64 {
			if cl := b.client.Load(); cl != nil {
				return float64(cl.BufferedProduceRecords())
			}
			return 0
		},
		func() float64 {
			if cl := b.client.Load(); cl != nil {
				return float64(cl.BufferedProduceBytes())
			}
			return 0
		},
		func() float64 {
			if q := b.queues.Load(); q != nil {
				return float64(len(q.in) + len(q.out))
			}
			return 0
		},
	)
	if err != nil {
		return nil, fmt.Errorf("bridge: registering metrics: %w", err)
	}
	return b, nil
}

// Ready reports whether the bridge is forwarding. Dial mode: nil while
// the engine's PUB socket is connected and the catch-up after connecting
// is done. Bind mode: nil while the listener is bound (publishers come and
// go; each pod's state is in the metrics). Otherwise an error wrapping
// ErrNotReady, or the fatal produce error.
func (b *Bridge) Ready() error {
	if err := b.fatalErr(); err != nil {
		return err
	}
	if b.cfg.Listen != "" {
		if !b.listening.Load() {
			return fmt.Errorf("%w: not listening on %s", ErrNotReady, b.cfg.Listen)
		}
		return nil
	}
	switch {
	case !b.connected.Load():
		return fmt.Errorf("%w: engine PUB socket %s not connected", ErrNotReady, b.cfg.Endpoint)
	case !b.caughtUp.Load():
		return fmt.Errorf("%w: catching up from the replay socket", ErrNotReady)
	}
	return nil
}

// Addr is the bind mode's listening address, "tcp://HOST:PORT" (the port
// the system chose when Listen asked for port 0), once Ready; "" before,
// and always in the dial mode.
func (b *Bridge) Addr() string {
	if p := b.boundAddr.Load(); p != nil {
		return *p
	}
	return ""
}

// Run forwards batches until ctx ends, then shuts down in the order the
// type's doc gives. It returns nil after a clean shutdown; an error
// wrapping ErrProduce when Kafka refused a record for good (Run stops at
// once then, without a goodbye); an error when the bind mode cannot
// listen; or the error of the final flush or goodbye. Run may be called
// once.
func (b *Bridge) Run(ctx context.Context) error {
	if !b.started.CompareAndSwap(false, true) {
		return ErrAlreadyRun
	}
	common := append([]kgo.Opt{
		kgo.ClientID("kvindex-bridge"),
		// acks=all with the idempotent producer (franz-go's default): no
		// duplicates or reordering from retries, records retried without
		// limit while the bridge lives. The default partitioner hashes the
		// key, so one pod's records stay in one partition, in order.
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.MaxBufferedRecords(b.cfg.MaxBufferedRecords),
		kgo.MaxBufferedBytes(b.cfg.MaxBufferedBytes),
		kgo.ProducerBatchMaxBytes(int32(b.cfg.MaxRecordBytes + recordOverhead)),
		kgo.WithLogger(logging.Kgo(b.log.With("component", "kafka-producer"))),
	}, b.cfg.KafkaOptions...)
	opts := append([]kgo.Opt{kgo.SeedBrokers(b.cfg.Brokers...)}, common...)
	if b.cfg.Topic != "" {
		opts = append(opts, kgo.DefaultProduceTopic(b.cfg.Topic))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("bridge: Kafka client: %w", err)
	}
	b.client.Store(cl)
	defer cl.Close()
	if b.cfg.Cells != nil {
		b.cells = newCellRouter(b, b.cfg.Cells, common, cl)
		defer b.cells.close()
	}

	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	// Records live in the Kafka client under prodCtx, which SIGTERM does
	// not cancel: only a shutdown flush that runs out of time does.
	prodCtx, cancelProd := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelProd()

	q := &queues{in: make(chan inEvent, b.cfg.QueueSize), out: make(chan *kgo.Record, b.cfg.QueueSize)}
	b.queues.Store(q)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		b.produceLoop(prodCtx, cl, q.out, cancelRun)
	}()
	// drainCtx bounds what the shutdown still produces from received
	// batches: it ends with the shutdown flush's deadline.
	drainCtx, cancelDrain := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelDrain()
	var flushCtx context.Context
	cancelFlush := context.CancelFunc(func() {})
	defer func() { cancelFlush() }()
	startFlush := func() {
		flushCtx, cancelFlush = context.WithTimeout(context.WithoutCancel(ctx), b.cfg.FlushTimeout)
		context.AfterFunc(flushCtx, cancelDrain)
		context.AfterFunc(flushCtx, cancelProd)
	}

	if b.cfg.Listen != "" {
		b.log.Info("bridge started in bind mode", "listen", b.cfg.Listen, "topic_pattern", b.cfg.TopicPattern,
			"replay_pattern", b.cfg.ReplayPattern, "topic", b.cfg.Topic)
		err := b.runBind(runCtx, drainCtx, startFlush, q.out)
		if flushCtx == nil {
			startFlush()
		}
		close(q.out)
		wg.Wait()
		flushErr := b.flush(flushCtx, cl)
		if ferr := b.fatalErr(); ferr != nil {
			return ferr
		}
		if err != nil {
			return err
		}
		if flushErr != nil {
			b.log.Warn("flush at shutdown did not finish", "err", flushErr, "unsent", cl.BufferedProduceRecords())
		}
		// No goodbye: a central bridge stopping says nothing about the
		// pods, which the next bridge catches up by replay or resync.
		return flushErr
	}

	wg.Add(1)
	go func() {
		defer wg.Done()
		b.readLoop(runCtx, q.in)
	}()
	s := &sequencer{b: b, st: b.one, out: q.out}
	b.log.Info("bridge started", "endpoint", b.cfg.Endpoint, "replay_endpoint", b.cfg.ReplayEndpoint, "topic", b.cfg.Topic, "model", b.cfg.Model)
	s.run(runCtx, q.in)

	// Shutdown.
	b.connected.Store(false)
	b.m.connected.Set(0)
	startFlush()
	if b.fatalErr() == nil {
		s.drain(drainCtx, q.in)
	} else {
		for range q.in {
		}
	}
	close(q.out)
	wg.Wait()
	flushErr := b.flush(flushCtx, cl)
	if err := b.fatalErr(); err != nil {
		return err
	}
	if flushErr != nil {
		b.log.Warn("flush at shutdown did not finish", "err", flushErr, "unsent", cl.BufferedProduceRecords())
	}
	if b.cfg.GracePeriod == 0 {
		return flushErr
	}
	if !b.engineGone(context.WithoutCancel(ctx)) {
		b.m.shutdowns.WithLabelValues(outcomeNoGoodbyeStillThere).Inc()
		b.log.Info("engine still there after the grace period: sidecar-only restart, no goodbye", "grace_period", b.cfg.GracePeriod)
		return flushErr
	}
	b.m.shutdowns.WithLabelValues(outcomeGoodbyeEngineGone).Inc()
	b.log.Info("engine gone, producing goodbye")
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.FlushTimeout)
	defer cancel()
	start := time.Now()
	goodbye, gcl := b.one.controlRecord(contract.KindGoodbye), cl
	if b.cells != nil {
		var ok bool
		if gcl, ok = b.cells.place(gctx, goodbye); !ok {
			return errors.Join(flushErr, b.fatalErr())
		}
	}
	if err := b.produceBounded(gctx, gcl, goodbye); err != nil {
		b.m.lost.WithLabelValues(lostShutdown).Inc()
		return fmt.Errorf("%w: goodbye: %v", ErrProduce, err)
	}
	b.m.produceSeconds.Observe(time.Since(start).Seconds())
	b.m.produced.WithLabelValues(contract.KindGoodbye).Inc()
	return flushErr
}

// flush flushes cl, and every cell's client with a cell map.
func (b *Bridge) flush(ctx context.Context, cl *kgo.Client) error {
	if b.cells != nil {
		return b.cells.flush(ctx)
	}
	return cl.Flush(ctx)
}

// produceBounded produces r and waits for its acknowledgement until ctx
// ends. franz-go's ProduceSync is not enough: a record already buffered is
// failed by its context only when a produce request is built for it, so
// with every broker unreachable (no connection, no request) ProduceSync
// waits for as long as the client retries, which is forever (a
// goodbye would outlive a 5 s --flush-timeout by minutes). The record left
// behind is failed when Run closes the client.
func (b *Bridge) produceBounded(ctx context.Context, cl *kgo.Client, r *kgo.Record) error {
	done := make(chan error, 1)
	cl.Produce(ctx, r, func(_ *kgo.Record, err error) { done <- err })
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// produceLoop hands every record of out to the Kafka client in order.
// Produce blocks while the client's buffer is full: that is the bridge's
// backpressure. A record Kafka refuses for good cancels the run, except
// for MESSAGE_TOO_LARGE, which retryRefused resolves record by record.
func (b *Bridge) produceLoop(ctx context.Context, cl *kgo.Client, out <-chan *kgo.Record, cancelRun context.CancelFunc) {
	defer func() {
		b.refusedMu.Lock()
		b.refusedDone = true
		lost := len(b.refused)
		b.refused = nil
		b.refusedMu.Unlock()
		b.m.lost.WithLabelValues(lostShutdown).Add(float64(lost))
	}()
	for {
		select {
		case r, ok := <-out:
			if !ok {
				// Let what is in flight settle, and retry what it
				// refuses, before the shutdown flush.
				for {
					if !b.hasRefused() && (b.flush(ctx, cl) != nil || !b.hasRefused()) {
						return
					}
					b.retryRefused(ctx, cl, cancelRun)
				}
			}
			if b.hasRefused() {
				b.retryRefused(ctx, cl, cancelRun)
			}
			b.hand(ctx, cl, r, cancelRun)
		case <-b.refusedCh:
			b.retryRefused(ctx, cl, cancelRun)
		}
	}
}

// hand gives r to its Kafka client, which reports the outcome to a
// callback.
func (b *Bridge) hand(ctx context.Context, cl *kgo.Client, r *kgo.Record, cancelRun context.CancelFunc) {
	kind := recordKind(r)
	if b.cells != nil {
		var ok bool
		if cl, ok = b.cells.place(ctx, r); !ok {
			if b.fatalErr() != nil {
				cancelRun()
			}
			return
		}
	}
	start := time.Now()
	cl.Produce(ctx, r, func(r *kgo.Record, err error) {
		if err == nil {
			b.m.produceSeconds.Observe(time.Since(start).Seconds())
			b.m.produced.WithLabelValues(kind).Inc()
			return
		}
		if ctx.Err() != nil {
			b.m.lost.WithLabelValues(lostShutdown).Inc()
			return
		}
		if errors.Is(err, kerr.MessageTooLarge) {
			b.refuse(refusal{r: r, cl: cl, kind: kind, err: err})
			return
		}
		b.setFatal(fmt.Errorf("%w: %s record for topic %s: %v", ErrProduce, kind, r.Topic, err))
		cancelRun()
	})
}

// refusal is a record Kafka refused with MESSAGE_TOO_LARGE, and the
// client it went through.
type refusal struct {
	r    *kgo.Record
	cl   *kgo.Client
	kind string
	err  error
}

// refuse queues a MESSAGE_TOO_LARGE refusal for the produce loop. It runs
// in the Kafka client's callback, so it never blocks.
func (b *Bridge) refuse(f refusal) {
	b.refusedMu.Lock()
	done := b.refusedDone
	if !done {
		b.refused = append(b.refused, f)
	}
	b.refusedMu.Unlock()
	if done {
		b.m.lost.WithLabelValues(lostShutdown).Inc()
		return
	}
	select {
	case b.refusedCh <- struct{}{}:
	default:
	}
}

func (b *Bridge) hasRefused() bool {
	b.refusedMu.Lock()
	defer b.refusedMu.Unlock()
	return len(b.refused) > 0
}

// retryRefused resolves the records Kafka refused with MESSAGE_TOO_LARGE.
// Kafka refuses a whole record batch when it is over the topic's
// max.message.bytes, so one batch too large for the broker (a topic whose
// limit is below MaxRecordBytes + 2 KiB) takes the good records produced
// with it down too. The produce loop, the only producer, stops handing
// records on, lets what is in flight settle (its refusals join the list
// in order) and produces each refused record again alone, waiting for
// each: one accepted alone was only in the same batch; a batch refused
// alone is too large for this topic and takes MaxRecordBytes' path
// (skipped, counted as record_too_large, logged, and a resync produced in
// its place, so the ingester does not assume continuity across it). A
// control record refused alone, or another error, stops the run as any
// refusal for good does. Records handed on while the refused request was
// in flight are in Kafka before the retried ones: the ingester's sequence
// rules then drop the endpoint's blocks (a seq gap, a seq at or below its
// last), never keep ghosts.
func (b *Bridge) retryRefused(ctx context.Context, cl *kgo.Client, cancelRun context.CancelFunc) {
	_ = b.flush(ctx, cl)
	for {
		b.refusedMu.Lock()
		list := b.refused
		b.refused = nil
		b.refusedMu.Unlock()
		if len(list) == 0 {
			return
		}
		for _, f := range list {
			if ctx.Err() != nil || b.fatalErr() != nil {
				b.m.lost.WithLabelValues(lostShutdown).Inc()
				continue
			}
			b.retryAlone(ctx, f, cancelRun)
		}
	}
}

// retryAlone produces one refused record alone (see retryRefused).
func (b *Bridge) retryAlone(ctx context.Context, f refusal, cancelRun context.CancelFunc) {
	start := time.Now()
	err := b.produceBounded(ctx, f.cl, f.r)
	switch {
	case err == nil:
		b.m.produceSeconds.Observe(time.Since(start).Seconds())
		b.m.produced.WithLabelValues(f.kind).Inc()
		b.log.Info("record refused as too large with others produced alone", "kind", f.kind, "pod", string(f.r.Key), "seq", string(header(f.r, contract.HeaderSeq)))
		return
	case ctx.Err() != nil:
		b.m.lost.WithLabelValues(lostShutdown).Inc()
		return
	case !errors.Is(err, kerr.MessageTooLarge) || f.kind != "batch":
		b.setFatal(fmt.Errorf("%w: %s record for topic %s: %v (first refusal: %v)", ErrProduce, f.kind, f.r.Topic, err, f.err))
		cancelRun()
		return
	}
	b.m.skipped.WithLabelValues(skipRecordTooLarge).Inc()
	b.log.Warn("batch refused by Kafka as too large (the topic's max.message.bytes is below it): skipped, producing resync",
		"pod", string(f.r.Key), "seq", string(header(f.r, contract.HeaderSeq)), "bytes", len(f.r.Value), "topic", f.r.Topic, "err", err)
	resync := &kgo.Record{Topic: f.r.Topic, Key: f.r.Key, Headers: []kgo.RecordHeader{
		{Key: contract.HeaderModel, Value: header(f.r, contract.HeaderModel)},
		{Key: contract.HeaderDPRank, Value: header(f.r, contract.HeaderDPRank)},
		{Key: contract.HeaderKind, Value: []byte(contract.KindResync)},
	}}
	b.m.resyncs.WithLabelValues(reasonRecordTooLarge).Inc()
	start = time.Now()
	switch err := b.produceBounded(ctx, f.cl, resync); {
	case err == nil:
		b.m.produceSeconds.Observe(time.Since(start).Seconds())
		b.m.produced.WithLabelValues(contract.KindResync).Inc()
	case ctx.Err() != nil:
		b.m.lost.WithLabelValues(lostShutdown).Inc()
	default:
		b.setFatal(fmt.Errorf("%w: resync record for topic %s: %v", ErrProduce, f.r.Topic, err))
		cancelRun()
	}
}

func (b *Bridge) setFatal(err error) {
	b.fatalMu.Lock()
	defer b.fatalMu.Unlock()
	if b.fatal == nil {
		b.fatal = err
		b.log.Error("produce failed for good, stopping", "err", err)
	}
}

func (b *Bridge) fatalErr() error {
	b.fatalMu.Lock()
	defer b.fatalMu.Unlock()
	return b.fatal
}

// readLoop owns the PUB connection: dial with backoff, subscribe, read
// until the connection fails, report each step on in, redial. It closes
// in when ctx ends.
func (b *Bridge) readLoop(ctx context.Context, in chan<- inEvent) {
	defer close(in)
	backoff := b.cfg.ReconnectBackoff
	failures := 0
	for ctx.Err() == nil {
		c, err := dialZMTP(ctx, b.addr, zmq4.Sub, b.cfg.DialTimeout, int64(b.cfg.MaxMessageBytes))
		if err == nil {
			if err = c.send(zmq4.NewMsg(append([]byte{1}, b.cfg.ZMQTopic...))); err != nil {
				c.close()
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			level := slog.LevelDebug
			if failures == 1 || failures%50 == 0 {
				level = slog.LevelWarn
			}
			b.log.Log(ctx, level, "engine PUB socket unreachable, retrying", "endpoint", b.cfg.Endpoint, "attempts", failures, "err", err)
			if !b.sleep(ctx, backoff) {
				return
			}
			backoff = min(2*backoff, b.cfg.MaxReconnectBackoff)
			continue
		}
		failures, backoff = 0, b.cfg.ReconnectBackoff
		b.log.Info("engine PUB socket connected", "endpoint", b.cfg.Endpoint)
		b.subMu.Lock()
		b.sub = c
		b.subMu.Unlock()
		err = nil
		if send(ctx, in, inEvent{kind: evConnected}) {
			err = b.recvLoop(ctx, c, in)
		}
		b.subMu.Lock()
		b.sub = nil
		b.subMu.Unlock()
		c.close()
		if ctx.Err() != nil || !send(ctx, in, inEvent{kind: evDisconnected, err: err}) {
			return
		}
		b.log.Warn("engine PUB socket disconnected", "endpoint", b.cfg.Endpoint, "err", err)
		if !b.sleep(ctx, backoff) {
			return
		}
	}
}

// recvLoop reads PUB messages [topic, seq, payload] until the connection
// fails or ctx ends (which closes it).
func (b *Bridge) recvLoop(ctx context.Context, c *zconn, in chan<- inEvent) error {
	stop := context.AfterFunc(ctx, c.close)
	defer stop()
	for {
		m, err := c.recv()
		if err != nil {
			if errors.Is(err, errMessageTooLarge) {
				b.m.skipped.WithLabelValues(skipTooLarge).Inc()
				b.log.Warn("engine message over the size limit, dropping the connection", "err", err)
			}
			return err
		}
		f := m.Frames
		if len(f) != 3 || len(f[1]) != 8 {
			b.m.skipped.WithLabelValues(skipBadFrames).Inc()
			b.log.Warn("engine message skipped: want frames [topic, seq(8 bytes), payload]", "frames", len(f))
			continue
		}
		if !send(ctx, in, inEvent{kind: evMessage, seq: binary.BigEndian.Uint64(f[1]), payload: f[2]}) {
			return ctx.Err()
		}
	}
}

// dropSub closes the current PUB connection so the reader reconnects.
func (b *Bridge) dropSub() {
	b.subMu.Lock()
	defer b.subMu.Unlock()
	if b.sub != nil {
		b.sub.close()
	}
}

// engineGone probes the engine every ProbeInterval for GracePeriod and
// reports whether ProbeFailures probes in a row failed.
func (b *Bridge) engineGone(ctx context.Context) bool {
	deadline := b.clock.NewTimer(b.cfg.GracePeriod)
	defer deadline.Stop()
	failures := 0
	for {
		pctx, cancel := context.WithTimeout(ctx, b.cfg.ProbeInterval)
		err := b.probe(pctx)
		cancel()
		if err == nil {
			failures = 0
		} else if failures++; failures >= b.cfg.ProbeFailures {
			b.log.Info("engine probe failed", "attempts", failures, "err", err)
			return true
		}
		select {
		case <-deadline.Chan():
			return false
		case <-b.clock.After(b.cfg.ProbeInterval):
		}
	}
}

// sleep waits d on the bridge's clock; false when ctx ended first.
func (b *Bridge) sleep(ctx context.Context, d time.Duration) bool {
	t := b.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.Chan():
		return true
	}
}

// send delivers ev unless ctx ends first.
func send(ctx context.Context, in chan<- inEvent, ev inEvent) bool {
	select {
	case in <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}
