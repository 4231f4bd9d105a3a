package gie_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/router/gie"
)

// hangingListener accepts TCP connections and never answers: an indexd
// that hangs (or a port some other process holds).
func hangingListener(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return l.Addr().String()
}

// TestHangingReplicasFallBackInTime: of three indexd replicas one hangs
// (accepts, never answers), one is down (refuses), one hangs too. Every
// PrepareRequestData, given a context without a deadline, comes back
// (bounded by lookupTimeout, not by the caller) and falls back. No wall
// time is asserted beyond a hang: the bound is the plugin's own timer.
func TestHangingReplicasFallBackInTime(t *testing.T) {
	target := hangingListener(t) + "," + deadTarget(t) + "," + hangingListener(t)
	m := gie.NewMetrics()
	p := newProducer(t, m, map[string]any{"target": target, "lookupTimeout": "100ms", "fallback": "none"})
	eps := endpoints(3)
	for i := range 5 {
		req := tokenized(strings.Repeat("x", 64))
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = p.PrepareRequestData(context.Background(), req, eps)
		}()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("request %d: PrepareRequestData still running after 30 s with lookupTimeout 100ms", i)
		}
	}
	if n := fallbacks(t, m, gie.FallbackNone, gie.KindDeadline) + fallbacks(t, m, gie.FallbackNone, gie.KindUnavailable); n != 5 {
		t.Errorf("%v deadline or unavailable fallbacks after 5 requests, want 5", n)
	}
}
