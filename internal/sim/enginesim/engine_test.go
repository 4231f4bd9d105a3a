package enginesim

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/kvindex/kvindex/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testutil.LeakOptions()...) }

// testCtx bounds a test: every wait here is on something observable.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(20*time.Second))
	t.Cleanup(cancel)
	return ctx
}

func startEngine(t *testing.T, mod func(*Config)) *Engine {
	t.Helper()
	cfg := DefaultConfig()
	if mod != nil {
		mod(&cfg)
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// dial opens a ZMTP connection of type typ to a "tcp://" endpoint.
func dial(t *testing.T, endpoint string, typ zmq4.SocketType) (*zmq4.Conn, net.Conn) {
	t.Helper()
	raw, err := net.Dial("tcp", strings.TrimPrefix(endpoint, "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	raw.SetDeadline(time.Now().Add(testutil.Timeout(10 * time.Second)))
	zc, err := zmq4.Open(raw, null.Security(), typ, nil, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return zc, raw
}

// subscribe connects a SUB peer subscribed to everything and waits until
// the engine has registered the subscription.
func subscribe(t *testing.T, e *Engine, n int) *zmq4.Conn {
	t.Helper()
	zc, _ := dial(t, e.PubEndpoint(), zmq4.Sub)
	if err := zc.SendMsg(zmq4.NewMsg([]byte{1})); err != nil {
		t.Fatal(err)
	}
	if err := e.WaitSubscribed(testCtx(t), n); err != nil {
		t.Fatal(err)
	}
	return zc
}

type msg struct {
	Seq     uint64
	Payload string
}

func recvPub(t *testing.T, zc *zmq4.Conn) msg {
	t.Helper()
	m, err := zc.RecvMsg()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Frames) != 3 || len(m.Frames[1]) != 8 {
		t.Fatalf("PUB message has frames %q, want [topic, seq(8), payload]", m.Frames)
	}
	return msg{binary.BigEndian.Uint64(m.Frames[1]), string(m.Frames[2])}
}

// replay asks for batches from start and reads until the end marker.
func replay(t *testing.T, e *Engine, start uint64) []msg {
	t.Helper()
	zc, _ := dial(t, e.ReplayEndpoint(), zmq4.Dealer)
	if err := zc.SendMsg(zmq4.NewMsgFrom([]byte{}, seqBytes(start))); err != nil {
		t.Fatal(err)
	}
	var out []msg
	for {
		m, err := zc.RecvMsg()
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Frames) != 3 || len(m.Frames[0]) != 0 || len(m.Frames[1]) != 8 {
			t.Fatalf("replay message has frames %q, want [empty, seq(8), payload]", m.Frames)
		}
		seq := binary.BigEndian.Uint64(m.Frames[1])
		if seq == EndSeq {
			if len(m.Frames[2]) != 0 {
				t.Fatalf("end marker has a %d-byte payload", len(m.Frames[2]))
			}
			return out
		}
		out = append(out, msg{seq, string(m.Frames[2])})
	}
}

func publish(t *testing.T, e *Engine, payloads ...string) {
	t.Helper()
	for _, p := range payloads {
		if _, err := e.Publish(testCtx(t), []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
}

func msgs(first uint64, payloads ...string) []msg {
	out := make([]msg, len(payloads))
	for i, p := range payloads {
		out[i] = msg{first + uint64(i), p}
	}
	return out
}

func TestPubSub(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.Topic = "kv" })
	publish(t, e, "before") // slow joiner: nobody subscribed yet
	sub := subscribe(t, e, 1)
	publish(t, e, "a", "b")
	e.DropNext(1)
	publish(t, e, "dropped", "c")
	var got []msg
	for range 3 {
		got = append(got, recvPub(t, sub))
	}
	want := []msg{{1, "a"}, {2, "b"}, {4, "c"}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("PUB messages (-want +got):\n%s", d)
	}
	if d := cmp.Diff(msgs(0, "before", "a", "b", "dropped", "c"), replay(t, e, 0)); d != "" {
		t.Errorf("replay from 0 (-want +got):\n%s", d)
	}
	if s := e.Stats(); s.Published != 5 || s.Dropped != 1 {
		t.Errorf("stats %+v, want 5 published, 1 dropped", s)
	}
}

func TestTopicFilter(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.Topic = "kv-events" })
	zc, _ := dial(t, e.PubEndpoint(), zmq4.Sub)
	if err := zc.SendMsg(zmq4.NewMsg(append([]byte{1}, "other"...))); err != nil {
		t.Fatal(err)
	}
	// A subscription to another topic never counts as subscribed.
	ctx, cancel := context.WithTimeout(testCtx(t), 200*time.Millisecond)
	defer cancel()
	if err := e.WaitSubscribed(ctx, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitSubscribed = %v, want a deadline error", err)
	}
	if err := zc.SendMsg(zmq4.NewMsg(append([]byte{1}, "kv"...))); err != nil {
		t.Fatal(err)
	}
	if err := e.WaitSubscribed(testCtx(t), 1); err != nil {
		t.Fatal(err)
	}
}

func TestReplay(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.BufferSize = 4 })
	if got := replay(t, e, 0); len(got) != 0 {
		t.Errorf("replay of an empty buffer = %v, want nothing", got)
	}
	publish(t, e, "0", "1", "2", "3", "4", "5")
	for _, tc := range []struct {
		name  string
		start uint64
		want  []msg
	}{
		{"from_zero_gets_what_is_buffered", 0, msgs(2, "2", "3", "4", "5")},
		{"from_middle", 4, msgs(4, "4", "5")},
		{"from_newest", 5, msgs(5, "5")},
		{"past_newest", 6, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if d := cmp.Diff(tc.want, replay(t, e, tc.start)); d != "" {
				t.Errorf("replay from %d (-want +got):\n%s", tc.start, d)
			}
		})
	}
	t.Run("holes", func(t *testing.T) {
		e.DropReplay(1, 2)
		if d := cmp.Diff([]msg{{2, "2"}, {5, "5"}}, replay(t, e, 0)); d != "" {
			t.Errorf("replay with a hole (-want +got):\n%s", d)
		}
		if d := cmp.Diff(msgs(2, "2", "3", "4", "5"), replay(t, e, 0)); d != "" {
			t.Errorf("the next replay (-want +got):\n%s", d)
		}
	})
	t.Run("malformed_request_ignored", func(t *testing.T) {
		zc, _ := dial(t, e.ReplayEndpoint(), zmq4.Dealer)
		if err := zc.SendMsg(zmq4.NewMsg(seqBytes(0))); err != nil { // no empty delimiter
			t.Fatal(err)
		}
		if err := zc.SendMsg(zmq4.NewMsgFrom([]byte{}, seqBytes(5))); err != nil {
			t.Fatal(err)
		}
		m, err := zc.RecvMsg()
		if err != nil {
			t.Fatal(err)
		}
		if seq := binary.BigEndian.Uint64(m.Frames[1]); seq != 5 {
			t.Errorf("first answer has seq %d, want 5 (the malformed request answered?)", seq)
		}
		if n := e.Stats().BadReplayRequests; n != 1 {
			t.Errorf("BadReplayRequests = %d, want 1", n)
		}
	})
}

