package bridge_test

// A scripted engine and raw ZMTP peers, for what enginesim does not do:
// malformed greetings and frames, a replay socket that answers whatever
// a test says, live messages with any seq, an engine replaced behind a
// connection that stays up (a ZMQ proxy in between). Kept from a hostile
// review of the bridge; each test below still checks what it found
// sound.

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/bridge"
	"github.com/kvindex/kvindex/bridge/bridgetest"
	"github.com/kvindex/kvindex/internal/testutil"
)

// ---- raw ZMTP helpers ----

func rawGreeting(mech string, major, minor, server byte) []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, major, minor
	copy(g[12:32], mech)
	g[32] = server
	return g
}

func rawFrame(flags byte, body []byte) []byte {
	if len(body) > 255 {
		h := make([]byte, 9)
		h[0] = flags | 0x02
		binary.BigEndian.PutUint64(h[1:], uint64(len(body)))
		return append(h, body...)
	}
	return append([]byte{flags, byte(len(body))}, body...)
}

func rawCmd(name string, body []byte) []byte {
	b := append([]byte{byte(len(name))}, name...)
	return rawFrame(0x04, append(b, body...))
}

func rawProp(k, v string) []byte {
	b := append([]byte{byte(len(k))}, k...)
	var l [4]byte
	binary.BigEndian.PutUint32(l[:], uint32(len(v)))
	b = append(b, l[:]...)
	return append(b, v...)
}

// scriptListener accepts connections on a loopback port and runs handle on
// each, until the test ends.
type scriptListener struct {
	l     net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
	n     int
}

func scriptListen(t testing.TB, handle func(n int, c net.Conn)) *scriptListener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	z := &scriptListener{l: l}
	z.wg.Add(1)
	go func() {
		defer z.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			z.mu.Lock()
			z.conns = append(z.conns, c)
			n := z.n
			z.n++
			z.mu.Unlock()
			z.wg.Add(1)
			go func() {
				defer z.wg.Done()
				defer c.Close()
				handle(n, c)
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		z.mu.Lock()
		for _, c := range z.conns {
			c.Close()
		}
		z.mu.Unlock()
		z.wg.Wait()
	})
	return z
}

func (z *scriptListener) endpoint() string { return "tcp://" + z.l.Addr().String() }

func (z *scriptListener) accepted() int {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.n
}

// scriptConfig is a dial-mode config for a PUB at pub and a replay socket at
// replay ("" for none), producing to k.
func scriptConfig(k *testutil.Kafka, pub, replay string, mod func(*bridge.Config)) bridge.Config {
	cfg := bridge.DefaultConfig()
	cfg.Endpoint, cfg.ReplayEndpoint = pub, replay
	cfg.Pod, cfg.Model = pod, model
	cfg.Brokers, cfg.Topic = k.Brokers, topic
	cfg.HeartbeatInterval = time.Hour
	cfg.GracePeriod = 0
	cfg.ProbeInterval = 50 * time.Millisecond
	cfg.ReconnectBackoff = 10 * time.Millisecond
	cfg.MaxReconnectBackoff = 50 * time.Millisecond
	cfg.ReplayTimeout = 500 * time.Millisecond
	cfg.DialTimeout = 500 * time.Millisecond
	cfg.Registry = prometheus.NewRegistry()
	if mod != nil {
		mod(&cfg)
	}
	return cfg
}

// scriptServe runs the ZMTP handshake on c as typ (server side) and hands the
// connection to f; it then reads (and drops) what the peer sends until c
// closes.
func scriptServe(c net.Conn, typ zmq4.SocketType, f func(*zmq4.Conn)) {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	zc, err := zmq4.Open(c, null.Security(), typ, nil, true, nil)
	if err != nil {
		return
	}
	c.SetDeadline(time.Time{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, err := zc.RecvMsg(); err != nil {
				return
			}
		}
	}()
	f(zc)
	<-done
}

// scriptPubWorld is a bridge dialing a PUB listener whose every connection
// runs handle; no replay socket unless given.
func scriptPubWorld(t *testing.T, handle func(n int, c net.Conn), mod func(*bridge.Config)) (*scriptListener, bridge.Config, *bridgetest.Running, *bridgetest.Consumer) {
	k := testutil.StartKafka(t, topic, 4)
	l := scriptListen(t, handle)
	cfg := scriptConfig(k, l.endpoint(), "", mod)
	b, err := bridge.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l, cfg, bridgetest.Start(t, b), bridgetest.NewConsumer(t, k.Brokers, topic)
}

