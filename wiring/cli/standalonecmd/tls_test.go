package standalonecmd

import (
	"context"
	"errors"
	"regexp"
	"testing"
	"time"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/internal/testcerts"
	"github.com/kvindex/kvindex/internal/testutil"
)

// TestStandaloneMutualTLS runs `kvindex standalone` with the TLS flags
// the README documents: its gRPC listener answers a client with a
// certificate of the CA and refuses plaintext and certificate-less ones.
func TestStandaloneMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, dir, "kvindex")
	srv := ca.Issue(t, "standalone", "127.0.0.1")
	router := ca.Issue(t, "router")
	cmd := NewCommand()
	cmd.SetArgs([]string{
		"--data-dir", dir + "/data",
		"--etcd-listen", "127.0.0.1:0", "--kafka-listen", "127.0.0.1:0",
		"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
		"--tls-cert-file", srv.CertFile, "--tls-key-file", srv.KeyFile, "--tls-client-ca-file", ca.File,
	})
	var out testutil.SyncBuffer
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
	out.WaitMatch(t, regexp.MustCompile(`(?m)^ready`), time.Minute)
	// The bound address, read back from what the command printed.
	grpcAddr := out.WaitMatch(t, regexp.MustCompile(`grpc: (\S+) \(mutual TLS\)`), time.Second)
	list := func(opts ...client.Option) error {
		c, err := client.New(grpcAddr, append(opts, client.WithTimeout(testutil.Timeout(5*time.Second)), client.WithMaxAttempts(1))...)
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
