// Package stacktest starts the in-process kvindex stack (internal/stack) for
// tests: temp data dir, free loopback ports, fsync off, stopped and checked
// by t.Cleanup.
package stacktest

import (
	"context"
	"testing"

	"github.com/kvindex/kvindex/internal/stack"
)

// Start runs a fresh stack for the test. tune, when given, adjusts the
// config after the test defaults are set.
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
	return s
}
