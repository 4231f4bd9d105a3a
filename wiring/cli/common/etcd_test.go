package common

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testutil"
)

func TestEtcdEndpointChecks(t *testing.T) {
	for _, tc := range []struct {
		name    string
		etcd    Etcd
		wantErr string
	}{
		{name: "plaintext", etcd: Etcd{Endpoints: []string{"http://h:2379"}}},
		{name: "tls", etcd: Etcd{Endpoints: []string{"https://h:2379"}, CACert: "ca.pem"}},
		{name: "https_with_system_roots", etcd: Etcd{Endpoints: []string{"https://h:2379"}}},
		{name: "no_scheme_follows_flags", etcd: Etcd{Endpoints: []string{"h:2379"}, CACert: "ca.pem"}},
		{name: "cacert_with_http", etcd: Etcd{Endpoints: []string{"http://h:2379"}, CACert: "ca.pem"}, wantErr: "--etcd-cacert, --etcd-cert or --etcd-key given, but endpoint http://h:2379 is plaintext"},
		{name: "client_cert_with_http", etcd: Etcd{Endpoints: []string{"https://a:2379", "http://b:2379"}, Cert: "c", Key: "k"}, wantErr: "mixes plaintext http://b:2379 and TLS https://a:2379"},
		{name: "mixed_schemes", etcd: Etcd{Endpoints: []string{"http://a:2379", "https://b:2379"}}, wantErr: "mixes"},
		{name: "no_endpoint", etcd: Etcd{}, wantErr: "--etcd-endpoints must name at least one etcd endpoint"},
		{name: "empty_endpoint", etcd: Etcd{Endpoints: []string{"http://a:2379", " "}}, wantErr: "--etcd-endpoints has an empty endpoint"},
		{name: "credentials_in_url", etcd: Etcd{Endpoints: []string{"https://alice:s3cret@h:2379"}}, wantErr: "https://REDACTED@h:2379 carries credentials"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.etcd.checkEndpoints()
			if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("checkEndpoints = %v, want %q", err, tc.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), "s3cret") {
				t.Fatalf("the error shows the password: %v", err)
			}
		})
	}
}

func TestEtcdClientRefusesBeforeDialling(t *testing.T) {
	// The scheme check runs first: a TLS flag with an http:// endpoint
	// never reaches the network (the CA file does not even exist).
	e := Etcd{Endpoints: []string{"http://127.0.0.1:1"}, CACert: filepath.Join(t.TempDir(), "missing.pem"), DialTimeout: time.Second}
	if _, err := e.Client(context.Background(), slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "is plaintext") {
		t.Fatalf("Client = %v, want the scheme refusal", err)
	}
}

// TestEtcdCACertWithoutPEM: a --etcd-cacert file that holds no
// certificate is refused before dialling, naming the flag (etcd's own
// TLS loader would take it and fail every handshake).
func TestEtcdCACertWithoutPEM(t *testing.T) {
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e := Etcd{Endpoints: []string{"https://127.0.0.1:1"}, CACert: ca, DialTimeout: time.Second}
	if _, err := e.Client(context.Background(), slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "--etcd-cacert: "+ca+" holds no PEM certificate") {
		t.Fatalf("Client = %v, want --etcd-cacert refused", err)
	}
	e.CACert = filepath.Join(t.TempDir(), "missing.pem")
	if _, err := e.Client(context.Background(), slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "--etcd-cacert:") {
		t.Fatalf("Client = %v, want a missing --etcd-cacert refused", err)
	}
}

func TestEtcdPasswordFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name    string
		etcd    Etcd
		want    string
		wantErr string
	}{
		{name: "none", etcd: Etcd{}},
		{name: "trailing_newline_dropped", etcd: Etcd{Username: "u", PasswordFile: write("a", "pa ss\n")}, want: "pa ss"},
		{name: "crlf_dropped", etcd: Etcd{Username: "u", PasswordFile: write("b", "pw\r\n")}, want: "pw"},
		{name: "only_one_newline_dropped", etcd: Etcd{Username: "u", PasswordFile: write("c", "pw\n\n")}, want: "pw\n"},
		{name: "empty", etcd: Etcd{Username: "u", PasswordFile: write("d", "\n")}, wantErr: "empty password"},
		{name: "missing", etcd: Etcd{Username: "u", PasswordFile: filepath.Join(dir, "nope")}, wantErr: "--etcd-password-file"},
		{name: "user_without_file", etcd: Etcd{Username: "u"}, wantErr: "go together"},
		{name: "file_without_user", etcd: Etcd{PasswordFile: write("e", "pw")}, wantErr: "go together"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.etcd.password()
			if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) || got != tc.want {
				t.Fatalf("password = %q, %v; want %q, %q", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// TestEtcdWrongPasswordNotShown dials an etcd with auth on using a wrong
// password: the error and every log line of the client leave it out.
func TestEtcdWrongPasswordNotShown(t *testing.T) {
	e := testutil.StartEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	for _, step := range []func() error{
		func() error { _, err := e.Client.UserAdd(ctx, "root", "root-password"); return err },
		func() error { _, err := e.Client.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := e.Client.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	const secret = "not-the-root-password-51b7"
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	f := Etcd{Endpoints: e.Endpoints, DialTimeout: testutil.Timeout(5 * time.Second), Username: "root", PasswordFile: pw}
	cli, err := f.Client(ctx, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err == nil {
		_, err = cli.Get(ctx, "/kvindex/")
		cli.Close()
	}
	if err == nil {
		t.Fatal("a wrong password was accepted")
	}
	if strings.Contains(err.Error()+logs.String(), secret) {
		t.Fatalf("the password shows: %v\n%s", err, logs.String())
	}
}

// TestEtcdReach: Reach passes on a reachable etcd, and tells a read
// etcd refused (a user without a role on the key) from one it never
// answered, naming the endpoints either way.
func TestEtcdReach(t *testing.T) {
	e := testutil.StartEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("reader-password\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, step := range []func() error{
		func() error { _, err := e.Client.UserAdd(ctx, "root", "root-password"); return err },
		func() error { _, err := e.Client.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := e.Client.UserAdd(ctx, "nobody", "reader-password"); return err },
		func() error { _, err := e.Client.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	root := filepath.Join(t.TempDir(), "root")
	if err := os.WriteFile(root, []byte("root-password"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		f       Etcd
		wantErr string
	}{
		{"allowed", Etcd{Endpoints: e.Endpoints, Username: "root", PasswordFile: root}, ""},
		{"refused", Etcd{Endpoints: e.Endpoints, Username: "nobody", PasswordFile: pw}, "refused a read of \"/kvindex/v2/\""},
		{"unreachable", Etcd{Endpoints: []string{"http://127.0.0.1:1"}}, "[http://127.0.0.1:1] did not answer a read within 300ms (--etcd-dial-timeout)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Authenticating takes etcd a bcrypt hash, so only the
			// unreachable case gets the short timeout it names.
			tc.f.DialTimeout = testutil.Timeout(5 * time.Second)
			if tc.name == "unreachable" {
				tc.f.DialTimeout = 300 * time.Millisecond
			}
			cli, err := tc.f.Client(ctx, log)
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			err = tc.f.Reach(ctx, cli, "/kvindex/v2/")
			if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("Reach = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestValidateBrokers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		brokers []string
		wantErr string
	}{
		{name: "plain", brokers: []string{"b-0:9092", "b-1:9093"}},
		{name: "credentials", brokers: []string{"b-0:9092", "alice:kpw@b-1:9092"}, wantErr: "REDACTED@b-1:9092 carries credentials"},
		{name: "none", brokers: nil}, // the caller's to judge
		{name: "only_a_comma", brokers: []string{"", ""}, wantErr: `--brokers has an empty entry (",")`},
		{name: "empty_entry", brokers: []string{"b-0:9092", " "}, wantErr: "--brokers has an empty entry"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := (&Kafka{Brokers: tc.brokers}).ValidateBrokers()
			if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("ValidateBrokers = %v, want %q", err, tc.wantErr)
			}
			if err != nil && !errors.Is(err, ErrUsage) {
				t.Fatalf("ValidateBrokers = %v, want a usage error (exit 2)", err)
			}
			if err != nil && strings.Contains(err.Error(), "kpw") {
				t.Fatalf("the error shows the password: %v", err)
			}
		})
	}
}

// TestEtcdReconnectBackoff: while etcd is unreachable the client keeps
// trying at least every ReconnectMaxDelay, so it is back soon after etcd
// is. gRPC's default backoff (1 s, growing 1.6 times to 120 s) makes 3 or
// 4 attempts in the first 4 s; capped at 200 ms it makes over a dozen.
func TestEtcdReconnectBackoff(t *testing.T) {
	t.Parallel()
	e := testutil.StartEtcd(t)
	px := testutil.StartProxy(t, testutil.HostPort(e.Endpoints[0]))
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	f := Etcd{Endpoints: []string{px.Endpoint()}, DialTimeout: testutil.Timeout(5 * time.Second), ReconnectMaxDelay: 200 * time.Millisecond}
	cli, err := f.Client(ctx, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Get(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	px.Cut()
	before := px.Accepted()
	time.Sleep(4 * time.Second)
	if n := px.Accepted() - before; n < 8 {
		t.Errorf("%d connection attempts in 4 s with etcd unreachable, want at least 8 (one per 200 ms, less jitter)", n)
	}
	px.Restore(e.Endpoints[0])
	if _, err := cli.Get(ctx, "k"); err != nil {
		t.Fatalf("after etcd came back: %v", err)
	}
}
