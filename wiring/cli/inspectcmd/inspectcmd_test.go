package inspectcmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testutil.LeakOptions()...) }

// hostile is a pod name with a newline and a terminal escape in it.
const hostile = "evil\npod\x1b[2J"

var (
	epA = keyspace.Endpoint{Model: "meta-llama/Llama-3.1-8B-Instruct", Pod: "team-a/vllm 0@10.0.0.5:8000", Rank: 0}
	epB = keyspace.Endpoint{Model: "meta-llama/Llama-3.1-8B-Instruct", Pod: "team-a/vllm 0@10.0.0.5:8000", Rank: 1}
	epC = keyspace.Endpoint{Model: "Qwen/Qwen3-32B", Pod: hostile, Rank: 0}
)

// entries returns n entries with key hashes base+1.. and engine hashes
// base+1001..
func entries(base uint64, n int) []keyspace.ChunkEntry {
	out := make([]keyspace.ChunkEntry, n)
	for i := range out {
		out[i] = keyspace.ChunkEntry{Key: base + uint64(i) + 1, Engine: base + uint64(i) + 1001}
	}
	return out
}

// fill writes a v2 keyspace by hand: records and chunks of three
// endpoints (engine and token mode, a hostile pod name), a malformed
// chunk value, a malformed chunk key and a chunk under no record.
func fill(t *testing.T, cli *clientv3.Client) {
	t.Helper()
	ctx := context.Background()
	ks := keyspace.Default()
	put := func(k, v string) {
		t.Helper()
		if _, err := cli.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	record := func(ep keyspace.Endpoint, mode keyspace.HashMode, next string) {
		t.Helper()
		put(ks.EndpointKey(ep), fmt.Sprintf(`{"block_size":16,"hash_mode":%q,"last_record":"2026-12-01T12:00:00Z","topic":"kvindex-events","partition":3,"lease":"2a","chunk_next":%s}`, mode, next))
	}
	chunk := func(ep keyspace.Endpoint, tr tier.Tier, seq uint64, es []keyspace.ChunkEntry, token bool) {
		t.Helper()
		put(ks.ChunkKey(ep, tr, seq), string(keyspace.AppendChunkValue(nil, es, token)))
	}
	record(epA, keyspace.HashModeEngine, `{"gpu":3,"cpu":1}`)
	// Chunk 0 full, chunk 1 emptied and deleted, chunk 2 partly full:
	// sequence order, not a contiguous numbering.
	chunk(epA, tier.GPU, 0, entries(0x100, 64), false)
	chunk(epA, tier.GPU, 2, entries(0x200, 20), false)
	chunk(epA, tier.CPU, 0, entries(0x300, 2), false)
	record(epB, keyspace.HashModeToken, `{"disk":1}`)
	chunk(epB, tier.Disk, 0, entries(0x400, 3), true)
	record(epC, keyspace.HashModeEngine, `{"gpu":1}`)
	chunk(epC, tier.GPU, 0, entries(0x500, 1), false)
	// Problems: a value of 3 bytes at width 8, a key with 15 hex digits
	// (both inside A's range), and a chunk whose endpoint has no record.
	put(ks.ChunkKey(epA, tier.Disk, 0), "\x08ab")
	put(ks.EndpointChunksPrefix(epA)+"gpu/000000000000001", "\x08")
	chunk(keyspace.Endpoint{Model: "Qwen/Qwen3-32B", Pod: "gone", Rank: 0}, tier.GPU, 0, entries(0x600, 5), false)
}

func run(t *testing.T, e *testutil.Etcd, args ...string) string {
	t.Helper()
	out, err := runErr(t, e, args...)
	if err != nil {
		t.Fatalf("inspect %v: %v\n%s", args, err, out)
	}
	return out
}

func runErr(t *testing.T, e *testutil.Etcd, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	cmd := NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(io.Discard)
	// --page-size 5 makes every range several pages.
	cmd.SetArgs(append(args, "--etcd-endpoints", e.Endpoints[0], "--page-size", "5", "--log-level", "error"))
	err := cmd.ExecuteContext(ctx)
	return out.String(), err
}

func hexes(es []keyspace.ChunkEntry, engine bool) []string {
	out := make([]string, len(es))
	for i, e := range es {
		h := e.Key
		if engine {
			h = e.Engine
		}
		out[i] = fmt.Sprintf("%016x", h)
	}
	return out
}

func TestInspectBlocks(t *testing.T) {
	e := testutil.StartEtcd(t)
	fill(t, e.Client)

	// Text: one hex hash per line in chunk order, under '#' headers.
	out := run(t, e, "blocks", "--model", epA.Model, "--pod", epA.Pod, "--rank", "0", "--tier", "gpu")
	var lines []string
	var headers []string
	for l := range strings.Lines(out) {
		l = strings.TrimSuffix(l, "\n")
		switch {
		case strings.HasPrefix(l, "# problem: "):
		case strings.HasPrefix(l, "#"):
			headers = append(headers, l)
		default:
			lines = append(lines, l)
		}
	}
	want := append(hexes(entries(0x100, 64), false), hexes(entries(0x200, 20), false)...)
	if diff := cmp.Diff(want, lines); diff != "" {
		t.Fatalf("gpu blocks (-want +got):\n%s\n%s", diff, out)
	}
	if diff := cmp.Diff([]string{"# meta-llama/Llama-3.1-8B-Instruct team-a/vllm 0@10.0.0.5:8000 rank 0 gpu: 84 blocks in 2 chunks"}, headers); diff != "" {
		t.Fatalf("headers (-want +got):\n%s", diff)
	}
	if strings.Count(out, "# problem: ") != 2 || !strings.Contains(out, "not whole 8-byte entries") || !strings.Contains(out, "000000000000001") {
		t.Fatalf("the malformed value and key are not reported:\n%s", out)
	}

	// JSON: every rank and tier of the pod, engine hashes in token mode.
	var got struct {
		Revision  int64
		Endpoints []rankBlocksJSON
		Problems  []problem
	}
	if err := json.Unmarshal([]byte(run(t, e, "blocks", "--model", epA.Model, "--pod", epA.Pod, "-o", "json")), &got); err != nil {
		t.Fatal(err)
	}
	wantJSON := []rankBlocksJSON{
		{Rank: 0, Tiers: []tierBlocksJSON{{Tier: "gpu", Chunks: 2, Blocks: want}, {Tier: "cpu", Chunks: 1, Blocks: hexes(entries(0x300, 2), false)}}},
		{Rank: 1, Tiers: []tierBlocksJSON{{Tier: "disk", Chunks: 1, Blocks: hexes(entries(0x400, 3), false), EngineHashes: hexes(entries(0x400, 3), true)}}},
	}
	if diff := cmp.Diff(wantJSON, got.Endpoints); diff != "" {
		t.Fatalf("blocks JSON (-want +got):\n%s", diff)
	}
	if got.Revision == 0 || len(got.Problems) != 2 {
		t.Fatalf("revision %d, problems %+v", got.Revision, got.Problems)
	}

	// The hostile pod: its name is quoted in text, as it is in JSON.
	out = run(t, e, "blocks", "--model", epC.Model, "--pod", hostile)
	if strings.ContainsAny(out, "\x1b") || !strings.Contains(out, `"evil\npod\x1b[2J"`) || !strings.Contains(out, fmt.Sprintf("%016x", 0x501)) {
		t.Fatalf("hostile pod listing:\n%q", out)
	}
}

func TestInspectEndpoints(t *testing.T) {
	e := testutil.StartEtcd(t)
	fill(t, e.Client)
	ctx := context.Background()
	if _, err := e.Client.Put(ctx, keyspace.Default().EndpointsPrefix()+"bad/key", "{}"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Client.Put(ctx, keyspace.Default().EndpointKey(keyspace.Endpoint{Model: "m", Pod: "p"}), "not json"); err != nil {
		t.Fatal(err)
	}
	out := run(t, e, "endpoints")
	for _, want := range []string{
		"meta-llama/Llama-3.1-8B-Instruct  team-a/vllm 0@10.0.0.5:8000  0     engine",
		"token", "kvindex-events/3", "2026-12-01T12:00:00Z", "gpu=3 cpu=1", "disk=1",
		`"evil\npod\x1b[2J"`, "3 endpoints at revision", "2 problems",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("endpoints listing lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\x1b") {
		t.Errorf("a control character reached the output:\n%q", out)
	}
	var got struct {
		Endpoints []endpointJSON
		Problems  []problem
	}
	if err := json.Unmarshal([]byte(run(t, e, "endpoints", "--model", epA.Model, "-o", "json")), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Endpoints) != 2 || got.Endpoints[1].HashMode != keyspace.HashModeToken || got.Endpoints[0].ChunkNext["gpu"] != 3 ||
		got.Endpoints[0].Lease != 0x2a || got.Endpoints[0].LastRecord == nil || len(got.Problems) != 0 {
		t.Fatalf("endpoints JSON %+v", got)
	}
}

func TestInspectChunksAndModels(t *testing.T) {
	e := testutil.StartEtcd(t)
	fill(t, e.Client)
	var chunks struct {
		ChunkSize int `json:"chunk_size"`
		Endpoints []endpointFillJSON
		Tiers     []*fillStats
		Problems  []problem
	}
	// The fixture's chunks hold up to 64 entries, as ingesters at
	// --chunk-size 64 write them.
	if err := json.Unmarshal([]byte(run(t, e, "chunks", "--chunk-size", "64", "-o", "json")), &chunks); err != nil {
		t.Fatal(err)
	}
	gpu := chunks.Tiers[0]
	// gpu: 64 + 20 (A) + 1 (C); the chunk under no record is not counted.
	if gpu.Tier != "gpu" || gpu.Chunks != 3 || gpu.Entries != 85 || gpu.Min != 1 || gpu.Max != 64 || gpu.Fill != 85.0/(3*64) {
		t.Fatalf("gpu fill %+v", gpu)
	}
	wantHist := []int{1, 0, 1, 0, 0, 0, 0, 1} // 1, 20, 64 in buckets of 8
	for i, b := range gpu.Histogram {
		if b.Chunks != wantHist[i] {
			t.Fatalf("gpu histogram %+v, want counts %v", gpu.Histogram, wantHist)
		}
	}
	if len(chunks.Endpoints) != 3 || chunks.Endpoints[1].Tiers[0].Chunks != 2 || chunks.Endpoints[1].Tiers[0].Mean != 42 {
		t.Fatalf("per endpoint %+v", chunks.Endpoints)
	}
	var orphan bool
	for _, p := range chunks.Problems {
		orphan = orphan || strings.Contains(p.Error, "1 chunk key under no endpoint record")
	}
	if !orphan || len(chunks.Problems) != 3 {
		t.Fatalf("problems %+v: want the malformed value and key and the chunk under no record", chunks.Problems)
	}
	if out := run(t, e, "chunks", "--chunk-size", "64", "--model", epA.Model); !strings.Contains(out, "1-8:0 9-16:0 17-24:1") || !strings.Contains(out, "0.656") {
		t.Fatalf("chunks text:\n%s", out)
	}

	// A record that does not decode is a problem, not an endpoint, in
	// models as in endpoints (before, models counted it).
	if _, err := e.Client.Put(context.Background(), keyspace.Default().EndpointKey(keyspace.Endpoint{Model: epA.Model, Pod: "broken"}), "not json"); err != nil {
		t.Fatal(err)
	}
	var models struct{ Models []modelJSON }
	if err := json.Unmarshal([]byte(run(t, e, "models", "-o", "json")), &models); err != nil {
		t.Fatal(err)
	}
	want := []modelJSON{
		{Model: "Qwen/Qwen3-32B", Endpoints: 1, Chunks: map[string]int{"gpu": 1, "cpu": 0, "disk": 0}, Blocks: map[string]int{"gpu": 1, "cpu": 0, "disk": 0}},
		{Model: "meta-llama/Llama-3.1-8B-Instruct", Endpoints: 2, Chunks: map[string]int{"gpu": 2, "cpu": 1, "disk": 1}, Blocks: map[string]int{"gpu": 84, "cpu": 2, "disk": 3}},
	}
	if diff := cmp.Diff(want, models.Models); diff != "" {
		t.Fatalf("models (-want +got):\n%s", diff)
	}
	out := run(t, e, "models")
	for _, s := range []string{"meta-llama/Llama-3.1-8B-Instruct  2          84", "2 models at revision", "4 problems (keys"} {
		if !strings.Contains(out, s) {
			t.Fatalf("models text, want %q in:\n%s", s, out)
		}
	}
	// Counts of one read in the singular.
	if out := run(t, e, "models", "--model", epA.Model); !strings.Contains(out, "1 model at revision") {
		t.Fatalf("models --model text, want \"1 model at revision\" in:\n%s", out)
	}
}

// TestInspectUnreachableEtcd: with nothing listening at --etcd-endpoints,
// inspect fails after --etcd-dial-timeout, naming the endpoint, not after
// --timeout.
func TestInspectUnreachableEtcd(t *testing.T) {
	cmd := NewCommand()
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	cmd.SetArgs([]string{"endpoints", "--etcd-endpoints", "http://127.0.0.1:1", "--etcd-dial-timeout", "200ms", "--timeout", "1m", "--log-level", "error"})
	err := cmd.ExecuteContext(t.Context())
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") || !strings.Contains(err.Error(), "--etcd-dial-timeout") {
		t.Fatalf("error = %v, want one naming the endpoint and --etcd-dial-timeout", err)
	}
}

func TestInspectUsage(t *testing.T) {
	e := testutil.StartEtcd(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"blocks", "--model", "m"}, "needs --model and --pod"},
		{[]string{"blocks", "--model", "m", "--pod", "p", "--tier", "hbm"}, "--tier"},
		{[]string{"endpoints", "--pod", "p"}, "--pod needs --model"},
		{[]string{"endpoints", "-o", "yaml"}, "want text or json"},
		{[]string{"chunks", "--chunk-size", "0"}, "--chunk-size must be positive"},
		// Before, the histogram's bucket width overflowed and the command
		// ran out of memory.
		{[]string{"chunks", "--chunk-size", "9223372036854775807"}, "--chunk-size 9223372036854775807: want 1 to 256"},
		{[]string{"models", "--etcd-prefix", "x"}, "--etcd-prefix"},
		{[]string{"nosuch"}, `unknown command "nosuch"`},
		{nil, "inspect needs a subcommand"},
		{[]string{"endpoints", "--etcd-dial-timeout", "0s"}, "--etcd-dial-timeout must be positive"},
	} {
		_, err := runErr(t, e, tc.args...)
		var coded interface{ ExitCode() int }
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.As(err, &coded) || coded.ExitCode() != 2 {
			t.Errorf("%v: %v, want a usage error with %q", tc.args, err, tc.want)
		}
	}
}
