package standalonecmd

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/internal/testcerts"
	"github.com/kvindex/kvindex/internal/testutil"
)

// syncBuffer is a bytes.Buffer safe for the command's writes and the
// test's reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestStandaloneMutualTLS runs `kvindex standalone` with the TLS flags
// the README documents: its gRPC listener answers a client with a
// certificate of the CA and refuses plaintext and certificate-less ones.
func TestStandaloneMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, dir, "kvindex")
	srv := ca.Issue(t, "standalone", "127.0.0.1")
	router := ca.Issue(t, "router")
	grpcAddr := testutil.FreeAddr(t)

	cmd := NewCommand()
	cmd.SetArgs([]string{
		"--data-dir", dir + "/data",
		"--etcd-listen", testutil.FreeAddr(t), "--kafka-listen", testutil.FreeAddr(t),
		"--listen", grpcAddr, "--metrics-listen", testutil.FreeAddr(t),
		"--tls-cert-file", srv.CertFile, "--tls-key-file", srv.KeyFile, "--tls-client-ca-file", ca.File,
	})
	var out syncBuffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("standalone: %v\n%s", err, out.String())
		}
	}()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(out.String(), "ready") {
		if time.Now().After(deadline) {
			t.Fatalf("standalone not ready after a minute:\n%s", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if want := "grpc: " + grpcAddr + " (mutual TLS)"; !strings.Contains(out.String(), want) {
		t.Fatalf("output lacks %q:\n%s", want, out.String())
	}
	list := func(opts ...client.Option) error {
		c, err := client.New(grpcAddr, append(opts, client.WithTimeout(5*time.Second), client.WithMaxAttempts(1))...)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, err = c.ListEndpoints(context.Background(), "")
		return err
	}
	if err := list(client.WithTLSCAFile(ca.File), client.WithTLSCertFiles(router.CertFile, router.KeyFile)); err != nil {
		t.Fatalf("ListEndpoints with a client certificate: %v", err)
	}
	for name, opts := range map[string][]client.Option{"plaintext": nil, "no_certificate": {client.WithTLSCAFile(ca.File)}} {
		if err := list(opts...); !errors.Is(err, client.ErrUnavailable) {
			t.Errorf("%s: ListEndpoints = %v, want ErrUnavailable", name, err)
		}
	}
}
