package enginesim

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"

	"github.com/kvindex/kvindex/internal/logging"
)

// EndSeq is the sequence number of the replay socket's end marker: -1 as
// a signed 8-byte big-endian integer (vLLM's END_SEQ).
const EndSeq = ^uint64(0)

// handshakeTimeout bounds a ZMTP greeting and handshake with a peer.
const handshakeTimeout = 5 * time.Second

// Stats counts what an Engine did since New, across restarts.
type Stats struct {
	// Published counts Publish calls (each got a sequence number).
	Published uint64
	// Dropped counts batches DropNext kept off the PUB socket.
	Dropped uint64
	// HWMDrops counts messages dropped for a subscriber whose queue was
	// full.
	HWMDrops uint64
	// ReplayRequests counts well-formed replay requests served.
	ReplayRequests uint64
	// BadReplayRequests counts replay requests ignored as malformed.
	BadReplayRequests uint64
	// Restarts counts Restart calls.
	Restarts uint64
	// Subscriptions counts subscribe messages received from SUB peers
	// (one per connection for a peer that subscribes to one prefix).
	Subscriptions uint64
}

type entry struct {
	seq     uint64
	payload []byte
}

// Engine is a running simulated engine. Its methods are safe for concurrent
// use.
//
// Shutdown order (Close, and the old process in Restart): mark stopped so
// Publish fails or waits, close both listeners, close every connection and
// every subscriber queue, then wait for every goroutine (accept loops, one
// reader and one writer per subscriber, one handler per replay client).
type Engine struct {
	cfg Config
	log *slog.Logger

	// restartMu serialises Restart and Close.
	restartMu sync.Mutex

	mu         sync.Mutex
	closed     bool
	running    bool
	seq        uint64
	ring       []entry // ring buffer of the newest batches
	head, n    int
	dropNext   int
	replayDrop struct{ after, n int }
	// replayRepeat, when positive, makes the replay answers resend their
	// first batch at this interval without end (RepeatReplay).
	replayRepeat time.Duration
	subs         map[*subscriber]struct{}
	conns        map[net.Conn]struct{}
	pubL         net.Listener // nil with Config.Connect
	replayL      net.Listener
	stopDial     chan struct{} // closed to stop the current process's dial loop
	pubAddr      string
	replayAddr   string
	// givenReplayL is Config.ReplayListener until the first start serves
	// on it.
	givenReplayL net.Listener
	// changed is closed and replaced whenever the set of subscribed
	// subscribers changes (WaitSubscribed waits on it).
	changed chan struct{}
	stats   Stats

	// wg counts the goroutines of the current process.
	wg sync.WaitGroup
}

// subscriber is one connected SUB peer.
type subscriber struct {
	raw net.Conn
	zc  *zmq4.Conn
	// q holds messages for the writer; closed by the engine (under mu) when
	// the subscriber is removed.
	q chan zmq4.Msg
	// topics are the subscribed prefixes; guarded by Engine.mu.
	topics map[string]struct{}
}

func (s *subscriber) matches(topic string) bool {
	for p := range s.topics {
		if strings.HasPrefix(topic, p) {
			return true
		}
	}
	return false
}

// New validates cfg, binds the PUB socket (and the replay socket when
// configured) and starts serving. The caller must Close the engine.
func New(cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		if cfg.ReplayListener != nil {
			cfg.ReplayListener.Close()
		}
		return nil, err
	}
	e := &Engine{
		cfg:        cfg,
		log:        cfg.Logger,
		ring:       make([]entry, cfg.BufferSize),
		subs:       map[*subscriber]struct{}{},
		conns:      map[net.Conn]struct{}{},
		changed:    make(chan struct{}),
		pubAddr:    cfg.PubAddr,
		replayAddr: cfg.ReplayAddr,
		seq:        cfg.FirstSeq,
	}
	if cfg.ReplayListener != nil {
		e.givenReplayL, e.replayAddr = cfg.ReplayListener, cfg.ReplayListener.Addr().String()
	}
	if cfg.Connect != "" {
		e.pubAddr = cfg.Connect
	}
	if e.log == nil {
		e.log = logging.Discard()
	}
	if err := e.start(context.Background()); err != nil {
		return nil, err
	}
	return e, nil
}

// PubEndpoint is the PUB socket's ZMQ endpoint, "tcp://host:port" (with
// Config.Connect, the address it dials).
func (e *Engine) PubEndpoint() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return "tcp://" + e.pubAddr
}

// ReplayEndpoint is the replay socket's ZMQ endpoint, "tcp://host:port", or
// "" when the engine has none.
func (e *Engine) ReplayEndpoint() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.replayAddr == "" {
		return ""
	}
	return "tcp://" + e.replayAddr
}

// NextSeq is the sequence number the next Publish will use.
func (e *Engine) NextSeq() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.seq
}

