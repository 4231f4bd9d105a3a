package lookupcmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/indexd"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
	"github.com/spf13/cobra"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testutil.LeakOptions()...)
}

const model = "meta-llama/Llama-3.1-8B-Instruct"

// startIndex writes a small index into etcd and serves it; it returns
// indexd's address once every write is applied.
func startIndex(t *testing.T) string {
	t.Helper()
	e := testutil.StartEtcd(t)
	ks := keyspace.Default()
	ep0 := keyspace.Endpoint{Model: model, Pod: "vllm-0"}
	ep1 := keyspace.Endpoint{Model: model, Pod: "team-a/vllm 1", Rank: 1}
	rec, _ := (&keyspace.EndpointRecord{HashMode: keyspace.HashModeEngine, BlockSize: 16, LastRecord: time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC), Partition: 2}).Marshal()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := e.Client.Txn(ctx).Then(
		clientv3.OpPut(ks.EndpointKey(ep0), string(rec)),
		clientv3.OpPut(ks.BlockKey(ep0, tier.GPU, 0xe5068d13bba8906f), ""),
		clientv3.OpPut(ks.BlockKey(ep0, tier.CPU, 0x1c92a7b9b9bec94f), ""),
		clientv3.OpPut(ks.BlockKey(ep1, tier.Disk, 0xe5068d13bba8906f), ""),
		clientv3.OpPut(ks.OffsetKey(keyspace.Partition{Topic: "kvindex-events", Partition: 2}), "41"),
	).Commit()
	if err != nil {
		t.Fatal(err)
	}
	cfg := indexd.DefaultConfig()
	cfg.Etcd, cfg.ListenAddr = e.Client, "127.0.0.1:0"
	srv, err := indexd.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	conn, err := grpc.NewClient(srv.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if resp.Status == healthpb.HealthCheckResponse_SERVING {
			return srv.Addr().String()
		}
	}
}

func run(t *testing.T, newCmd func() *cobra.Command, args ...string) (string, error) {
	t.Helper()
	cmd := newCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func TestLookupCommand(t *testing.T) {
	addr := startIndex(t)
	hashes := []string{"e5068d13bba8906f", "0x1C92A7B9B9BEC94F"}

	out, err := run(t, NewCommand, append([]string{"--index", addr, "--model", model, "-o", "json", "--after", "kvindex-events/2@40"}, hashes...)...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var got lookupJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, out)
	}
	want := lookupJSON{
		Endpoints: []matchJSON{
			{Pod: "vllm-0", Blocks: 2, Tiers: []string{"gpu", "cpu"}},
			{Pod: "team-a/vllm 1", DPRank: 1, Blocks: 1, Tiers: []string{"disk"}},
		},
		Revision: got.Revision,
		Offsets:  map[string]int64{"kvindex-events/2": 41},
	}
	if diff := gocmp.Diff(want, got); diff != "" || got.Revision == 0 {
		t.Fatalf("json (-want +got):\n%s", diff)
	}

	out, err = run(t, NewCommand, append([]string{"--index", addr, "--model", model, "--candidate", "team-a/vllm 1#1"}, hashes...)...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"POD", "team-a/vllm 1", "1/2", "disk×1", "kvindex-events/2=41"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "vllm-0") {
		t.Errorf("candidate filter ignored:\n%s", out)
	}

	for _, tc := range []struct {
		name string
		args []string
		want error
	}{
		{name: "bad_hash", args: []string{"--index", addr, "--model", model, "xyz"}, want: errUsage},
		{name: "missing_model", args: []string{"--index", addr, "e5068d13bba8906f"}, want: errUsage},
		{name: "bad_output", args: []string{"--index", addr, "--model", model, "-o", "yaml", "01"}, want: errUsage},
		{name: "bad_after", args: []string{"--index", addr, "--model", model, "--after", "x", "01"}, want: errUsage},
		{name: "server_limit", args: append([]string{"--index", addr, "--model", strings.Repeat("m", 600)}, hashes...), want: client.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := run(t, NewCommand, tc.args...); !errors.Is(err, tc.want) {
				t.Fatalf("error = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestEndpointsCommand(t *testing.T) {
	addr := startIndex(t)
	out, err := run(t, NewEndpointsCommand, "--index", addr, "-o", "json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var got endpointsJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, out)
	}
	seen := time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC)
	want := endpointsJSON{Revision: got.Revision, Endpoints: []endpointJSON{
		{Model: model, Pod: "team-a/vllm 1", DPRank: 1, DiskBlocks: 1},
		{Model: model, Pod: "vllm-0", GPUBlocks: 1, CPUBlocks: 1, BlockSize: 16, Partition: 2, LastSeen: &seen},
	}}
	if diff := gocmp.Diff(want, got); diff != "" {
		t.Fatalf("json (-want +got):\n%s", diff)
	}
	out, err = run(t, NewEndpointsCommand, "--index", addr, "--model", "other")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "0 endpoints") {
		t.Fatalf("model filter: %s", out)
	}
	out, err = run(t, NewEndpointsCommand, "--index", addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"MODEL", "vllm-0", "2026-11-30T05:00:00Z", "2 endpoints"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}