// scriptPubHandshake does the PUB side of the handshake by hand and reads the
// bridge's greeting, READY and subscription.
func scriptPubHandshake(c net.Conn) error {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write(rawGreeting("NULL", 3, 0, 0)); err != nil {
		return err
	}
	if _, err := c.Write(rawCmd("READY", rawProp("Socket-Type", "PUB"))); err != nil {
		return err
	}
	zc := make([]byte, 64)
	if _, err := io.ReadFull(c, zc); err != nil {
		return err
	}
	// READY and the subscription: two short frames
	for range 2 {
		h := make([]byte, 2)
		if _, err := io.ReadFull(c, h); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, make([]byte, h[1])); err != nil {
			return err
		}
	}
	return nil
}

func scriptPubMsg(seq uint64, payload []byte) []byte {
	return joinBytes(rawFrame(0x01, nil), rawFrame(0x01, seqFrame(seq)), rawFrame(0, payload))
}

func joinBytes(p ...[]byte) []byte { return bytes.Join(p, nil) }

// TestBadGreetingsNeverReady: a PUB port that answers with garbage, ZMTP
// 2.0, a CURVE mechanism, a bad as-server byte, a non-PUB socket type,
// or nothing at all. The bridge must keep redialing (backed off), never
// become ready, never panic, and stop promptly.
func TestBadGreetingsNeverReady(t *testing.T) {
	cases := map[string][]byte{
		"garbage":     bytes.Repeat([]byte{0xde, 0xad}, 40),
		"zmtp_2":      rawGreeting("NULL", 2, 0, 0),
		"zmtp_1_sig":  {0x01, 0x00},
		"curve":       rawGreeting("CURVE", 3, 0, 0),
		"plain":       rawGreeting("PLAIN", 3, 1, 0),
		"server_2":    rawGreeting("NULL", 3, 0, 2),
		"router_type": joinBytes(rawGreeting("NULL", 3, 0, 0), rawCmd("READY", rawProp("Socket-Type", "ROUTER"))),
		"no_ready":    joinBytes(rawGreeting("NULL", 3, 0, 0), rawCmd("ERROR", []byte("\x03bad"))),
		"empty_cmd":   joinBytes(rawGreeting("NULL", 3, 0, 0), rawFrame(0x04, nil)),
		"huge_ready":  joinBytes(rawGreeting("NULL", 3, 0, 0), []byte{0x06, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}),
		"silent":      nil,
	}
	for name, greet := range cases {
		t.Run(name, func(t *testing.T) {
			l, cfg, r, _ := scriptPubWorld(t, func(_ int, c net.Conn) {
				c.Write(greet)
				io.Copy(io.Discard, c)
			}, nil)
			time.Sleep(1500 * time.Millisecond)
			if err := r.B.Ready(); err == nil {
				t.Errorf("ready against a %s peer", name)
			}
			start := time.Now()
			if err := r.Stop(); err != nil {
				t.Errorf("Run: %v", err)
			}
			if d := time.Since(start); d > time.Second {
				t.Errorf("stop took %v", d)
			}
			t.Logf("%d connection attempts in 1.5 s; connects=%v", l.accepted(), metric(t, cfg, "kvindex_bridge_engine_connects_total"))
		})
	}
}

