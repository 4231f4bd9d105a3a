package bridge

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/time/rate"

	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/keyspace"
)

// The bind mode (Config.Listen): the bridge binds one endpoint and any
// number of engines' PUB sockets connect to it, as llm-d fleets publish
// to llm-d's own subscriber. Each message's topic names its endpoint
// (Config.TopicPattern); every topic is a stream with its own sequencer
// (cursor, gap detection, replay from Config.ReplayPattern, heartbeats),
// all feeding the one producer.
//
// Goroutines, all owned by runBind and waited for before it returns: the
// accept loop, one reader per accepted connection (bounded by
// MaxConnections) and one sequencer per pod (bounded by MaxPods).
//
// A pod is connected while one connection carries its topic. A
// connection that starts carrying a pod's topic takes the pod over: the
// sequencer sees a disconnection and a connection, so it catches up from
// the replay socket (or resyncs without one), as after a reconnect in the
// dial mode; the older connection's messages for that pod are then stale
// and skipped. A pod with no connection for PodIdleTimeout is forgotten
// (its sequencer stops; a later message starts it afresh, as a restarted
// bridge would).

// hub is the bind mode's registry of connections and pods.
type hub struct {
	b   *Bridge
	out chan<- *kgo.Record
	// drainCtx bounds each pod's drain at shutdown.
	drainCtx context.Context

	mu     sync.Mutex
	pods   map[string]*pod // by topic
	conns  map[*bindConn]struct{}
	closed bool // shutdown: no new pods or connections

	connWG sync.WaitGroup
	podWG  sync.WaitGroup

	// refusedLog limits the warning for messages whose topic starts no
	// stream (no match, no valid names) to one per refusedLogEvery; every
	// one is counted (kvindex_bridge_unknown_topics_total) and logged at
	// debug.
	refusedLog rate.Sometimes
	// badPeerLog limits the warning for a connection whose handshake made
	// zmq4 panic (errZMTPPanic) the same way: anyone who reaches the port
	// can send one.
	badPeerLog rate.Sometimes
}

// refusedLogEvery is how often a refused topic is warned of at most: a
// publisher on the wrong topic sends every batch there, so one line per
// message would flood the log, and debug alone would hide it.
const refusedLogEvery = 10 * time.Second

// pod is one topic's stream in the bind mode.
type pod struct {
	topic string
	st    *stream
	in    chan inEvent

	// mu orders what the connections hand the sequencer: connection
	// changes and messages are sent under it, so the sequencer sees them
	// in the order cur changed.
	mu     sync.Mutex
	cur    *bindConn // the connection carrying the pod, nil when none
	closed bool      // in is closed (removed, or shutdown)
	// carrier is cur, readable without mu: the sequencer's drop hook
	// closes it, and mu may be held by a reader blocked on in, which only
	// the sequencer drains.
	carrier atomic.Pointer[bindConn]
}

// bindConn is one accepted publisher connection.
type bindConn struct {
	raw    net.Conn
	remote string
	// pods are the pods this connection has carried, by topic; only its
	// reader uses it.
	pods map[string]*pod
}

// runBind listens on Config.Listen and runs the hub until runCtx ends,
// then stops accepting, closes every connection, lets every pod's
// sequencer produce what it had received (bounded by drainCtx) and
// returns once every goroutine it started has stopped. startFlush is
// called when the shutdown begins. It returns an error only when it could
// not listen.
func (b *Bridge) runBind(runCtx, drainCtx context.Context, startFlush func(), out chan<- *kgo.Record) error {
	addr, _ := listenAddr(b.cfg.Listen)
	var lc net.ListenConfig
	l, err := lc.Listen(runCtx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("bridge: listening on %s: %w", b.cfg.Listen, err)
	}
	bound := "tcp://" + l.Addr().String()
	b.boundAddr.Store(&bound)
	b.listening.Store(true)
	b.log.Info("listening for publishers", "addr", bound)
	h := &hub{b: b, out: out, drainCtx: drainCtx, pods: map[string]*pod{}, conns: map[*bindConn]struct{}{},
		refusedLog: rate.Sometimes{Interval: refusedLogEvery}, badPeerLog: rate.Sometimes{Interval: refusedLogEvery}}
	stop := context.AfterFunc(runCtx, func() { l.Close() })
	defer stop()
	h.acceptLoop(runCtx, l)

	// Shutdown: no more connections; close the open ones and wait for
	// their readers, then close every pod's input and wait for its
	// sequencer to drain it.
	b.listening.Store(false)
	startFlush()
	h.mu.Lock()
	h.closed = true
	for c := range h.conns {
		c.raw.Close()
	}
	h.mu.Unlock()
	h.connWG.Wait()
	h.mu.Lock()
	for _, p := range h.pods {
		p.close()
	}
	h.mu.Unlock()
	h.podWG.Wait()
	b.m.connected.Set(0)
	return nil
}

