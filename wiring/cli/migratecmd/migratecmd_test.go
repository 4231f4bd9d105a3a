package migratecmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/migrate"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testutil.LeakOptions()...) }

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	cmd := NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(io.Discard)
	cmd.SetArgs(append(args, "--log-level", "error"))
	err := cmd.ExecuteContext(ctx)
	return out.String(), err
}

// TestMigrateCommand wires the flags: a dry run writes nothing and says
// what it would, the run writes it, under --to-prefix.
func TestMigrateCommand(t *testing.T) {
	e := testutil.StartEtcd(t)
	ctx := context.Background()
	const from, to = "/old/v1/", "/new/v2/"
	ep := keyspace.Endpoint{Model: "m", Pod: "p 0", Rank: 0}
	// In this order: migrate packs a tier's blocks in insertion order
	// (their create revisions), so aa must come first.
	for _, kv := range [][2]string{
		{from + "endpoints/m/p%200/0", `{"hash_mode":"engine","last_record":"2026-12-01T12:00:00Z","topic":"t","partition":0,"lease":"0"}`},
		{from + "blocks/m/p%200/0/gpu/00000000000000aa", ""},
		{from + "blocks/m/p%200/0/gpu/00000000000000bb", ""},
		{from + "offsets/t/0", "5"},
	} {
		if _, err := e.Client.Put(ctx, kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	base := []string{"--etcd-endpoints", e.Endpoints[0], "--from-prefix", from, "--to-prefix", to}
	out, err := run(t, append(base, "--dry-run", "-o", "json")...)
	if err != nil {
		t.Fatal(err)
	}
	var rep migrate.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if !rep.DryRun || rep.Endpoints != 1 || rep.Blocks["gpu"] != 2 || rep.Chunks["gpu"] != 1 || rep.Puts != 3 {
		t.Fatalf("dry run report %+v", rep)
	}
	if resp, _ := e.Client.Get(ctx, to, clientPrefix()...); resp.Count != 0 {
		t.Fatalf("the dry run wrote %d keys", resp.Count)
	}
	out, err = run(t, base...)
	if err != nil || !strings.Contains(out, "migrated /old/v1/ to /new/v2/") || !strings.Contains(out, "3 puts") {
		t.Fatalf("run: %v\n%s", err, out)
	}
	ks, _ := keyspace.New(to)
	resp, err := e.Client.Get(ctx, ks.ChunkKey(ep, tier.GPU, 0))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("no chunk under --to-prefix: %v", err)
	}
	if v, err := keyspace.ParseChunkValue(resp.Kvs[0].Value); err != nil || v.Len() != 2 || v.Key(0) != 0xaa {
		t.Fatalf("chunk %x: %v", resp.Kvs[0].Value, err)
	}
}

func TestMigrateCommandUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--etcd-prefix", "/x/"}, "--from-prefix"},
		{[]string{"--from-prefix", "nope"}, "--from-prefix"},
		{[]string{"--chunk-size", "0"}, "--chunk-size must be positive"},
		{[]string{"-o", "yaml"}, "want text or json"},
		{[]string{"--from-prefix", "/a/", "--to-prefix", "/a/b/"}, `--from-prefix "/a/" and --to-prefix "/a/b/" overlap`},
		// Config errors name the flags, not the Go fields behind them.
		{[]string{"--chunk-size", "257"}, "--chunk-size 257: want 1 to 256"},
		{[]string{"--max-txn-ops", "2"}, "--max-txn-ops 2: want more than 2"},
	} {
		_, err := run(t, append(tc.args, "--etcd-endpoints", "http://127.0.0.1:1", "--etcd-dial-timeout", "100ms")...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
		var coded interface{ ExitCode() int }
		if !errors.As(err, &coded) || coded.ExitCode() != 2 {
			t.Errorf("%v: %v is not a usage error (exit code 2)", tc.args, err)
		}
	}
}

// TestMigrateUnreachableEtcd: with nothing listening at --etcd-endpoints,
// migrate fails after --etcd-dial-timeout, naming the endpoint, instead of
// retrying until the caller gives up (its context here allows 30 s).
func TestMigrateUnreachableEtcd(t *testing.T) {
	_, err := run(t, "--dry-run", "--etcd-endpoints", "http://127.0.0.1:1", "--etcd-dial-timeout", "200ms")
	if err == nil || !strings.Contains(err.Error(), "did not answer a read within 200ms (--etcd-dial-timeout)") ||
		!strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("error = %v, want one naming the endpoint and --etcd-dial-timeout", err)
	}
}

func clientPrefix() []clientv3.OpOption {
	return []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithCountOnly()}
}
