package ingester

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testutil.LeakOptions()...) }

// env is one embedded etcd and one kfake cluster shared by a test's
// ingesters.
type env struct {
	etcd  *testutil.Etcd
	kafka *testutil.Kafka
	prod  *kgo.Client
}

func newEnv(t *testing.T, partitions int32, topics []string, etcdOpts ...testutil.EtcdOption) *env {
	t.Helper()
	e := &env{etcd: testutil.StartEtcd(t, etcdOpts...)}
	e.kafka = testutil.StartKafka(t, topics[0], partitions, kfake.SeedTopics(partitions, topics...), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	e.prod = ingesttestProducer(t, e.kafka.Brokers)
	return e
}

// testLogger logs to stderr when KVINDEX_TEST_LOG is set, else nowhere.
func testLogger() *slog.Logger {
	if lv := os.Getenv("KVINDEX_TEST_LOG"); lv != "" {
		var l slog.Level
		_ = l.UnmarshalText([]byte(lv))
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l}))
	}
	return slog.New(slog.DiscardHandler)
}

// config returns a Config for topic under prefix with test-sized timeouts.
func (e *env) config(t *testing.T, topic, group, prefix string) Config {
	t.Helper()
	ks, err := keyspace.New(prefix)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Etcd = e.etcd.Client
	cfg.Brokers = e.kafka.Brokers
	cfg.Topic = topic
	cfg.Group = group
	cfg.Keyspace = ks
	cfg.SessionTimeout = time.Second
	cfg.RebalanceTimeout = 1500 * time.Millisecond
	cfg.LeaseTTL = 10 * time.Second
	cfg.Logger = testLogger()
	// The public fixtures and most tests name blocks by engine hash; the
	// token-mode tests (token_test.go) set HashModeToken.
	cfg.HashMode = keyspace.HashModeEngine
	return cfg
}

// running is an ingester started by start.
type running struct {
	in       *Ingester
	cancel   context.CancelFunc
	done     chan error
	assigned chan struct{} // signalled after every assignment change
}

// start runs an ingester with cfg until the test ends or stop is called.
func start(t *testing.T, cfg Config) *running {
	t.Helper()
	assigned := make(chan struct{}, 1)
	prev := cfg.OnAssigned
	cfg.OnAssigned = func(ps []int32) {
		if prev != nil {
			prev(ps)
		}
		select {
		case assigned <- struct{}{}:
		default:
		}
	}
	in, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{in: in, cancel: cancel, done: make(chan error, 1), assigned: assigned}
	go func() { r.done <- in.Run(ctx) }()
	t.Cleanup(func() {
		if err := r.stop(); err != nil {
			t.Errorf("ingester Run: %v", err)
		}
	})
	return r
}

// stop cancels the ingester and returns Run's error (nil for a clean stop).
func (r *running) stop() error {
	r.cancel()
	err, ok := <-r.done
	if !ok {
		return nil
	}
	close(r.done)
	return err
}

// wait waits for Run to return by itself (a crash) and returns its error.
func (r *running) wait(ctx context.Context) error {
	select {
	case err := <-r.done:
		close(r.done)
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitOwned waits until the ingester owns at least n partitions.
func (r *running) waitOwned(t *testing.T, ctx context.Context, n int) {
	t.Helper()
	for len(r.in.Partitions()) < n {
		select {
		case <-r.assigned:
		case <-ctx.Done():
			t.Fatalf("owning %v, waited for %d partitions: %v", r.in.Partitions(), n, ctx.Err())
		}
	}
}

var errCrash = errors.New("injected crash")

// blockCount counts the blocks of id in etcd (the entries of its chunks).
func blockCount(t *testing.T, ctx context.Context, e *env, ks keyspace.Keyspace, id keyspace.Endpoint) int {
	t.Helper()
	n := 0
	for _, c := range ingesttest.Chunks(t, ctx, e.etcd.Client, ks) {
		if c.Endpoint == id {
			n += len(c.Entries)
		}
	}
	return n
}

// chunkKeyOf returns the key of the chunk of (id, t) that holds hash, or
// "" when none does.
func chunkKeyOf(t *testing.T, ctx context.Context, e *env, ks keyspace.Keyspace, id keyspace.Endpoint, tr tier.Tier, hash uint64) string {
	t.Helper()
	for _, c := range ingesttest.Chunks(t, ctx, e.etcd.Client, ks) {
		if c.Endpoint != id || c.Tier != tr {
			continue
		}
		for _, en := range c.Entries {
			if en.Key == hash {
				return c.Key
			}
		}
	}
	return ""
}