// acceptLoop accepts publishers until the listener is closed.
func (h *hub) acceptLoop(ctx context.Context, l net.Listener) {
	b := h.b
	backoff := b.cfg.ReconnectBackoff
	for {
		raw, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: wait, and go on.
			b.log.Warn("accepting a publisher failed, retrying", "err", err)
			if !b.sleep(ctx, backoff) {
				return
			}
			backoff = min(2*backoff, b.cfg.MaxReconnectBackoff)
			continue
		}
		backoff = b.cfg.ReconnectBackoff
		c := &bindConn{raw: raw, remote: raw.RemoteAddr().String(), pods: map[string]*pod{}}
		h.mu.Lock()
		if h.closed || len(h.conns) >= b.cfg.MaxConnections {
			full := !h.closed
			h.mu.Unlock()
			raw.Close()
			if full {
				b.m.refused.Inc()
				b.log.Warn("publisher connection refused: at the connection limit", "remote", c.remote, "max_connections", b.cfg.MaxConnections)
			}
			continue
		}
		h.conns[c] = struct{}{}
		h.connWG.Add(1)
		h.mu.Unlock()
		go func() {
			defer h.connWG.Done()
			h.serve(ctx, c)
		}()
	}
}

// serve runs one publisher connection: the ZMTP handshake as the SUB
// side, the subscription to the pattern's prefix, then its messages, each
// handed to its topic's pod.
func (h *hub) serve(ctx context.Context, c *bindConn) {
	b := h.b
	defer func() {
		h.mu.Lock()
		delete(h.conns, c)
		h.mu.Unlock()
		c.raw.Close()
		for _, p := range c.pods {
			p.detach(ctx, c)
		}
	}()
	zc, err := openZMTP(ctx, c.raw, c.remote, zmq4.Sub, true, b.cfg.DialTimeout, int64(b.cfg.MaxMessageBytes))
	if err != nil {
		warned := false
		if errors.Is(err, errZMTPPanic) {
			h.badPeerLog.Do(func() {
				warned = true
				b.log.Warn("publisher handshake failed on malformed ZMTP, connection closed (warned once per "+refusedLogEvery.String()+")", "remote", c.remote, "err", err)
			})
		}
		if !warned {
			b.log.Debug("publisher handshake failed", "remote", c.remote, "err", err)
		}
		return
	}
	if err := zc.send(zmq4.NewMsg(append([]byte{1}, b.topics.prefix...))); err != nil {
		b.log.Debug("subscribing a publisher failed", "remote", c.remote, "err", err)
		return
	}
	b.m.publisherConns.Inc()
	defer b.m.publisherConns.Dec()
	b.log.Info("publisher connected", "remote", c.remote)
	stop := context.AfterFunc(ctx, zc.close)
	defer stop()
	for {
		m, err := zc.recv()
		if err != nil {
			if errors.Is(err, errMessageTooLarge) {
				b.m.skipped.WithLabelValues(skipTooLarge).Inc()
				b.log.Warn("publisher message over the size limit, dropping the connection", "remote", c.remote, "err", err)
			} else if ctx.Err() == nil {
				b.log.Info("publisher disconnected", "remote", c.remote, "err", err)
			}
			return
		}
		f := m.Frames
		if len(f) != 3 || len(f[1]) != 8 {
			b.m.skipped.WithLabelValues(skipBadFrames).Inc()
			b.log.Warn("publisher message skipped: want frames [topic, seq(8 bytes), payload]", "remote", c.remote, "frames", len(f))
			continue
		}
		topic := string(f[0])
		ev := inEvent{kind: evMessage, seq: binary.BigEndian.Uint64(f[1]), payload: f[2]}
		p := c.pods[topic]
		d := orphaned
		if p != nil {
			d = p.deliver(ctx, c, ev)
		}
		if d == orphaned {
			// No pod yet on this connection, or its pod lost the
			// connection that had taken it over, or was forgotten: this
			// live connection carries it (again).
			delete(c.pods, topic)
			if p = h.attach(ctx, c, topic, f[2]); p == nil {
				continue
			}
			d = p.deliver(ctx, c, ev)
		}
		if d == stale {
			b.m.skipped.WithLabelValues(skipStale).Inc()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// attach finds or creates topic's pod and makes c its connection. nil
// when the topic is refused (counted).
func (h *hub) attach(ctx context.Context, c *bindConn, topic string, payload []byte) *pod {
	b := h.b
	podName, model, ok := b.topics.match(topic)
	if !ok {
		b.m.unknownTopics.WithLabelValues(topicNoMatch).Inc()
		h.refused("message skipped: topic does not match the pattern", "topic", topic, "pattern", b.cfg.TopicPattern)
		return nil
	}
	if model == "" {
		model = b.cfg.Model
	}
	if keyspace.ValidateName("pod", podName) != nil || keyspace.ValidateName("model", model) != nil {
		b.m.unknownTopics.WithLabelValues(topicBadName).Inc()
		h.refused("message skipped: topic names no valid pod and model", "topic", topic, "pattern", b.cfg.TopicPattern)
		return nil
	}
	for {
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			return nil
		}
		p := h.pods[topic]
		if p == nil {
			if len(h.pods) >= b.cfg.MaxPods {
				h.mu.Unlock()
				b.m.unknownTopics.WithLabelValues(topicTooManyPods).Inc()
				b.log.Warn("message skipped: at the pod limit", "topic", topic, "max_pods", b.cfg.MaxPods)
				return nil
			}
			p = h.newPod(ctx, topic, podName, model, payload)
		}
		h.mu.Unlock()
		if p.take(ctx, c) {
			c.pods[topic] = p
			return p
		}
		// p was removed between the lookup and take: look again.
		if ctx.Err() != nil {
			return nil
		}
	}
}

// refused logs a message whose topic starts no stream: a warning at most
// every refusedLogEvery (naming where the count is), else at debug.
func (h *hub) refused(msg string, args ...any) {
	warned := false
	h.refusedLog.Do(func() {
		warned = true
		h.b.log.Warn(msg+" (warned once per "+refusedLogEvery.String()+"; all counted in kvindex_bridge_unknown_topics_total)", args...)
	})
	if !warned {
		h.b.log.Debug(msg, args...)
	}
}

// newPod creates and starts topic's pod; h.mu is held. Its dp_rank is the
// data_parallel_rank of the batch that named it (0 when it has none):
// llm-d's topic has no rank, and the ingester skips batches whose rank is
// not the record's.
func (h *hub) newPod(ctx context.Context, topic, podName, model string, payload []byte) *pod {
	b := h.b
	var rank uint32
	if batch, err := events.NewDecoder(nil).Decode(payload); err == nil && batch.HasRank {
		rank = batch.Rank
	}
	log := b.log.With("pod", podName, "model", model, "dp_rank", rank)
	replayAddr, err := b.replay.addr(podName, model)
	if err != nil {
		b.m.unknownTopics.WithLabelValues(topicBadReplay).Inc()
		log.Warn("the replay pattern gives no endpoint for this pod: gaps resync it", "replay_pattern", b.cfg.ReplayPattern, "err", err)
		replayAddr = ""
	}
	p := &pod{topic: topic, in: make(chan inEvent, b.cfg.PodQueueSize)}
	p.st = newStream(podName, model, rank, replayAddr, log)
	p.st.replayTopic = []byte(topic)
	// The engine was found replaced under its connection: close it, so the
	// pod's next connection takes it up afresh.
	p.st.drop = func() {
		if c := p.carrier.Load(); c != nil {
			c.raw.Close()
		}
	}
	h.pods[topic] = p
	b.m.pods.Set(float64(len(h.pods)))
	log.Info("new pod", "topic", topic, "replay", replayAddr)
	s := &sequencer{b: b, st: p.st, out: h.out, idle: func() bool { return h.remove(p) }}
	h.podWG.Add(1)
	go func() {
		defer h.podWG.Done()
		s.run(ctx, p.in)
		s.drain(h.drainCtx, p.in)
	}()
	return p
}

// remove forgets p if it still has no connection (its idle timer fired);
// true when it did.
func (h *hub) remove(p *pod) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur != nil || p.closed {
		return false
	}
	p.closed = true
	close(p.in)
	delete(h.pods, p.topic)
	h.b.m.pods.Set(float64(len(h.pods)))
	h.b.m.podsRemoved.Inc()
	p.st.log.Info("pod forgotten: no connection for the idle timeout", "pod_idle_timeout", h.b.cfg.PodIdleTimeout)
	return true
}

// take makes c the pod's connection: a pod carried by another connection
// is reconnected (disconnection, connection), one carried by none is
// connected. false when the pod has been removed.
func (p *pod) take(ctx context.Context, c *bindConn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	if p.cur != nil && !send(ctx, p.in, inEvent{kind: evDisconnected}) {
		return true
	}
	p.cur = c
	p.carrier.Store(c)
	send(ctx, p.in, inEvent{kind: evConnected})
	return true
}

// delivery is what deliver made of a message.
type delivery uint8

const (
	// delivered: handed to the pod's sequencer.
	delivered delivery = iota
	// stale: another connection carries the pod (it took it over), so
	// this one's messages are dropped and counted.
	stale
	// orphaned: the pod has no connection (the one that took it over
	// went away) or was forgotten (pod idle timeout): the caller attaches
	// the message's connection, which is alive, to carry it again.
	orphaned
)

// deliver hands ev to the sequencer if c carries the pod.
func (p *pod) deliver(ctx context.Context, c *bindConn, ev inEvent) delivery {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed || p.cur == nil:
		return orphaned
	case p.cur != c:
		return stale
	}
	send(ctx, p.in, ev)
	return delivered
}

// detach ends c's carrying of the pod, if it still does.
func (p *pod) detach(ctx context.Context, c *bindConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.cur != c {
		return
	}
	p.cur = nil
	p.carrier.Store(nil)
	send(ctx, p.in, inEvent{kind: evDisconnected})
}

// close closes the pod's input at shutdown, once no reader runs.
func (p *pod) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.closed = true
		close(p.in)
	}
}