func TestRestartAndClose(t *testing.T) {
	e := startEngine(t, nil)
	sub := subscribe(t, e, 1)
	publish(t, e, "0", "1")
	recvPub(t, sub)
	recvPub(t, sub)
	pub, rep := e.PubEndpoint(), e.ReplayEndpoint()
	if err := e.Restart(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := sub.RecvMsg(); err == nil {
		t.Fatal("subscriber of the old process still receives")
	}
	if e.PubEndpoint() != pub || e.ReplayEndpoint() != rep {
		t.Errorf("endpoints moved on restart: %s %s -> %s %s", pub, rep, e.PubEndpoint(), e.ReplayEndpoint())
	}
	if got := replay(t, e, 0); len(got) != 0 {
		t.Errorf("buffer after restart = %v, want empty", got)
	}
	sub = subscribe(t, e, 1)
	publish(t, e, "new")
	if d := cmp.Diff(msg{0, "new"}, recvPub(t, sub)); d != "" {
		t.Errorf("first message after restart (-want +got):\n%s", d)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Publish(testCtx(t), nil); !errors.Is(err, ErrClosed) {
		t.Errorf("Publish after Close = %v, want ErrClosed", err)
	}
	for _, ep := range []string{pub, rep} {
		if c, err := net.Dial("tcp", strings.TrimPrefix(ep, "tcp://")); err == nil {
			c.Close()
			t.Errorf("%s still accepts after Close", ep)
		}
	}
	if err := e.Restart(testCtx(t)); !errors.Is(err, ErrClosed) {
		t.Errorf("Restart after Close = %v, want ErrClosed", err)
	}
}

func TestDisconnectAllKeepsProcess(t *testing.T) {
	e := startEngine(t, nil)
	sub := subscribe(t, e, 1)
	publish(t, e, "0")
	recvPub(t, sub)
	e.DisconnectAll()
	if _, err := sub.RecvMsg(); err == nil {
		t.Fatal("subscriber still connected after DisconnectAll")
	}
	sub = subscribe(t, e, 1)
	publish(t, e, "1")
	if d := cmp.Diff(msg{1, "1"}, recvPub(t, sub)); d != "" {
		t.Errorf("after the blip (-want +got):\n%s", d)
	}
}

func TestSlowSubscriberDropsAtHWM(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.HWM = 1 })
	sub := subscribe(t, e, 1)
	// Never read: the writer blocks once the socket buffers fill, the
	// queue of 1 fills, and Publish must still return at once.
	big := strings.Repeat("x", 1<<20)
	for range 64 {
		publish(t, e, big)
	}
	if e.Stats().HWMDrops == 0 {
		t.Error("64 MiB to a subscriber that never reads dropped nothing")
	}
	sub.Close()
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Config)
	}{
		{"bad_pub_addr", func(c *Config) { c.PubAddr = "nope" }},
		{"bad_replay_addr", func(c *Config) { c.ReplayAddr = "127.0.0.1" }},
		{"zero_buffer", func(c *Config) { c.BufferSize = 0 }},
		{"zero_hwm", func(c *Config) { c.HWM = 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tc.mod(&cfg)
			if _, err := New(cfg); !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("New = %v, want ErrInvalidConfig", err)
			}
		})
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Errorf("DefaultConfig invalid: %v", err)
	}
}

