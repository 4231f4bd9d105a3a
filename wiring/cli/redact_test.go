package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/wiring/cli/common"
)

// Every address flag of every role refuses an address with user
// information, in each form it can take, with an error that names the
// flag and never shows the secret; the error comes before anything is
// dialled.
func TestAddressFlagsNeverShowCredentials(t *testing.T) {
	const secret = "S3cr3t"
	forms := []struct{ name, addr string }{
		{"bare_user_password", "kvuser:" + secret + "@host-1:1234"},
		{"url_user_password", "tcp://kvuser:" + secret + "@host-1:1234"},
		{"https_user_password", "https://kvuser:" + secret + "@host-1:1234"},
		{"user_only", secret + "@host-1:1234"},
		{"url_user_only", "http://" + secret + "@host-1:1234"},
		{"escaped_password", "kvuser:" + secret + "%40x@host-1:1234"},
		{"at_in_password", "kvuser:" + secret + "@x@host-1:1234"},
		{"second_in_list", "host-0:1234,kvuser:" + secret + "@host-1:1234"},
		{"grpc_target_authority", "dns://kvuser:" + secret + "@10.0.0.53/indexd:50051"},
	}
	roles := []struct {
		cmd   string
		flags []string
		extra []string
	}{
		{cmd: "indexd", flags: []string{"--etcd-endpoints"}},
		{cmd: "ingester", flags: []string{"--etcd-endpoints", "--brokers"}},
		{cmd: "bridge", flags: []string{"--zmq", "--replay", "--brokers"}, extra: []string{"--pod", "p", "--model", "m"}},
		{cmd: "lookup", flags: []string{"--index"}, extra: []string{"--model", "m", "1"}},
		{cmd: "endpoints", flags: []string{"--index"}},
		{cmd: "replay", flags: []string{"--index", "--brokers"}, extra: []string{"--index", "host-2:1", "--brokers", "host-3:1", "scenario.jsonl"}},
	}
	for _, role := range roles {
		for _, flag := range role.flags {
			for _, form := range forms {
				t.Run(role.cmd+"/"+strings.TrimPrefix(flag, "--")+"/"+form.name, func(t *testing.T) {
					root := NewRoot()
					var out bytes.Buffer
					root.SetOut(&out)
					root.SetErr(&out)
					root.SetArgs(append(append([]string{role.cmd}, role.extra...), flag, form.addr))
					ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
					defer cancel()
					err := root.ExecuteContext(ctx)
					if err == nil {
						t.Fatalf("%s %s %s: no error", role.cmd, flag, form.addr)
					}
					for _, s := range []string{err.Error(), out.String()} {
						if strings.Contains(s, secret) {
							t.Fatalf("the secret is shown: %q", s)
						}
					}
					if !strings.Contains(err.Error(), flag) || !strings.Contains(err.Error(), "REDACTED") {
						t.Fatalf("error %q: want it to name %s and show the address redacted", err, flag)
					}
				})
			}
		}
	}
}

// Every address flag's --help default goes through the one redaction.
func TestAddressFlagDefaultsRedacted(t *testing.T) {
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	fs.StringSlice("brokers", []string{"kvuser:S3cr3t@broker:9092"}, "")
	fs.String("index", "dns://u:S3cr3t@ns/indexd:50051", "")
	common.RedactFlagDefaults(fs)
	for name, want := range map[string]string{"brokers": "[REDACTED@broker:9092]", "index": "dns://REDACTED@ns/indexd:50051"} {
		if got := fs.Lookup(name).DefValue; got != want {
			t.Errorf("--%s default %q, want %q", name, got, want)
		}
	}
	// And the commands' own help shows no credentials.
	for _, sub := range NewRoot().Commands() {
		for _, name := range common.AddressFlags {
			if f := sub.Flags().Lookup(name); f != nil && strings.Contains(f.DefValue, "@") {
				t.Errorf("%s --%s default %q carries user information", sub.Name(), name, f.DefValue)
			}
		}
	}
}
