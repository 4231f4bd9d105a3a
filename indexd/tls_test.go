package indexd

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/internal/testcerts"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
	"github.com/kvindex/kvindex/internal/tlsfiles"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// plainConn dials addr in plaintext (what kubelet's gRPC probe does).
func plainConn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// waitHealthServing asks the health port on conn until it says SERVING
// (Check: the health port serves no Watch).
func waitHealthServing(t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	for {
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: serviceName}, grpc.WaitForReady(true))
		if err != nil && ctx.Err() != nil {
			t.Fatalf("waiting for SERVING on the health port: %v", err)
		}
		if err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestMutualTLS serves the API with mutual TLS and a plaintext health
// port: a client with a certificate of the CA looks blocks up; plaintext
// clients, clients without a certificate and clients with a certificate
// of another CA are refused; the health port answers health only; a
// rotated server certificate is served to new connections with no
// restart.
func TestMutualTLS(t *testing.T) {
	e := testutil.StartEtcd(t)
	w := newWriter(t, e.Client)
	w.commit(w.put(blk(pod0, tier.GPU, 1)), w.put(blk(pod0, tier.GPU, 2)))

	dir := t.TempDir()
	ca := testcerts.NewCA(t, dir, "kvindex")
	rogue := testcerts.NewCA(t, dir, "rogue")
	serverBase := filepath.Join(dir, "indexd")
	srvPair := ca.IssueTo(t, serverBase, "indexd", "indexd.kvindex.svc", "127.0.0.1")
	router := ca.Issue(t, "router")
	intruder := rogue.Issue(t, "intruder")
	tlsCfg, err := tlsfiles.Server(tlsfiles.ServerFiles{CertFile: srvPair.CertFile, KeyFile: srvPair.KeyFile, ClientCAFile: ca.File}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := startReplica(t, e.Client, func(c *Config) { c.TLS, c.HealthListenAddr = tlsCfg, "127.0.0.1:0" })
	healthConn := plainConn(t, r.srv.HealthAddr().String())
	waitHealthServing(t, healthConn)

	addr := r.srv.Addr().String()
	lookup := func(opts ...client.Option) (*client.LookupResult, error) {
		t.Helper()
		cl, err := client.New(addr, append(opts, client.WithTimeout(testutil.Timeout(2*time.Second)), client.WithMaxAttempts(1))...)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		return cl.Lookup(context.Background(), model, []uint64{1, 2})
	}

	t.Run("client_certificate_accepted", func(t *testing.T) {
		res, err := lookup(client.WithTLSCAFile(ca.File), client.WithTLSCertFiles(router.CertFile, router.KeyFile))
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Matches) != 1 || res.Matches[0].Blocks != 2 {
			t.Fatalf("matches %+v, want vllm-0 with 2 blocks", res.Matches)
		}
	})
	t.Run("server_name_option", func(t *testing.T) {
		if _, err := lookup(client.WithTLSCAFile(ca.File), client.WithTLSCertFiles(router.CertFile, router.KeyFile),
			client.WithTLSServerName("indexd.kvindex.svc")); err != nil {
			t.Fatal(err)
		}
		if _, err := lookup(client.WithTLSCAFile(ca.File), client.WithTLSCertFiles(router.CertFile, router.KeyFile),
			client.WithTLSServerName("other.kvindex.svc")); !errors.Is(err, client.ErrUnavailable) {
			t.Fatalf("a server name the certificate lacks: %v, want ErrUnavailable", err)
		}
	})
	t.Run("address_list", func(t *testing.T) {
		// A list of one host checks the certificate against that host;
		// a list of different hosts needs the server name.
		mtls := []client.Option{client.WithTLSCAFile(ca.File), client.WithTLSCertFiles(router.CertFile, router.KeyFile),
			client.WithTimeout(testutil.Timeout(2 * time.Second)), client.WithMaxAttempts(1)}
		_, port, _ := net.SplitHostPort(addr)
		for _, tc := range []struct {
			target  string
			opts    []client.Option
			wantNew error
		}{
			{target: addr + "," + addr},
			{target: addr + ",localhost:" + port, wantNew: client.ErrInvalidArgument},
			{target: addr + ",localhost:" + port, opts: []client.Option{client.WithTLSServerName("indexd.kvindex.svc")}},
		} {
			cl, err := client.New(tc.target, append(slices.Clone(mtls), tc.opts...)...)
			if tc.wantNew != nil {
				if !errors.Is(err, tc.wantNew) || !strings.Contains(err.Error(), "WithTLSServerName") {
					t.Errorf("%s: New = %v, want %v naming WithTLSServerName", tc.target, err, tc.wantNew)
				}
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := cl.Lookup(context.Background(), model, []uint64{1, 2}); err != nil {
				t.Errorf("%s: %v", tc.target, err)
			}
			cl.Close()
		}
	})
	for _, tc := range []struct {
		name string
		opts []client.Option
	}{
		{name: "plaintext_refused"},
		{name: "no_client_certificate_refused", opts: []client.Option{client.WithTLSCAFile(ca.File)}},
		{name: "certificate_of_another_ca_refused", opts: []client.Option{client.WithTLSCAFile(ca.File), client.WithTLSCertFiles(intruder.CertFile, intruder.KeyFile)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if res, err := lookup(tc.opts...); !errors.Is(err, client.ErrUnavailable) {
				t.Fatalf("Lookup = %+v, %v; want ErrUnavailable", res, err)
			}
		})
	}
	t.Run("health_port_serves_health_only", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		_, err := kvindexv1.NewIndexServiceClient(healthConn).Lookup(ctx, &kvindexv1.LookupRequest{Model: model, BlockHashes: []uint64{1}})
		if status.Code(err) != codes.Unimplemented {
			t.Fatalf("Lookup on the health port: %v, want Unimplemented", err)
		}
		stream, err := reflectionpb.NewServerReflectionClient(healthConn).ServerReflectionInfo(ctx)
		if err == nil {
			_, err = stream.Recv()
		}
		if status.Code(err) != codes.Unimplemented {
			t.Fatalf("reflection on the health port: %v, want Unimplemented", err)
		}
	})
	t.Run("rotated_certificate_without_restart", func(t *testing.T) {
		ca2 := testcerts.NewCA(t, t.TempDir(), "kvindex-next")
		ca2.IssueTo(t, serverBase, "indexd", "127.0.0.1")
		for _, f := range []string{srvPair.CertFile, srvPair.KeyFile} {
			fi, err := os.Stat(f)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(f, time.Now(), fi.ModTime().Add(2*time.Second)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := lookup(client.WithTLSCAFile(ca2.File), client.WithTLSCertFiles(router.CertFile, router.KeyFile)); err != nil {
			t.Fatalf("a client trusting the new CA: %v", err)
		}
		if _, err := lookup(client.WithTLSCAFile(ca.File), client.WithTLSCertFiles(router.CertFile, router.KeyFile)); !errors.Is(err, client.ErrUnavailable) {
			t.Fatalf("a client trusting only the old CA: %v, want ErrUnavailable", err)
		}
	})
}

// Reflection is off by default (it describes the API to any client that
// connects) and served with Config.Reflection.
func TestReflectionOffByDefault(t *testing.T) {
	e := testutil.StartEtcd(t)
	for _, tc := range []struct {
		name string
		on   bool
		want codes.Code
	}{
		{name: "default_off", want: codes.Unimplemented},
		{name: "on", on: true, want: codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startReplica(t, e.Client, func(c *Config) {
				if tc.on {
					c.Reflection = true
				}
			})
			r.waitServing(t)
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			stream, err := reflectionpb.NewServerReflectionClient(r.conn).ServerReflectionInfo(ctx)
			if err == nil {
				// Send says io.EOF once the server has ended the stream (as it
				// does at once for a service it does not serve); Recv then
				// returns the status it ended it with.
				err = stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
				if err == nil || errors.Is(err, io.EOF) {
					_, err = stream.Recv()
				}
			}
			if status.Code(err) != tc.want {
				t.Fatalf("reflection (Reflection=%v): %v, want %v", tc.on, err, tc.want)
			}
		})
	}
}

func TestClientTLSFileErrors(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, dir, "kvindex")
	pair := ca.Issue(t, "router")
	for _, tc := range []struct {
		name string
		opt  client.Option
	}{
		{name: "missing_ca_file", opt: client.WithTLSCAFile(filepath.Join(dir, "missing.pem"))},
		{name: "ca_file_not_pem", opt: client.WithTLSCAFile(pair.KeyFile)},
		{name: "cert_without_key", opt: client.WithTLSCertFiles(pair.CertFile, "")},
		{name: "mismatched_pair", opt: client.WithTLSCertFiles(pair.CertFile, ca.File)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl, err := client.New("127.0.0.1:1", tc.opt)
			if !errors.Is(err, client.ErrInvalidArgument) {
				if cl != nil {
					cl.Close()
				}
				t.Fatalf("New = %v, want ErrInvalidArgument", err)
			}
		})
	}
}