func ExampleEngine() {
	e, err := New(DefaultConfig())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()
	seq, _ := e.PublishBatch(context.Background(), Batch{TS: 1.7e9, Events: []Event{
		BlockStored{BlockHashes: []uint64{1, 2}, BlockSize: 16},
	}})
	fmt.Println("published seq", seq, "next", e.NextSeq())
	// Output: published seq 0 next 1
}

func TestReplayListenerSamePort(t *testing.T) {
	// Three engines, one replay port: each serves replays on the listener
	// ListenSamePort opened for it, also after a Restart.
	hosts := []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"}
	ls, port, err := ListenSamePort(testCtx(t), hosts)
	if err != nil {
		t.Fatal(err)
	}
	for i, h := range hosts {
		e := startEngine(t, func(c *Config) { c.ReplayListener = ls[i] })
		want := fmt.Sprintf("tcp://%s:%d", h, port)
		if got := e.ReplayEndpoint(); got != want {
			t.Fatalf("engine %d: ReplayEndpoint() = %q, want %q", i, got, want)
		}
		publish(t, e, "a")
		if d := cmp.Diff(msgs(0, "a"), replay(t, e, 0)); d != "" {
			t.Errorf("engine %d: replay (-want +got):\n%s", i, d)
		}
		if i == 0 {
			if err := e.Restart(testCtx(t)); err != nil {
				t.Fatal(err)
			}
			if got := e.ReplayEndpoint(); got != want {
				t.Fatalf("after Restart: ReplayEndpoint() = %q, want %q", got, want)
			}
		}
	}
}
