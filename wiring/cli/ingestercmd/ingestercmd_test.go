package ingestercmd

import (
	"context"
	"errors"
	"io"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/kvindex/kvindex/ingester"
	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testutil.LeakOptions()...) }

// TestIngesterCommand runs `kvindex ingester` against embedded etcd and
// kfake: it registers ingesters/{id} with the partitions it owns and stops
// cleanly when its context ends.
func TestIngesterCommand(t *testing.T) {
	e := testutil.StartEtcd(t)
	k := testutil.StartKafka(t, "events", 2)
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	cmd := NewCommand()
	cmd.SetArgs([]string{
		"--etcd-endpoints", strings.Join(e.Endpoints, ","),
		"--brokers", strings.Join(k.Brokers, ","),
		"--topic", "events",
		"--group", "cmd-test",
		"--id", "ingester-1",
		"--metrics-listen", "127.0.0.1:0",
		"--log-level", "error",
	})
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(runCtx) }()

	ks := keyspace.Default()
	ingesttest.WaitFor(t, ctx, e.Client, ks.IngestersPrefix(), "ingesters/ingester-1 to list both partitions", func() bool {
		resp, err := e.Client.Get(ctx, ks.IngesterKey("ingester-1"))
		if err != nil || len(resp.Kvs) == 0 {
			return false
		}
		rec, err := keyspace.UnmarshalIngesterRecord(resp.Kvs[0].Value)
		return err == nil && slices.Equal(rec.Partitions, []string{"events/0", "events/1"})
	})
	stop()
	if err := <-done; err != nil {
		t.Fatalf("command returned %v, want nil on a clean stop", err)
	}
}

// TestIngesterCommandRefusesBadTopic: a topic Kafka would refuse is an
// error naming --topic, before anything connects.
func TestIngesterCommandRefusesBadTopic(t *testing.T) {
	cmd := NewCommand()
	cmd.SetArgs([]string{"--topic", "bad topic/x", "--metrics-listen", "127.0.0.1:0"})
	err := cmd.ExecuteContext(context.Background())
	if err == nil || !strings.HasPrefix(err.Error(), "--topic: topic name") {
		t.Fatalf("error = %v, want one naming --topic", err)
	}
}

// TestIngesterCommandNamesTheFlag: a numeric flag's bad value is refused
// naming the flag (not ingester.Config's field), before anything dials.
func TestIngesterCommandNamesTheFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--etcd-prefix", "noslash"}, `--etcd-prefix: keyspace: invalid prefix: "noslash" must be non-empty and end in '/'`},
		{[]string{"--chunk-size", "0"}, "--chunk-size must be positive, got 0"},
		{[]string{"--liveness-window", "0s"}, "--liveness-window must be positive, got 0s"},
		{[]string{"--window-ops", "-1"}, "--window-ops must be positive, got -1"},
		{[]string{"--window-linger", "-1ms"}, "--window-linger must be zero or positive, got -1ms"},
		{[]string{"--chunk-merge-below", "-2"}, "--chunk-merge-below must be zero or positive, got -2"},
	} {
		cmd := NewCommand()
		cmd.SetArgs(append(tc.args, "--metrics-listen", "127.0.0.1:0"))
		err := cmd.ExecuteContext(context.Background())
		if err == nil || err.Error() != tc.want {
			t.Errorf("%v: error = %v, want %q", tc.args, err, tc.want)
		}
	}
}

func TestMediumTable(t *testing.T) {
	def := events.DefaultMediums()
	tests := []struct {
		name    string
		changes []string
		want    func(events.MediumMap)
		err     string
	}{
		{name: "none_is_the_default", want: func(events.MediumMap) {}},
		{name: "add_and_override_any_case", changes: []string{"HBM=gpu", "cpu_tier2=cpu"}, want: func(m events.MediumMap) {
			m["HBM"] = tier.GPU
			delete(m, "CPU_TIER2")
			m["cpu_tier2"] = tier.CPU
		}},
		{name: "remove", changes: []string{"remote=none", "EXTERNAL=none"}, want: func(m events.MediumMap) {
			delete(m, "REMOTE")
			delete(m, "EXTERNAL")
		}},
		{name: "no_equals", changes: []string{"HBM"}, err: `--medium "HBM": want NAME=gpu|cpu|disk|none, NAME not empty`},
		{name: "bad_tier", changes: []string{"HBM=GPU"}, err: `--medium "HBM=GPU": tier "GPU" is not gpu, cpu, disk or none`},
		{name: "empty_name", changes: []string{"=gpu"}, err: `--medium "=gpu": want NAME=gpu|cpu|disk|none, NAME not empty`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := mediumTable(tc.changes)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("error = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := maps.Clone(def)
			tc.want(want)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("table (-want +got):\n%s", diff)
			}
		})
	}
}

// TestIngesterCommandNamesFlagsInConfigErrors: what ingester.Config's
// Validate refuses past the sign checks (ranges, and rules between two
// settings) reads in the flags the user set, not the Config's field
// names. Nothing listens at the etcd endpoint: Validate runs before the
// ingester uses its client.
func TestIngesterCommandNamesFlagsInConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		want      string
		notFields []string
	}{
		{[]string{"--chunk-size", "257"}, "--chunk-size 257: want between 1 and 256", []string{"ChunkSize"}},
		{[]string{"--max-txn-bytes", "100"}, "--max-txn-bytes 100: want between 16 KiB and 1.5 MiB", []string{"MaxTxnBytes"}},
		{[]string{"--window-linger", "2s"}, "--window-linger 2s: want between 0 and 1s", []string{"WindowLinger"}},
		{[]string{"--lease-ttl", "1500ms"}, "--lease-ttl 1.5s: want a whole number of seconds", []string{"LeaseTTL"}},
		{[]string{"--liveness-window", "1ns"}, "--liveness-window 1ns: want at least 100ms", []string{"LivenessWindow", "MinLivenessWindow"}},
		{[]string{"--outage-threshold", "1m", "--liveness-window", "30s"}, "--outage-threshold 1m0s: want less than --liveness-window 30s", []string{"OutageThreshold", "LivenessWindow"}},
	} {
		cmd := NewCommand()
		cmd.SetArgs(append(tc.args, "--metrics-listen", "127.0.0.1:0", "--etcd-endpoints", "127.0.0.1:1", "--etcd-dial-timeout", "100ms"))
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		err := cmd.ExecuteContext(context.Background())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error = %v, want one containing %q", tc.args, err, tc.want)
			continue
		}
		for _, f := range tc.notFields {
			if strings.Contains(err.Error(), f) {
				t.Errorf("%v: error %q names the Config field %s", tc.args, err, f)
			}
		}
		if !errors.Is(err, ingester.ErrInvalidConfig) {
			t.Errorf("%v: error %v does not wrap ingester.ErrInvalidConfig", tc.args, err)
		}
	}
}
