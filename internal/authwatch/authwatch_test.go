package authwatch_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/kvindex/kvindex/internal/authwatch"
	"github.com/kvindex/kvindex/internal/etcdembed"
	"github.com/kvindex/kvindex/internal/kafkaauth"
	"github.com/kvindex/kvindex/internal/testcerts"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tlsfiles"
	"github.com/kvindex/kvindex/wiring/cli/common"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testutil.LeakOptions()...) }

const password = "S3cr3t-password"

// logBuffer is a concurrency-safe log sink.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// watched returns a Watch logging into a buffer, and its registry.
func watched() (*authwatch.Watch, *logBuffer, *prometheus.Registry) {
	logs := &logBuffer{}
	reg := prometheus.NewRegistry()
	return authwatch.New(reg, slog.New(slog.NewTextHandler(logs, nil))), logs, reg
}

// waitErr waits until w reports a failure.
func waitErr(t *testing.T, w *authwatch.Watch) error {
	t.Helper()
	deadline := time.Now().Add(testutil.Timeout(30 * time.Second))
	for time.Now().Before(deadline) {
		if err := w.Err(); err != nil {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no failure reported")
	return nil
}

// checkLoud checks the reason, the ERROR line and the counter of a
// failure: each names the peer's address and the mechanism, none the
// password.
func checkLoud(t *testing.T, w *authwatch.Watch, logs *logBuffer, reg *prometheus.Registry, reason, addr, mech, kind, peer string) {
	t.Helper()
	err := waitErr(t, w)
	for _, want := range []string{reason, addr, mech} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("reason %q does not name %q", err, want)
		}
	}
	line := logs.String()
	for _, want := range []string{"level=ERROR", addr, mech} {
		if !strings.Contains(line, want) {
			t.Errorf("log %q does not name %q", line, want)
		}
	}
	if strings.Contains(err.Error()+line, password) {
		t.Errorf("the password is shown: %q %q", err, line)
	}
	if n, err := promtest.GatherAndCount(reg, "kvindex_auth_failures_total"); err != nil || n == 0 {
		t.Errorf("counter: %d series, %v", n, err)
	}
	mfs, _ := reg.Gather()
	var got float64
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			var p, k string
			for _, l := range m.Label {
				switch l.GetName() {
				case "peer":
					p = l.GetValue()
				case "kind":
					k = l.GetValue()
				}
			}
			if p == peer && k == kind {
				got = m.GetCounter().GetValue()
			}
		}
	}
	if got < 1 {
		t.Errorf("kvindex_auth_failures_total{peer=%q,kind=%q} = %v, want at least 1", peer, kind, got)
	}
}

func writePassword(t *testing.T, pw string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(p, []byte(pw+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func pingKafka(t *testing.T, brokers []string, opts ...kgo.Opt) {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.RetryTimeout(time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(5*time.Second))
	defer cancel()
	_ = cl.Ping(ctx)
}

// A wrong SASL password is an ERROR naming broker and mechanism, a count
// and the readiness reason "kafka authentication failed"; the right one
// clears the reason.
func TestKafkaSASLFailureIsLoud(t *testing.T) {
	k := testutil.StartKafka(t, "t", 1, kfake.EnableSASL(), kfake.Superuser(kafkaauth.MechanismSCRAMSHA256, "kvuser", password+"-right"))
	w, logs, reg := watched()
	wrong := kafkaauth.Config{SASLMechanism: kafkaauth.MechanismSCRAMSHA256, SASLUsername: "kvuser", SASLPasswordFile: writePassword(t, password)}
	opts, err := wrong.Opts(nil)
	if err != nil {
		t.Fatal(err)
	}
	pingKafka(t, k.Brokers, append(opts, kgo.WithHooks(w.KafkaHook(wrong.SASLMechanism)))...)
	checkLoud(t, w, logs, reg, "kafka authentication failed", k.Brokers[0], "SCRAM-SHA-256", authwatch.KindSASL, authwatch.PeerKafka)

	right := wrong
	right.SASLPasswordFile = writePassword(t, password+"-right")
	if opts, err = right.Opts(nil); err != nil {
		t.Fatal(err)
	}
	pingKafka(t, k.Brokers, append(opts, kgo.WithHooks(w.KafkaHook(right.SASLMechanism)))...)
	if err := w.Err(); err != nil {
		t.Fatalf("after a connection that authenticated: %v, want nil", err)
	}
}

// A broker certificate the client does not trust is an ERROR, a count and
// the reason "kafka TLS handshake failed".
func TestKafkaTLSFailureIsLoud(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, dir, "kafka")
	other := testcerts.NewCA(t, t.TempDir(), "other")
	srv := ca.Issue(t, "broker", "127.0.0.1")
	tlsCfg, err := tlsfiles.Server(tlsfiles.ServerFiles{CertFile: srv.CertFile, KeyFile: srv.KeyFile}, nil)
	if err != nil {
		t.Fatal(err)
	}
	k := testutil.StartKafka(t, "t", 1, kfake.TLS(tlsCfg))
	w, logs, reg := watched()
	opts, err := kafkaauth.Config{TLSCAFile: other.File}.Opts(nil)
	if err != nil {
		t.Fatal(err)
	}
	pingKafka(t, k.Brokers, append(opts, kgo.WithHooks(w.KafkaHook("")))...)
	checkLoud(t, w, logs, reg, "kafka TLS handshake failed", k.Brokers[0], "TLS", authwatch.KindTLS, authwatch.PeerKafka)
}

// An etcd server certificate the client does not trust is an ERROR, a
// count and the reason "etcd TLS handshake failed", through the etcd
// flags' client (common.Etcd with Watch set).
func TestEtcdTLSFailureIsLoud(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, dir, "etcd")
	other := testcerts.NewCA(t, t.TempDir(), "other")
	srv := ca.Issue(t, "etcd", "127.0.0.1")
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	e, err := etcdembed.Start(ctx, etcdembed.Config{DataDir: filepath.Join(dir, "etcd"), ClientAddr: "127.0.0.1:0", UnsafeNoFsync: true,
		TLSCertFile: srv.CertFile, TLSKeyFile: srv.KeyFile})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	w, logs, reg := watched()
	flags := common.Etcd{Endpoints: e.Endpoints(), DialTimeout: time.Second, CACert: other.File, Watch: w}
	cli, err := flags.Client(ctx, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	getCtx, getCancel := context.WithTimeout(ctx, testutil.Timeout(3*time.Second))
	_, _ = cli.Get(getCtx, "x")
	getCancel()
	addr := strings.TrimPrefix(e.Endpoints()[0], "https://")
	checkLoud(t, w, logs, reg, "etcd TLS handshake failed", addr, "TLS", authwatch.KindTLS, authwatch.PeerEtcd)
}