// TestOversizedLiveFramesDropTheConnection: live messages whose frame lengths claim
// up to 2^64-1 bytes, delivered byte by byte; the connection must be
// dropped and counted before any allocation, and redialed; a good message
// after each must still be delivered.
func TestOversizedLiveFramesDropTheConnection(t *testing.T) {
	sizes := []uint64{1<<63 - 1, 1 << 63, ^uint64(0), 16<<20 + 1}
	_, cfg, r, cons := scriptPubWorld(t, func(n int, c net.Conn) {
		if scriptPubHandshake(c) != nil {
			return
		}
		if n < len(sizes) {
			c.Write(scriptPubMsg(uint64(n), []byte("ok")))
			var h [9]byte
			h[0] = 0x02
			binary.BigEndian.PutUint64(h[1:], sizes[n])
			stream := joinBytes([]byte{0x01, 0x00}, h[:])
			for _, b := range stream {
				if _, err := c.Write([]byte{b}); err != nil {
					return
				}
				time.Sleep(time.Millisecond)
			}
		} else {
			// byte by byte, a normal message
			for _, b := range scriptPubMsg(uint64(n), []byte("ok")) {
				c.Write([]byte{b})
				time.Sleep(time.Millisecond)
			}
		}
		io.Copy(io.Discard, c)
	}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got, err := cons.Read(ctx, len(sizes)+1+len(sizes)) // batches and reconnect_no_replay resyncs
	t.Logf("records: %s (err %v)", describeShort(got), err)
	if err != nil {
		t.Error(err)
	}
	t.Logf("skipped{message_too_large}=%v connects=%v", metric(t, cfg, "kvindex_bridge_messages_skipped_total", "reason", "message_too_large"),
		metric(t, cfg, "kvindex_bridge_engine_connects_total"))
	if v := metric(t, cfg, "kvindex_bridge_messages_skipped_total", "reason", "message_too_large"); v != float64(len(sizes)) {
		t.Errorf("message_too_large = %v, want %d", v, len(sizes))
	}
	r.Stop()
}

// TestStalledMidFrameStopsPromptly: the PUB peer sends half a message and goes
// silent (TCP alive). The bridge stays "connected" and ready, heartbeats
// flow; Stop must still be prompt.
func TestStalledMidFrameStopsPromptly(t *testing.T) {
	_, cfg, r, cons := scriptPubWorld(t, func(_ int, c net.Conn) {
		if scriptPubHandshake(c) != nil {
			return
		}
		m := scriptPubMsg(0, bytes.Repeat([]byte("x"), 1000))
		c.Write(m[:len(m)-500])
		io.Copy(io.Discard, c)
	}, func(c *bridge.Config) { c.HeartbeatInterval = 200 * time.Millisecond })
	time.Sleep(1500 * time.Millisecond)
	t.Logf("ready=%v connected=%v", r.B.Ready(), metric(t, cfg, "kvindex_bridge_engine_connected"))
	start := time.Now()
	r.Stop()
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("stop took %v", d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, _ := cons.ReadAll(ctx)
	t.Logf("records: %s", describeShort(got))
}

type scriptEntry struct {
	seq     uint64
	payload []byte
}

// scriptEngine is a scripted engine: a PUB socket whose messages the test
// sends one by one on the latest connection, and a ROUTER replay socket
// that answers from buf (entries with seq >= from, then the end marker)
// unless answer overrides it.
type scriptEngine struct {
	t      *testing.T
	pub    *scriptListener
	replay *scriptListener

	mu      sync.Mutex
	cur     *zmq4.Conn
	curRaw  net.Conn
	subs    int
	changed chan struct{}
	buf     []scriptEntry
	// answer, when set, replaces the replay answer for a request from
	// from; it may block (a silent replay socket) until the conn closes.
	answer   func(c net.Conn, zc *zmq4.Conn, from uint64)
	requests []uint64
}

func newScriptEngine(t *testing.T) *scriptEngine {
	e := &scriptEngine{t: t, changed: make(chan struct{})}
	e.pub = scriptListen(t, e.servePub)
	e.replay = scriptListen(t, e.serveReplay)
	return e
}

func (e *scriptEngine) notify() {
	close(e.changed)
	e.changed = make(chan struct{})
}

func (e *scriptEngine) servePub(_ int, c net.Conn) {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	zc, err := zmq4.Open(c, null.Security(), zmq4.Pub, nil, true, nil)
	if err != nil {
		return
	}
	c.SetDeadline(time.Time{})
	for {
		m, err := zc.RecvMsg()
		if err != nil {
			return
		}
		if m.Type == zmq4.CmdMsg {
			continue
		}
		e.mu.Lock()
		e.cur, e.curRaw = zc, c
		e.subs++
		e.notify()
		e.mu.Unlock()
	}
}

func (e *scriptEngine) serveReplay(_ int, c net.Conn) {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	zc, err := zmq4.Open(c, null.Security(), zmq4.Router, nil, true, nil)
	if err != nil {
		return
	}
	c.SetDeadline(time.Time{})
	for {
		m, err := zc.RecvMsg()
		if err != nil {
			return
		}
		if m.Type == zmq4.CmdMsg || len(m.Frames) != 2 || len(m.Frames[1]) != 8 {
			continue
		}
		from := binary.BigEndian.Uint64(m.Frames[1])
		e.mu.Lock()
		e.requests = append(e.requests, from)
		answer := e.answer
		var out []scriptEntry
		for _, en := range e.buf {
			if en.seq >= from {
				out = append(out, en)
			}
		}
		e.mu.Unlock()
		if answer != nil {
			answer(c, zc, from)
			continue
		}
		for _, en := range out {
			if zc.SendMsg(zmq4.NewMsgFrom([]byte{}, seqFrame(en.seq), en.payload)) != nil {
				return
			}
		}
		if zc.SendMsg(endMsg()) != nil {
			return
		}
	}
}

func seqFrame(s uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], s)
	return b[:]
}

