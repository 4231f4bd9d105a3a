package opsserver

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestEndpoints(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "kvindex_test_things_total", Help: "things"})
	reg.MustRegister(c)
	c.Add(3)
	var mu sync.Mutex
	readyErr := errors.New("first list not applied")
	s, err := New(Config{Addr: "127.0.0.1:0", Registry: reg, Ready: func() error { mu.Lock(); defer mu.Unlock(); return readyErr }})
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
