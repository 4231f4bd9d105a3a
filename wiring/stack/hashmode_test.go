package stack

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/ingester"
	"github.com/kvindex/kvindex/internal/keyspace"
)

// TestOtherHashModeRefused: a stack started in engine mode on a data dir
// whose endpoints are in token mode (the README's tour, then
// `make run ARGS='--hash-mode engine'` without its own --data-dir) fails
// Start naming the mode and an endpoint, and leaves the endpoints as they
// were; in their own mode it starts. Before, the ingester dropped every
// token-mode endpoint's blocks at its claim, kept their sequence state
// (so producing the same records again was skipped as duplicates), and
// said so only in a metric: the data dir's index was lost for good.
func TestOtherHashModeRefused(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := func(mode keyspace.HashMode) (*Stack, error) {
		return Start(ctx, Config{DataDir: dir, EtcdAddr: "127.0.0.1:0", KafkaAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0", UnsafeNoFsync: true,
			Ingester: func(c *ingester.Config) { c.HashMode = mode }})
	}
	s, err := start(keyspace.HashModeToken)
	if err != nil {
		t.Fatal(err)
	}
	ks := keyspace.Default()
	ep := ks.EndpointKey(keyspace.Endpoint{Model: "org/m", Pod: "vllm-0"})
	rec, err := (&keyspace.EndpointRecord{HashMode: keyspace.HashModeToken, BlockSize: 16, Topic: "kvindex-events"}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Etcd().Put(ctx, ep, string(rec)); err != nil {
		t.Fatal(err)
	}
	s.close()

	if s, err := start(keyspace.HashModeEngine); err == nil {
		s.close()
		t.Fatal("an engine-mode stack started on a data dir of token-mode endpoints")
	} else if !errors.Is(err, ErrHashModeChange) || !strings.Contains(err.Error(), "1 of 1 endpoints are in token mode") || !strings.Contains(err.Error(), ep) {
		t.Fatalf("Start in engine mode = %v, want ErrHashModeChange naming the count and %s", err, ep)
	}
	s, err = start(keyspace.HashModeToken)
	if err != nil {
		t.Fatalf("Start in the data dir's own mode: %v", err)
	}
	defer s.close()
	got, err := s.Etcd().Get(ctx, ep)
	if err != nil || len(got.Kvs) != 1 || string(got.Kvs[0].Value) != string(rec) {
		t.Fatalf("the endpoint record after the refusal: %v, %v; want it unchanged", got, err)
	}
}