func endMsg() zmq4.Msg { return zmq4.NewMsgFrom([]byte{}, seqFrame(^uint64(0)), []byte{}) }

// waitSubs waits until the engine has had n subscriptions.
func (e *scriptEngine) waitSubs(ctx context.Context, n int) {
	e.t.Helper()
	for {
		e.mu.Lock()
		got, ch := e.subs, e.changed
		e.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-ctx.Done():
			e.t.Fatalf("engine: %d subscriptions, want %d", got, n)
		case <-ch:
		}
	}
}

// publish buffers (seq, payload) for replay and sends it live.
func (e *scriptEngine) publish(seq uint64, payload []byte) {
	e.mu.Lock()
	e.buf = append(e.buf, scriptEntry{seq, payload})
	zc := e.cur
	e.mu.Unlock()
	if zc != nil {
		zc.SendMsg(zmq4.NewMsgFrom([]byte{}, seqFrame(seq), payload))
	}
}

// sendLive sends a live message without buffering it.
func (e *scriptEngine) sendLive(frames ...[]byte) {
	e.mu.Lock()
	zc := e.cur
	e.mu.Unlock()
	zc.SendMsg(zmq4.NewMsgFrom(frames...))
}

// restart replaces the replay buffer (a new process behind the same
// sockets) without touching the PUB connection.
func (e *scriptEngine) restartBehindProxy() {
	e.mu.Lock()
	e.buf = nil
	e.mu.Unlock()
}

func (e *scriptEngine) dropPub() {
	e.mu.Lock()
	if e.curRaw != nil {
		e.curRaw.Close()
	}
	e.cur, e.curRaw = nil, nil
	e.mu.Unlock()
}

type scriptWorld struct {
	t   *testing.T
	ctx context.Context
	e   *scriptEngine
	k   *testutil.Kafka
	c   *bridgetest.Consumer
	cfg bridge.Config
	r   *bridgetest.Running
}

func newScriptWorld(t *testing.T, withReplay bool, mod func(*bridge.Config)) *scriptWorld {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	w := &scriptWorld{t: t, ctx: ctx, e: newScriptEngine(t), k: testutil.StartKafka(t, topic, 4)}
	w.c = bridgetest.NewConsumer(t, w.k.Brokers, topic)
	replay := ""
	if withReplay {
		replay = w.e.replay.endpoint()
	}
	w.cfg = scriptConfig(w.k, w.e.pub.endpoint(), replay, mod)
	return w
}

