package opsserver

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/kvindex/kvindex/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestEndpoints(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "kvindex_test_things_total", Help: "things"})
	reg.MustRegister(c)
	c.Add(3)
	var mu sync.Mutex
	readyErr := errors.New("first list not applied")
	page := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "the role's page") })
	s, err := New(Config{Addr: "127.0.0.1:0", Registry: reg, Ready: func() error { mu.Lock(); defer mu.Unlock(); return readyErr },
		Handlers: map[string]http.Handler{"/status": page}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + s.Addr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, "kvindex_test_things_total 3") {
		t.Fatalf("/metrics = %d %q", code, body)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("/healthz = %d", code)
	}
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "first list not applied") {
		t.Fatalf("/readyz = %d %q, want 503 with the reason", code, body)
	}
	mu.Lock()
	readyErr = nil
	mu.Unlock()
	if code, _ := get("/readyz"); code != 200 {
		t.Fatalf("/readyz = %d after ready", code)
	}
	if code, _ := get("/debug/pprof/"); code != 404 {
		t.Fatalf("pprof served without Config.Pprof: %d", code)
	}
	if code, body := get("/status"); code != 200 || body != "the role's page" {
		t.Fatalf("/status = %d %q, want the extra handler's page", code, body)
	}
}

// TestHandlerClashFailsInNew: an extra route on one of the server's own
// patterns is an error from New, not a panic.
func TestHandlerClashFailsInNew(t *testing.T) {
	_, err := New(Config{Addr: "127.0.0.1:0", Registry: prometheus.NewRegistry(), Handlers: map[string]http.Handler{"/metrics": http.NotFoundHandler()}})
	if err == nil || !strings.Contains(err.Error(), `route "/metrics"`) {
		t.Fatalf("New with a clashing route: %v, want an error naming it", err)
	}
}

func TestBusyAddressFailsInNew(t *testing.T) {
	s, err := New(Config{Addr: "127.0.0.1:0", Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.l.Close()
	if _, err := New(Config{Addr: s.Addr(), Registry: prometheus.NewRegistry()}); err == nil || !strings.Contains(err.Error(), s.Addr()) {
		t.Fatalf("second New on %s: %v, want an error naming the address", s.Addr(), err)
	}
}

// Idle keep-alive connections are closed by the server after IdleTimeout,
// so a crowd of idle clients cannot exhaust the process's descriptors.
func TestIdleKeepAliveConnectionsAreClosed(t *testing.T) {
	const conns = 50
	s, err := New(Config{Addr: "127.0.0.1:0", Registry: prometheus.NewRegistry(), IdleTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	var open []net.Conn
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	for range conns {
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, c)
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.Close {
			t.Fatal("the server closes after one request; the test needs keep-alive")
		}
	}
	// Every connection now idles: each must be closed by the server.
	for i, c := range open {
		if err := c.SetReadDeadline(time.Now().Add(testutil.Timeout(5 * time.Second))); err != nil {
			t.Fatal(err)
		}
		if n, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Fatalf("idle connection %d: read %d bytes, %v; want EOF (closed by the server)", i, n, err)
		}
	}
}
