package bridge_test

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/bridge"
)

// malformedReady is a valid ZMTP 3.0 NULL greeting followed by a READY
// command whose metadata names a 1-byte property name and then ends:
// zmq4 v0.17's metadata parser (Property.Write) slices past its end and
// panics.
func malformedReady() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 0
	copy(g[12:32], "NULL")
	body := append([]byte{5}, "READY"...)
	body = append(body, 0x01, 'a')
	return append(g, append([]byte{0x04, byte(len(body))}, body...)...)
}

// malformedPeer listens on loopback and answers every connection with
// malformedReady, counting connections, until the test ends.
type malformedPeer struct {
	l  net.Listener
	mu sync.Mutex
	n  int
	wg sync.WaitGroup
}

func startMalformedPeer(t *testing.T) *malformedPeer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &malformedPeer{l: l}
	var conns []net.Conn
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.n++
			conns = append(conns, c)
			p.mu.Unlock()
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				defer c.Close()
				c.Write(malformedReady())
				io.Copy(io.Discard, c)
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		p.mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *malformedPeer) endpoint() string { return "tcp://" + p.l.Addr().String() }

func (p *malformedPeer) accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// sendMalformedReady connects to addr (host:port) and sends
// malformedReady, as anyone reaching a bind-mode bridge's port can.
func sendMalformedReady(t *testing.T, addr string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(malformedReady()); err != nil {
		t.Fatal(err)
	}
	// The bridge closes the connection once the handshake failed.
	io.Copy(io.Discard, c)
}

// TestMalformedHandshakeIsAConnectionError: a peer whose READY command
// makes zmq4 panic is a failed handshake like any other, on every socket
// the bridge speaks ZMTP with: the engine's PUB socket (redialed with
// backoff), its replay socket (the replay fails, the live stream goes
// on) and the bind mode's listener (the connection is closed, other
// publishers are served). Before, zmq4.Open's panic on the bridge's own
// goroutine crashed the whole process, so one malformed handshake, from
// the engine or from anyone who could reach the bind-mode port, took
// every endpoint's stream down.
func TestMalformedHandshakeIsAConnectionError(t *testing.T) {
	t.Run("dial_pub", func(t *testing.T) {
		e := newEnv(t, nil)
		peer := startMalformedPeer(t)
		cfg := e.config(func(c *bridge.Config) { c.Endpoint = peer.endpoint() })
		r := e.start(cfg, false)
		for peer.accepted() < 3 {
			if e.ctx.Err() != nil {
				t.Fatalf("the bridge dialed the malformed PUB socket %d times, want it redialed", peer.accepted())
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err := r.B.Ready(); err == nil {
			t.Error("ready with a PUB socket whose handshake fails")
		}
		if err := r.Stop(); err != nil {
			t.Fatal(err)
		}
		checkMetrics(t, cfg, map[string]float64{"kvindex_bridge_engine_connects_total": 0})
	})
	t.Run("dial_replay", func(t *testing.T) {
		e := newEnv(t, nil)
		peer := startMalformedPeer(t)
		cfg := e.config(func(c *bridge.Config) { c.ReplayEndpoint = peer.endpoint() })
		r := e.start(cfg, true)
		want := e.publish(3)
		check(t, "live records", want, e.read(3))
		if err := r.Stop(); err != nil {
			t.Fatal(err)
		}
		if n := metric(t, cfg, "kvindex_bridge_replay_requests_total", "outcome", "error"); n < 1 {
			t.Errorf("failed replay requests = %v, want at least 1", n)
		}
	})
	t.Run("bind", func(t *testing.T) {
		e := newBindEnv(t, nil)
		sendMalformedReady(t, e.bridgeAddr())
		be := e.addPod(0, 0, false)
		e.waitConnected(be, 1)
		e.publish(be, 3)
		e.checkAll(e.readByPod(3))
		if err := e.running.Stop(); err != nil {
			t.Fatal(err)
		}
	})
}