// Stats returns a snapshot of the engine's counters.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stats
}

// Publish gives payload the next sequence number, keeps a copy in the
// replay buffer and sends [topic, seq, payload] to every subscriber whose
// subscription matches the topic, dropping it for subscribers whose queue
// is full. It never blocks on a subscriber. It returns the sequence number,
// or ErrClosed after Close, or ctx's error.
func (e *Engine) Publish(ctx context.Context, payload []byte) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	p := bytes.Clone(payload)
	if p == nil {
		p = []byte{}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return 0, ErrClosed
	}
	seq := e.seq
	e.seq++
	e.stats.Published++
	e.push(entry{seq: seq, payload: p})
	if e.dropNext > 0 {
		e.dropNext--
		e.stats.Dropped++
		return seq, nil
	}
	msg := zmq4.NewMsgFrom([]byte(e.cfg.Topic), seqBytes(seq), p)
	for s := range e.subs {
		if !s.matches(e.cfg.Topic) {
			continue
		}
		select {
		case s.q <- msg:
		default:
			e.stats.HWMDrops++
		}
	}
	return seq, nil
}

// PublishBatch encodes b (tagged-map encoding) and publishes it.
func (e *Engine) PublishBatch(ctx context.Context, b Batch) (uint64, error) {
	p, err := b.Encode()
	if err != nil {
		return 0, err
	}
	return e.Publish(ctx, p)
}

// DropNext makes the next n Publish calls skip the PUB socket: they get
// sequence numbers and enter the replay buffer, as when ZMQ drops messages
// for a slow or reconnecting subscriber.
func (e *Engine) DropNext(n int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.dropNext += n
}

// DropReplay makes the next replay answer leave out n batches after the
// first after ones it sends, as a ROUTER socket does past its high-water
// mark. The end marker is still sent.
func (e *Engine) DropReplay(after, n int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.replayDrop.after, e.replayDrop.n = after, n
}

// RepeatReplay makes every replay answer from now on a buggy engine's:
// it sends its first batch, then the same batch again every interval,
// and never the end marker, until the bridge closes the connection.
// Reset by Restart.
func (e *Engine) RepeatReplay(interval time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.replayRepeat = interval
}

// WaitSubscribed blocks until at least n subscribers have subscribed to a
// prefix of the topic, or ctx ends.
func (e *Engine) WaitSubscribed(ctx context.Context, n int) error {
	for {
		e.mu.Lock()
		count := 0
		for s := range e.subs {
			if s.matches(e.cfg.Topic) {
				count++
			}
		}
		ch := e.changed
		closed := e.closed
		e.mu.Unlock()
		if count >= n {
			return nil
		}
		if closed {
			return ErrClosed
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("enginesim: waiting for %d subscribers (have %d): %w", n, count, ctx.Err())
		case <-ch:
		}
	}
}

// WaitSubscriptions blocks until the engine has received at least n
// subscribe messages since New (Stats.Subscriptions), or ctx ends. After a
// reconnection, waiting for one more than before shows that the new
// connection is subscribed, whatever the engine still knows of the old.
func (e *Engine) WaitSubscriptions(ctx context.Context, n uint64) error {
	for {
		e.mu.Lock()
		got, ch, closed := e.stats.Subscriptions, e.changed, e.closed
		e.mu.Unlock()
		if got >= n {
			return nil
		}
		if closed {
			return ErrClosed
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("enginesim: waiting for %d subscriptions (have %d): %w", n, got, ctx.Err())
		case <-ch:
		}
	}
}

// DisconnectAll closes every PUB and replay connection but keeps the
// process (sequence numbers, buffer, listeners): a network blip. The
// subscribers are gone when it returns.
func (e *Engine) DisconnectAll() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for c := range e.conns {
		c.Close()
	}
	for s := range e.subs {
		e.removeLocked(s)
	}
	e.notifyLocked()
}

// Restart simulates a new engine process on the same addresses: it stops
// the current one (closing every connection, so subscribers see it go),
// clears the replay buffer, resets the sequence number to 0 and listens
// again. Fault knobs (DropNext, DropReplay, RepeatReplay) are reset too.
func (e *Engine) Restart(ctx context.Context) error {
	e.restartMu.Lock()
	defer e.restartMu.Unlock()
	if err := e.stop(false); err != nil {
		return err
	}
	e.mu.Lock()
	e.seq, e.head, e.n, e.dropNext = e.cfg.FirstSeq, 0, 0, 0
	e.replayDrop.after, e.replayDrop.n = 0, 0
	e.replayRepeat = 0
	clear(e.ring)
	e.stats.Restarts++
	e.mu.Unlock()
	return e.start(ctx)
}

