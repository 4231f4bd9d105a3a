package tlsfiles

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvindex/kvindex/internal/testcerts"
	"github.com/kvindex/kvindex/internal/testutil"
)

// serve accepts TLS connections on a loopback port with cfg, finishing
// each handshake and closing, until the test ends.
func serve(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			_, _ = io.Copy(io.Discard, c) // until the client closes
			c.Close()
		}
	}()
	t.Cleanup(func() { lis.Close(); wg.Wait() })
	return lis.Addr().String()
}

// handshake dials addr with cfg and returns the server's leaf common name.
func handshake(t *testing.T, addr string, cfg *tls.Config) (string, error) {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: testutil.Timeout(5 * time.Second)}, "tcp", addr, cfg)
	if err != nil {
		return "", err
	}
	defer c.Close()
	// TLS 1.3 reports a refused client certificate on the first read.
	c.SetReadDeadline(time.Now().Add(testutil.Timeout(200 * time.Millisecond)))
	if _, err := c.Read(make([]byte, 1)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		return "", err
	}
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
}

// bump moves a file's modification time on, so a rewrite is seen even on
// a file system with coarse timestamps.
func bump(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, time.Now(), fi.ModTime().Add(2*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestServerReloadsCertificate(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, dir, "kvindex")
	base := filepath.Join(dir, "server")
	srv := ca.IssueTo(t, base, "first", "127.0.0.1")
	var logs bytes.Buffer
	cfg, err := Server(ServerFiles{CertFile: srv.CertFile, KeyFile: srv.KeyFile}, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, cfg)
	cli, err := Client(ClientFiles{CAFile: ca.File}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cn, err := handshake(t, addr, cli); err != nil || cn != "first" {
		t.Fatalf("first handshake: cn %q, err %v; want first", cn, err)
	}

	ca.IssueTo(t, base, "second", "127.0.0.1")
	bump(t, srv.CertFile, srv.KeyFile)
	if cn, err := handshake(t, addr, cli); err != nil || cn != "second" {
		t.Fatalf("after rotation: cn %q, err %v; want second", cn, err)
	}

	// A half-written rotation (a key that does not match the certificate)
	// keeps the pair loaded before, and says so once.
	other := ca.Issue(t, "other", "127.0.0.1")
	key, err := os.ReadFile(other.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(srv.KeyFile, key, 0o600); err != nil {
		t.Fatal(err)
	}
	bump(t, srv.KeyFile)
	for range 2 {
		if cn, err := handshake(t, addr, cli); err != nil || cn != "second" {
			t.Fatalf("mismatched pair: cn %q, err %v; want second kept", cn, err)
		}
	}
	if n := strings.Count(logs.String(), "cannot be loaded"); n != 1 {
		t.Fatalf("logged the failed reload %d times, want once:\n%s", n, logs.String())
	}
}

func TestServerClientCA(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, dir, "kvindex")
	rogue := testcerts.NewCA(t, dir, "rogue")
	srv := ca.Issue(t, "server", "127.0.0.1")
	cfg, err := Server(ServerFiles{CertFile: srv.CertFile, KeyFile: srv.KeyFile, ClientCAFile: ca.File}, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, cfg)
	good := ca.Issue(t, "router")
	bad := rogue.Issue(t, "intruder")
	for _, tc := range []struct {
		name   string
		files  ClientFiles
		refuse bool
	}{
		{name: "signed_client_certificate", files: ClientFiles{CAFile: ca.File, CertFile: good.CertFile, KeyFile: good.KeyFile}},
		{name: "no_client_certificate", files: ClientFiles{CAFile: ca.File}, refuse: true},
		{name: "certificate_of_another_ca", files: ClientFiles{CAFile: ca.File, CertFile: bad.CertFile, KeyFile: bad.KeyFile}, refuse: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cli, err := Client(tc.files, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, err = handshake(t, addr, cli)
			if (err != nil) != tc.refuse {
				t.Fatalf("handshake error %v, want refused=%v", err, tc.refuse)
			}
		})
	}
}

func TestClientVerifiesServer(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, dir, "kvindex")
	rogue := testcerts.NewCA(t, dir, "rogue")
	srv := ca.Issue(t, "server", "indexd.kvindex.svc")
	cfg, err := Server(ServerFiles{CertFile: srv.CertFile, KeyFile: srv.KeyFile}, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, cfg)
	for _, tc := range []struct {
		name    string
		files   ClientFiles
		wantErr string
	}{
		{name: "server_name_matches", files: ClientFiles{CAFile: ca.File, ServerName: "indexd.kvindex.svc"}},
		{name: "ip_not_in_certificate", files: ClientFiles{CAFile: ca.File}, wantErr: "127.0.0.1"},
		{name: "other_ca", files: ClientFiles{CAFile: rogue.File, ServerName: "indexd.kvindex.svc"}, wantErr: "unknown authority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cli, err := Client(tc.files, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, err = handshake(t, addr, cli)
			if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("handshake error %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestClientReloadsCertificate(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, dir, "kvindex")
	srv := ca.Issue(t, "server", "127.0.0.1")
	seen := make(chan string, 4)
	cfg, err := Server(ServerFiles{CertFile: srv.CertFile, KeyFile: srv.KeyFile, ClientCAFile: ca.File}, nil)
	if err != nil {
		t.Fatal(err)
	}
	get := cfg.GetConfigForClient
	cfg.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		c, err := get(h)
		if err != nil {
			return nil, err
		}
		c = c.Clone()
		c.VerifyPeerCertificate = func(_ [][]byte, chains [][]*x509.Certificate) error {
			seen <- chains[0][0].Subject.CommonName
			return nil
		}
		return c, nil
	}
	addr := serve(t, cfg)
	base := filepath.Join(dir, "client")
	pair := ca.IssueTo(t, base, "router-1")
	cli, err := Client(ClientFiles{CAFile: ca.File, CertFile: pair.CertFile, KeyFile: pair.KeyFile}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"router-1", "router-2"} {
		if want == "router-2" {
			ca.IssueTo(t, base, want)
			bump(t, pair.CertFile, pair.KeyFile)
		}
		if _, err := handshake(t, addr, cli); err != nil {
			t.Fatal(err)
		}
		if got := <-seen; got != want {
			t.Fatalf("server saw client %q, want %q", got, want)
		}
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, dir, "kvindex")
	pair := ca.Issue(t, "server", "127.0.0.1")
	notPEM := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	for _, tc := range []struct {
		name    string
		load    func() error
		wantErr string
	}{
		{name: "server_without_key", load: func() error { _, err := Server(ServerFiles{CertFile: pair.CertFile}, nil); return err }, wantErr: "both"},
		{name: "server_missing_cert", load: func() error {
			_, err := Server(ServerFiles{CertFile: missing, KeyFile: pair.KeyFile}, nil)
			return err
		}, wantErr: "missing.pem"},
		{name: "server_client_ca_not_pem", load: func() error {
			_, err := Server(ServerFiles{CertFile: pair.CertFile, KeyFile: pair.KeyFile, ClientCAFile: notPEM}, nil)
			return err
		}, wantErr: "no PEM certificate"},
		{name: "client_cert_without_key", load: func() error { _, err := Client(ClientFiles{CertFile: pair.CertFile}, nil); return err }, wantErr: "both"},
		{name: "client_ca_missing", load: func() error { _, err := Client(ClientFiles{CAFile: missing}, nil); return err }, wantErr: "missing.pem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.load()
			if !errors.Is(err, ErrFiles) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want ErrFiles mentioning %q", err, tc.wantErr)
			}
		})
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
