// Package stacktest starts the in-process kvindex stack (wiring/stack) for
// tests: temp data dir, free loopback ports, fsync off, stopped and checked
// by t.Cleanup.
package stacktest

import (
	"context"
	"testing"
	"time"

	"github.com/kvindex/kvindex/wiring/stack"
)

// readyTimeout bounds how long Start waits for the stack to be ready; a
// loaded 2-core machine under -race can take tens of seconds.
const readyTimeout = 90 * time.Second

// Start runs a fresh stack for the test and returns once it is ready (the
// ingester consumes and indexd serves its first snapshot), so a test's
// first Lookup never meets "index not loaded yet". tune, when given,
// adjusts the config after the test defaults are set.
func Start(t testing.TB, tune ...func(*stack.Config)) *stack.Stack {
	t.Helper()
	cfg := stack.Config{
		DataDir: t.TempDir(), EtcdAddr: "127.0.0.1:0", KafkaAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0",
		UnsafeNoFsync: true,
	}
	for _, f := range tune {
		f(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s, err := stack.Start(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("stack: %v", err)
		}
	})
	deadline := time.Now().Add(readyTimeout)
	for err := s.Ready(); err != nil; err = s.Ready() {
		if time.Now().After(deadline) {
			t.Fatalf("stack not ready after %v: %v", readyTimeout, err)
		}
		select {
		case err := <-done:
			done <- err
			t.Fatalf("stack stopped before it was ready: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return s
}
