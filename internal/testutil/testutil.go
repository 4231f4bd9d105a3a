// Package testutil starts the real components kvindex's tests run against:
// an embedded etcd on free loopback ports in a temp dir, and franz-go's
// in-process kfake Kafka broker. Everything started is stopped by t.Cleanup.
package testutil

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvindex/kvindex/internal/etcdembed"
)

// Etcd is a running embedded etcd and a client connected to it.
type Etcd struct {
	Server *etcdembed.Server
	Client *clientv3.Client
	// Endpoints are the client URLs, for components that dial their own
	// clients.
	Endpoints []string
	// Dir is the data directory (reusable by RestartEtcd).
	Dir string
}

// EtcdOption adjusts the embedded etcd's config.
type EtcdOption func(*etcdembed.Config)

// WithMaxTxnOps sets etcd's --max-txn-ops.
func WithMaxTxnOps(n uint) EtcdOption { return func(c *etcdembed.Config) { c.MaxTxnOps = n } }

// WithMaxRequestBytes sets etcd's --max-request-bytes.
func WithMaxRequestBytes(n uint) EtcdOption {
	return func(c *etcdembed.Config) { c.MaxRequestBytes = n }
}

// StartEtcd starts an embedded etcd in a temp dir on free loopback ports,
// with fsync off (tests need no durability), and a client for it.
func StartEtcd(t testing.TB, opts ...EtcdOption) *Etcd {
	t.Helper()
	return startEtcd(t, t.TempDir(), opts...)
}

// RestartEtcd starts a new embedded etcd on the data directory of a
// stopped one: the same data, new ports.
func RestartEtcd(t testing.TB, dir string, opts ...EtcdOption) *Etcd {
	t.Helper()
	return startEtcd(t, dir, opts...)
}

func startEtcd(t testing.TB, dir string, opts ...EtcdOption) *Etcd {
	t.Helper()
	cfg := etcdembed.Config{DataDir: filepath.Join(dir, "etcd"), ClientAddr: "127.0.0.1:0", UnsafeNoFsync: true}
	for _, o := range opts {
		o(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), Timeout(30*time.Second))
	defer cancel()
	// etcdembed.Start picks again when a free port it picked is taken
	// before etcd listens on it.
	srv, err := etcdembed.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("starting embedded etcd: %v", err)
	}
	cli, err := NewEtcdClient(srv.Endpoints())
	if err != nil {
		srv.Close()
		t.Fatalf("etcd client: %v", err)
	}
	e := &Etcd{Server: srv, Client: cli, Endpoints: srv.Endpoints(), Dir: dir}
	t.Cleanup(e.Stop)
	return e
}

// Stop closes the client and the server; safe to call more than once.
func (e *Etcd) Stop() {
	if e.Client != nil {
		e.Client.Close()
		e.Client = nil
	}
	if e.Server != nil {
		e.Server.Close()
		e.Server = nil
	}
}

// NewEtcdClient dials a test client to endpoints.
func NewEtcdClient(endpoints []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: Timeout(5 * time.Second),
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		Logger:      nil,
	})
}

// mainModule is the module path of the repository root's go.mod.
const mainModule = "github.com/kvindex/kvindex"

// RepoRoot returns the repository root: the directory whose go.mod is the
// main module's, found by walking up from the test's working directory
// (past the go.mod of a nested module such as deploy/).
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && isMainModule(b) {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod of module github.com/kvindex/kvindex above the working directory")
		}
		dir = parent
	}
}

// isMainModule reports whether gomod declares the main module.
func isMainModule(gomod []byte) bool {
	for line := range strings.Lines(string(gomod)) {
		if path, ok := strings.CutPrefix(line, "module "); ok {
			return strings.TrimSpace(path) == mainModule
		}
	}
	return false
}

// ScenarioGlob is the glob of the bundled scenario fixtures.
func ScenarioGlob(t testing.TB) string {
	return filepath.Join(RepoRoot(t), "testdata", "fixtures", "scenarios", "*.jsonl")
}

// LeakOptions are the goleak options for packages that run embedded etcd
// and kfake in-process: it ignores the process-wide goroutines those
// libraries start once and never stop (they are not ours to own).
func LeakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreTopFunction("github.com/golang/glog.(*fileSink).flushDaemon"),
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/pkg/v3/logutil.init.0.func1"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
	}
}
