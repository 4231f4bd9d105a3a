package testutil

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Proxy is a TCP proxy a test puts between a component and a server (etcd,
// say) to cut the network between them and restore it: Cut closes every
// proxied connection and refuses new ones, as a partition would.
type Proxy struct {
	l      net.Listener
	mu     sync.Mutex
	target string
	down   bool
	hung   bool
	// paused, when not nil, holds every forwarder until it is closed
	// (Resume, Cut).
	paused chan struct{}
	// accepted counts the connections accepted, refused ones included.
	accepted int
	conns    map[net.Conn]struct{}
	wg       sync.WaitGroup
}

// StartProxy listens on a free loopback port and forwards every connection
// to target (host:port) until the test ends.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{l: l, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.serve(c)
		}
	}()
	t.Cleanup(func() {
		l.Close()
		p.Cut()
		p.wg.Wait()
	})
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// Accepted is the number of connections the proxy accepted so far,
// those it refused while cut included: a client's connection attempts.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// KafkaDialer is a franz-go option that dials every broker connection,
// the seed's and those metadata names, through the proxy: a kfake
// cluster advertises its own address, which would bypass it.
func (p *Proxy) KafkaDialer() kgo.Opt {
	return kgo.Dialer(func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, p.Addr())
	})
}

// Endpoint is the proxy's address as an etcd client endpoint URL.
func (p *Proxy) Endpoint() string { return "http://" + p.Addr() }

func (p *Proxy) serve(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.accepted++
	if p.down {
		c.Close()
		return
	}
	if p.hung {
		p.conns[c] = struct{}{}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			_, _ = io.Copy(io.Discard, c)
			c.Close()
		}()
		return
	}
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.conns[c], p.conns[up] = struct{}{}, struct{}{}
	for _, pair := range [][2]net.Conn{{c, up}, {up, c}} {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.forward(pair[0], pair[1])
			pair[0].Close()
			pair[1].Close()
		}()
	}
}

// forward copies src to dst until either fails, dropping what it reads
// while the proxy is hung.
func (p *Proxy) forward(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.waitResumed()
		}
		if n > 0 && !p.isHung() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) isHung() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hung
}

// Hang keeps every connection open but forwards nothing more, either way,
// and holds new connections open without forwarding them: a server that
// stopped answering (SIGSTOP) rather than went away. Cut ends it.
func (p *Proxy) Hang() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hung = true
}

// waitResumed returns once the proxy is not paused.
func (p *Proxy) waitResumed() {
	p.mu.Lock()
	ch := p.paused
	p.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

// Pause stops forwarding, either way, without losing anything: what is
// read waits (up to one 32 KiB buffer per direction; the rest backs up in
// the sockets, so the sender sees flow control) until Resume, when it all
// arrives at once. It is what a process stopped by SIGSTOP, or starved of
// CPU, sees when it runs again: its socket's backlog, read as new. Cut
// ends it too.
func (p *Proxy) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused == nil {
		p.paused = make(chan struct{})
	}
}

// Resume forwards again what Pause held, and everything after it.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.resumeLocked()
}

func (p *Proxy) resumeLocked() {
	if p.paused != nil {
		close(p.paused)
		p.paused = nil
	}
}

// Cut closes every proxied connection and refuses new ones.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	p.resumeLocked()
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

// Restore accepts connections again, forwarding to target (host:port; an
// etcd endpoint URL's scheme is stripped), which may differ from before (a
// restarted server on new ports).
func (p *Proxy) Restore(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down, p.target = false, HostPort(target)
}

// HostPort strips the scheme of an endpoint URL ("http://h:p" → "h:p").
func HostPort(endpoint string) string {
	_, rest, found := strings.Cut(endpoint, "://")
	if !found {
		return endpoint
	}
	return rest
}