func (w *scriptWorld) start() {
	b, err := bridge.New(w.cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	w.r = bridgetest.Start(w.t, b)
	if err := bridgetest.WaitReady(w.ctx, b); err != nil {
		w.t.Fatal(err)
	}
	w.e.waitSubs(w.ctx, 1)
}

func payloadOf(proc string, seq uint64) []byte { return []byte(fmt.Sprintf("%s-batch-%d", proc, seq)) }

func describeShort(rs []bridgetest.Record) string {
	s := ""
	for _, r := range rs {
		if k := r.Kind(); k != "" {
			s += "[" + k + "] "
			continue
		}
		s += fmt.Sprintf("%s@%s ", r.Value, r.Headers["seq"])
	}
	return s
}

// timedStop stops the bridge and returns how long Run took to return.
func (w *scriptWorld) timedStop() (time.Duration, error) {
	start := time.Now()
	err := w.r.Stop()
	return time.Since(start), err
}

// TestStopMidHealIsPrompt: a live gap starts a heal against a replay
// socket that accepts the request and never answers (or
// trickles one header byte every 100 ms); SIGTERM arrives mid-heal. Run must return promptly.
func TestStopMidHealIsPrompt(t *testing.T) {
	for _, mode := range []string{"silent_answer", "trickle"} {
		t.Run(mode, func(t *testing.T) {
			w := newScriptWorld(t, true, func(c *bridge.Config) {
				c.ReplayTimeout = 5 * time.Second
				c.DialTimeout = 5 * time.Second
				c.FlushTimeout = 2 * time.Second
			})
			w.start()
			for s := uint64(0); s < 3; s++ {
				w.e.publish(s, payloadOf("A", s))
			}
			if _, err := w.c.Read(w.ctx, 3); err != nil {
				t.Fatal(err)
			}
			w.e.mu.Lock()
			w.e.answer = func(c net.Conn, zc *zmq4.Conn, from uint64) {
				if mode == "trickle" {
					// one byte of a frame header every 100ms: never a full message
					for range 100 {
						if _, err := c.Write([]byte{0x01}); err != nil {
							return
						}
						time.Sleep(100 * time.Millisecond)
					}
				}
				buf := make([]byte, 1)
				c.Read(buf) // blocks until the bridge closes
			}
			w.e.mu.Unlock()
			w.e.publish(5, payloadOf("A", 5)) // gap 3..4: heal starts, replay never answers
			time.Sleep(300 * time.Millisecond)
			d, err := w.timedStop()
			t.Logf("Run returned after %v: %v", d, err)
			if d > 3*time.Second {
				t.Errorf("Stop mid-heal took %v", d)
			}
		})
	}
}

// TestReplayGarbageNeverProduced: replay answers with malformed messages
// (wrong frame counts, short seq frames, a non-empty delimiter, seqs
// below the request): the bridge must neither panic nor produce garbage,
// and must resync the gap.
func TestReplayGarbageNeverProduced(t *testing.T) {
	answers := map[string][][][]byte{
		"one_frame":       {{[]byte("x")}},
		"short_seq":       {{{}, {1, 2, 3}, []byte("p")}},
		"nonempty_delim":  {{[]byte("d"), seqFrame(3), []byte("p")}},
		"five_frames":     {{{}, {}, seqFrame(3), []byte("p"), []byte("q")}},
		"below_request":   {{{}, seqFrame(0), []byte("p")}},
		"end_with_topic":  {{{}, []byte("other"), seqFrame(^uint64(0)), {}}},
		"empty_frames":    {{{}, {}, {}}},
		"many_then_wrong": {{{}, seqFrame(2), payloadOf("A", 2)}, {{}, seqFrame(3), payloadOf("A", 3)}, {{}, seqFrame(1 << 63), []byte("x")}},
	}
	for name, msgs := range answers {
		t.Run(name, func(t *testing.T) {
			w := newScriptWorld(t, true, func(c *bridge.Config) { c.ReplayTimeout = 300 * time.Millisecond })
			w.start()
			for s := uint64(0); s < 3; s++ {
				w.e.publish(s, payloadOf("A", s))
			}
			if _, err := w.c.Read(w.ctx, 3); err != nil {
				t.Fatal(err)
			}
			w.e.mu.Lock()
			w.e.answer = func(_ net.Conn, zc *zmq4.Conn, from uint64) {
				for _, m := range msgs {
					zc.SendMsg(zmq4.NewMsgFrom(m...))
				}
			}
			w.e.mu.Unlock()
			w.e.publish(5, payloadOf("A", 5))
			w.e.publish(6, payloadOf("A", 6))
			time.Sleep(2 * time.Second)
			rest, err := w.c.ReadAll(w.ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("records: %s", describeShort(rest))
			for _, r := range rest {
				if r.Kind() == "" && (string(r.Value) == "p" || string(r.Value) == "x" || string(r.Value) == "q") {
					t.Errorf("garbage replay payload produced: %s@%s", r.Value, r.Headers["seq"])
				}
			}
			var last string
			if len(rest) > 0 {
				last = string(rest[len(rest)-1].Value)
			}
			if last != "A-batch-6" {
				if name == "end_with_topic" {
					// An empty answer is taken as an engine restart (documented), so the
					// connection's queued batches are dropped as stale.
					t.Logf("empty replay answer read as an engine restart: engine_restarts=%v stale=%v",
						metric(t, w.cfg, "kvindex_bridge_engine_restarts_total"),
						metric(t, w.cfg, "kvindex_bridge_messages_skipped_total", "reason", "stale_connection"))
					return
				}
				t.Errorf("stream did not continue to A-batch-6 after a garbage replay; got %s", describeShort(rest))
			}
		})
	}
}