// Close stops the engine for good: the engine is gone, its addresses
// refuse connections. Safe to call more than once.
func (e *Engine) Close() error {
	e.restartMu.Lock()
	defer e.restartMu.Unlock()
	return e.stop(true)
}

// start binds the listeners (on the addresses kept from the first start,
// so a restarted engine has the same ports) and starts the accept loops.
func (e *Engine) start(ctx context.Context) error {
	var lc net.ListenConfig
	var pubL net.Listener
	var err error
	given := e.givenReplayL
	e.givenReplayL = nil
	if e.cfg.Connect == "" {
		if pubL, err = lc.Listen(ctx, "tcp", e.pubAddr); err != nil {
			if given != nil {
				given.Close()
			}
			return fmt.Errorf("enginesim: listening for PUB on %s: %w", e.pubAddr, err)
		}
	}
	replayL := given
	if replayL == nil && e.replayAddr != "" {
		if replayL, err = lc.Listen(ctx, "tcp", e.replayAddr); err != nil {
			if pubL != nil {
				pubL.Close()
			}
			return fmt.Errorf("enginesim: listening for replay on %s: %w", e.replayAddr, err)
		}
	}
	stopDial := make(chan struct{})
	e.mu.Lock()
	e.pubL, e.replayL, e.running, e.stopDial = pubL, replayL, true, stopDial
	if pubL != nil {
		e.pubAddr = pubL.Addr().String()
	}
	if replayL != nil {
		e.replayAddr = replayL.Addr().String()
	}
	e.mu.Unlock()
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		if pubL == nil {
			e.dialLoop(stopDial)
			return
		}
		e.acceptLoop(pubL, func(c net.Conn) { e.servePub(c, true) })
	}()
	if replayL != nil {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			e.acceptLoop(replayL, e.serveReplay)
		}()
	}
	return nil
}

// stop closes the current process's listeners and connections and waits
// for its goroutines. final marks the engine closed for good.
func (e *Engine) stop(final bool) error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		if final {
			return nil
		}
		return ErrClosed
	}
	e.closed = final
	var errs []error
	if e.running {
		if e.pubL != nil {
			errs = append(errs, e.pubL.Close())
		}
		close(e.stopDial)
		if e.replayL != nil {
			errs = append(errs, e.replayL.Close())
		}
		e.running = false
	}
	for c := range e.conns {
		c.Close()
	}
	for s := range e.subs {
		e.removeLocked(s)
	}
	e.notifyLocked()
	e.mu.Unlock()
	e.wg.Wait()
	return errors.Join(errs...)
}

func (e *Engine) acceptLoop(l net.Listener, serve func(net.Conn)) {
	for {
		c, err := l.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				e.log.Warn("accept failed", "addr", l.Addr().String(), "err", err)
			}
			return
		}
		e.mu.Lock()
		if !e.running {
			e.mu.Unlock()
			c.Close()
			return
		}
		e.conns[c] = struct{}{}
		// Added under mu, before stop can wait: stop takes mu first.
		e.wg.Add(1)
		e.mu.Unlock()
		go func() {
			defer e.wg.Done()
			defer e.forget(c)
			serve(c)
		}()
	}
}

// dialLoop connects the PUB socket to Config.Connect and serves the
// connection, redialing after it ends (every 10 ms) until stop is closed.
func (e *Engine) dialLoop(stop <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-stop
		cancel()
	}()
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", e.cfg.Connect)
		if err == nil {
			e.mu.Lock()
			if !e.running {
				e.mu.Unlock()
				c.Close()
				return
			}
			e.conns[c] = struct{}{}
			e.mu.Unlock()
			e.servePub(c, false)
			e.forget(c)
		}
		select {
		case <-stop:
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (e *Engine) forget(c net.Conn) {
	c.Close()
	e.mu.Lock()
	delete(e.conns, c)
	e.mu.Unlock()
}

// open performs the ZMTP handshake as typ, as the server side of an
// accepted connection or the client side of a dialed one.
func open(raw net.Conn, typ zmq4.SocketType, server bool) (*zmq4.Conn, error) {
	if err := raw.SetDeadline(time.Now().Add(handshakeTimeout)); err != nil {
		return nil, err
	}
	zc, err := zmq4.Open(raw, null.Security(), typ, nil, server, nil)
	if err != nil {
		return nil, err
	}
	return zc, raw.SetDeadline(time.Time{})
}

// servePub runs one subscriber: this goroutine reads its subscriptions, a
// second one (owned here) writes its queue.
func (e *Engine) servePub(raw net.Conn, server bool) {
	zc, err := open(raw, zmq4.Pub, server)
	if err != nil {
		e.log.Debug("PUB handshake failed", "peer", raw.RemoteAddr().String(), "err", err)
		return
	}
	s := &subscriber{raw: raw, zc: zc, q: make(chan zmq4.Msg, e.cfg.HWM), topics: map[string]struct{}{}}
	e.mu.Lock()
	if !e.running {
		e.mu.Unlock()
		return
	}
	e.subs[s] = struct{}{}
	e.mu.Unlock()

	var writer sync.WaitGroup
	writer.Add(1)
	go func() {
		defer writer.Done()
		for msg := range s.q {
			if err := zc.SendMsg(msg); err != nil {
				raw.Close() // the reader sees it and removes s
				for range s.q {
				}
				return
			}
		}
	}()
	defer writer.Wait()
	defer func() {
		e.mu.Lock()
		e.removeLocked(s)
		e.notifyLocked()
		e.mu.Unlock()
	}()

	for {
		msg, err := zc.RecvMsg()
		if err != nil {
			return
		}
		if msg.Type == zmq4.CmdMsg || len(msg.Frames) != 1 || len(msg.Frames[0]) == 0 {
			continue
		}
		f := msg.Frames[0]
		e.mu.Lock()
		switch f[0] {
		case 1:
			s.topics[string(f[1:])] = struct{}{}
			e.stats.Subscriptions++
		case 0:
			delete(s.topics, string(f[1:]))
		}
		e.notifyLocked()
		e.mu.Unlock()
	}
}

// removeLocked drops s and closes its queue (once).
func (e *Engine) removeLocked(s *subscriber) {
	if _, ok := e.subs[s]; !ok {
		return
	}
	delete(e.subs, s)
	close(s.q)
	s.raw.Close()
}

func (e *Engine) notifyLocked() {
	close(e.changed)
	e.changed = make(chan struct{})
}

// serveReplay answers replay requests on one ROUTER connection, one at a
// time, from a snapshot of the buffer taken when the request arrives (vLLM
// serves replay on its publisher thread, between publishes).
func (e *Engine) serveReplay(raw net.Conn) {
	zc, err := open(raw, zmq4.Router, true)
	if err != nil {
		e.log.Debug("replay handshake failed", "peer", raw.RemoteAddr().String(), "err", err)
		return
	}
	for {
		msg, err := zc.RecvMsg()
		if err != nil {
			return
		}
		if msg.Type == zmq4.CmdMsg {
			continue
		}
		f := msg.Frames
		if len(f) != 2 || len(f[0]) != 0 || len(f[1]) != 8 {
			e.mu.Lock()
			e.stats.BadReplayRequests++
			e.mu.Unlock()
			e.log.Warn("invalid replay request", "frames", len(f))
			continue
		}
		start := binary.BigEndian.Uint64(f[1])
		entries, after, drop := e.snapshot(start)
		e.mu.Lock()
		repeat := e.replayRepeat
		e.mu.Unlock()
		if repeat > 0 && len(entries) > 0 {
			for {
				if err := zc.SendMsg(e.replayMsg([]byte(e.cfg.Topic), entries[0].seq, entries[0].payload)); err != nil {
					return
				}
				time.Sleep(repeat)
			}
		}
		sent := 0
		for i, en := range entries {
			if i >= after && i < after+drop {
				continue
			}
			if err := zc.SendMsg(e.replayMsg([]byte(e.cfg.Topic), en.seq, en.payload)); err != nil {
				return
			}
			sent++
		}
		if err := zc.SendMsg(e.replayMsg([]byte{}, EndSeq, []byte{})); err != nil {
			return
		}
		e.log.Debug("replay served", "start_seq", start, "batches", sent)
	}
}

// replayMsg frames one replay answer message (Config.ReplayTopicFrame).
func (e *Engine) replayMsg(topic []byte, seq uint64, payload []byte) zmq4.Msg {
	if e.cfg.ReplayTopicFrame {
		return zmq4.NewMsgFrom([]byte{}, topic, seqBytes(seq), payload)
	}
	return zmq4.NewMsgFrom([]byte{}, seqBytes(seq), payload)
}

// snapshot returns the buffered entries with seq >= start, oldest first,
// and consumes the DropReplay knob.
func (e *Engine) snapshot(start uint64) (out []entry, after, drop int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stats.ReplayRequests++
	for i := range e.n {
		en := e.ring[(e.head+i)%len(e.ring)]
		if en.seq >= start {
			out = append(out, en)
		}
	}
	after, drop = e.replayDrop.after, e.replayDrop.n
	e.replayDrop.after, e.replayDrop.n = 0, 0
	return out, after, drop
}

// push appends to the ring, evicting the oldest entry when full.
func (e *Engine) push(en entry) {
	if e.n < len(e.ring) {
		e.ring[(e.head+e.n)%len(e.ring)] = en
		e.n++
		return
	}
	e.ring[e.head] = en
	e.head = (e.head + 1) % len(e.ring)
}

func seqBytes(seq uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], seq)
	return b[:]
}
