package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/ingester"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/scenario"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
	"github.com/kvindex/kvindex/wiring/replay"
	"github.com/kvindex/kvindex/wiring/stack"
	"github.com/kvindex/kvindex/wiring/stack/stacktest"
)

var (
	etcdctlOnce sync.Once
	etcdctlPath string
	etcdctlErr  error
)

// etcdctlDir builds the etcdctl this module pins (its tool dependency)
// once per test run and returns the directory holding it, for the
// README's shell pipelines.
func etcdctlDir(t *testing.T) string {
	t.Helper()
	etcdctlOnce.Do(func() {
		if etcdctlPath, etcdctlErr = os.MkdirTemp("", "kvindex-e2e-etcdctl-"); etcdctlErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", filepath.Join(etcdctlPath, "etcdctl"), "go.etcd.io/etcd/etcdctl/v3")
		cmd.Dir = testutil.RepoRoot(t)
		if out, err := cmd.CombinedOutput(); err != nil {
			etcdctlErr = fmt.Errorf("%v\n%s", err, out)
		}
	})
	if etcdctlErr != nil {
		t.Fatalf("building etcdctl: %v", etcdctlErr)
	}
	return etcdctlPath
}

// recipes are the README's documented command lines.
type recipes struct {
	t      *testing.T
	readme string
	url    string
	subs   *strings.Replacer
}

func newRecipes(t *testing.T, url string, subs ...string) *recipes {
	readme, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	return &recipes{t: t, readme: string(readme), url: url, subs: strings.NewReplacer(subs...)}
}

// line returns the README's whole command line that starts with
// "etcdctl "+start, failing when there is none.
func (r *recipes) line(start string) string {
	r.t.Helper()
	for l := range strings.Lines(r.readme) {
		if strings.HasPrefix(l, "etcdctl "+start) {
			return strings.TrimSpace(l)
		}
	}
	r.t.Fatalf("README does not document `etcdctl %s...`", start)
	return ""
}

// run runs the README's command line starting with "etcdctl "+start, as
// written there but for the placeholders, in bash with pipefail, the
// built etcdctl first on PATH and ETCDCTL_ENDPOINTS set to the stack's
// etcd.
func (r *recipes) run(start string) string {
	r.t.Helper()
	dir := etcdctlDir(r.t)
	line := r.subs.Replace(r.line(start))
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(2*time.Minute))
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-o", "pipefail", "-c", line)
	cmd.Env = append(os.Environ(), "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"), "ETCDCTL_ENDPOINTS="+r.url)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		r.t.Fatalf("%s: %v\n%s%s", line, err, out, stderr.String())
	}
	return string(out)
}

const (
	llama, podA = "meta-llama/Llama-3.1-8B-Instruct", "team-a/vllm 0@10.0.0.5:8000"
	qwen, podB  = "Qwen/Qwen3-32B", "team-b/vllm-1"
)

// readmeSubs are the placeholders of the README's recipes for pod A.
var readmeSubs = []string{"<model>", "meta-llama%2FLlama-3.1-8B-Instruct", "<pod>", "team-a%2Fvllm%200@10.0.0.5:8000", "<rank>", "0"}

// checkRecipes runs the README's v2 recipes for pod A, whose gpu chunk 0
// is the only chunk of its model and holds blocks (key hashes, in
// insertion order), and checks they show what the README says.
func checkRecipes(t *testing.T, url string, blocks []string) keyspace.EndpointRecord {
	ks := keyspace.Default()
	ep := keyspace.Endpoint{Model: llama, Pod: podA}
	chunkKey := ks.ChunkKey(ep, tier.GPU, 0)
	r := newRecipes(t, url, append(readmeSubs, "<chunk key>", chunkKey)...)

	out := r.run("get --prefix /kvindex/v2/endpoints/ --keys-only")
	if !strings.Contains(out, ks.EndpointKey(ep)) || !strings.Contains(out, ks.EndpointKey(keyspace.Endpoint{Model: qwen, Pod: podB})) {
		t.Fatalf("endpoints listing:\n%s", out)
	}
	if got := strings.Fields(r.run("get --prefix '/kvindex/v2/chunks/<model>/<pod>/' --keys-only")); !slices.Equal(got, []string{chunkKey}) {
		t.Fatalf("pod chunks listing = %q, want %q", got, chunkKey)
	}
	if out := r.run("get --prefix '/kvindex/v2/chunks/<model>/' --count-only -w fields"); !strings.Contains(out, `"Count" : 1`) {
		t.Fatalf("count of the model's chunks:\n%s", out)
	}
	out = r.run("get '/kvindex/v2/endpoints/<model>/<pod>/<rank>' --print-value-only")
	rec, err := keyspace.UnmarshalEndpointRecord([]byte(strings.TrimSpace(out)))
	if err != nil {
		t.Fatalf("endpoint record %q: %v", out, err)
	}
	var next struct {
		ChunkNext map[string]uint64 `json:"chunk_next"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &next); err != nil || next.ChunkNext["gpu"] != 1 || rec.Lease == 0 || len(rec.Shards(tier.GPU)) == 0 {
		t.Fatalf("endpoint record %s lacks its lease, gpu shard or chunk_next (%v)", out, err)
	}
	if w := strings.TrimSpace(r.run("get '<chunk key>' -w json | jq -r '.kvs[0].value' | base64 -d | head -c 1 | xxd -p")); w != "08" {
		t.Fatalf("entry width %q, want 08 (engine-hash mode)", w)
	}
	if got := strings.Fields(r.run("get '<chunk key>' -w json | jq -r '.kvs[0].value' | base64 -d | tail -c +2 | xxd -p -c8")); !slices.Equal(got, blocks) {
		t.Fatalf("chunk blocks = %q, want %q", got, blocks)
	}

	r.subs = strings.NewReplacer("<lease>", rec.Shards(tier.GPU)[0].ID.String())
	if out := r.run("lease timetolive <lease> --keys"); !strings.Contains(out, "granted with TTL") || !strings.Contains(out, chunkKey) {
		t.Fatalf("lease timetolive of the gpu shard:\n%s", out)
	}
	return rec
}

// TestREADMEEtcdctlRecipes runs the README's chunk recipes against v2
// keys written by hand, so the pipelines are checked where etcdctl's
// binary output matters: a token-mode chunk (width 16) and key hashes
// holding newline bytes, which only -w json carries intact.
func TestREADMEEtcdctlRecipes(t *testing.T) {
	t.Parallel()
	e := testutil.StartEtcd(t)
	ctx := context.Background()
	ks := keyspace.Default()
	lease, err := e.Client.Grant(ctx, 120)
	if err != nil {
		t.Fatal(err)
	}
	epA, epB := keyspace.Endpoint{Model: llama, Pod: podA}, keyspace.Endpoint{Model: qwen, Pod: podB}
	rec := fmt.Sprintf(`{"hash_mode":%%q,"last_record":"2026-12-01T12:00:00Z","topic":"t","partition":0,"lease":%q,"tier_leases":{"gpu":[{"id":%q,"keys":1}]},"chunk_next":{"gpu":1}}`,
		keyspace.LeaseID(lease.ID), keyspace.LeaseID(lease.ID))
	a := []keyspace.ChunkEntry{{Key: 0x7b05ab3397532bcc}, {Key: 0x0a0a0a0a0a0a0a0a}, {Key: 0x21cfe11cd0b23978}}
	b := []keyspace.ChunkEntry{{Key: 0x7b05ab3397532bcc, Engine: 0x0a0000000000000a}}
	for _, kv := range [][2]string{
		{ks.EndpointKey(epA), fmt.Sprintf(rec, "engine")},
		{ks.EndpointKey(epB), fmt.Sprintf(rec, "token")},
		{ks.ChunkKey(epA, tier.GPU, 0), string(keyspace.AppendChunkValue(nil, a, false))},
		{ks.ChunkKey(epB, tier.GPU, 0), string(keyspace.AppendChunkValue(nil, b, true))},
	} {
		if _, err := e.Client.Put(ctx, kv[0], kv[1], clientv3.WithLease(lease.ID)); err != nil {
			t.Fatal(err)
		}
	}
	checkRecipes(t, e.Endpoints[0], []string{"7b05ab3397532bcc", "0a0a0a0a0a0a0a0a", "21cfe11cd0b23978"})

	r := newRecipes(t, e.Endpoints[0], "<chunk key>", ks.ChunkKey(epB, tier.GPU, 0))
	if w := strings.TrimSpace(r.run("get '<chunk key>' -w json | jq -r '.kvs[0].value' | base64 -d | head -c 1 | xxd -p")); w != "10" {
		t.Fatalf("token-mode entry width %q, want 10", w)
	}
	if got := strings.Fields(r.run("get '<chunk key>' -w json | jq -r '.kvs[0].value' | base64 -d | tail -c +2 | xxd -p -c16")); !slices.Equal(got, []string{"7b05ab3397532bcc0a0000000000000a"}) {
		t.Fatalf("token-mode chunk = %q, want the key hash then the engine hash", got)
	}
}

// TestREADMEEtcdctlCommands runs the etcdctl commands the README documents,
// as written there, against the keys a real pipeline wrote for the names
// fixture (model and pod names that need escaping), and checks they show
// what the README says they show; then `kvindex inspect` against the same
// etcd.
func TestREADMEEtcdctlCommands(t *testing.T) {
	t.Parallel()
	st := stacktest.Start(t, func(c *stack.Config) {
		c.Ingester = func(c *ingester.Config) { c.HashMode = keyspace.HashModeEngine } // p09 names engine hashes
	})
	runScenario(t, st, "p09_names_and_models.jsonl")
	url := st.EtcdURL()
	ks := keyspace.Default()

	// p09 stores 7b05ab3397532bcc then 21cfe11cd0b23978 on pod A's gpu.
	blocks := []string{"7b05ab3397532bcc", "21cfe11cd0b23978"}
	recA := checkRecipes(t, url, blocks)

	r := newRecipes(t, url)
	out := r.run("get --prefix /kvindex/v2/offsets/")
	if !strings.Contains(out, "/kvindex/v2/offsets/"+st.Topic()+"/") {
		t.Fatalf("offsets:\n%s", out)
	}
	out = r.run("get --prefix /kvindex/v2/owners/")
	var owner keyspace.OwnerRecord
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 2 || json.Unmarshal([]byte(lines[1]), &owner) != nil || owner.MemberID == "" {
		t.Fatalf("owners:\n%s", out)
	}
	out = r.run("get --prefix /kvindex/v2/ingesters/")
	lines = strings.Split(strings.TrimSpace(out), "\n")
	var ing keyspace.IngesterRecord
	if len(lines) != 2 || lines[0] != ks.IngesterKey(owner.Ingester) || json.Unmarshal([]byte(lines[1]), &ing) != nil || len(ing.Partitions) == 0 {
		t.Fatalf("ingesters (want the owner's key %s with its partitions):\n%s", ks.IngesterKey(owner.Ingester), out)
	}
	// Pod A's member key, under the partition its record names.
	out = r.run("get --prefix /kvindex/v2/members/ --keys-only")
	if want := ks.MemberKey(keyspace.Partition{Topic: recA.Topic, Partition: recA.Partition}, keyspace.Endpoint{Model: llama, Pod: podA}); !strings.Contains(out, want) {
		t.Fatalf("members listing, want %s in:\n%s", want, out)
	}

	// kvindex inspect, the binary, with indexd's etcd flag.
	inspect := func(args ...string) string {
		t.Helper()
		stdout, stderr, code := run(t, append([]string{"inspect"}, append(args, "--etcd-endpoints", url)...)...)
		if code != 0 {
			t.Fatalf("kvindex inspect %v: exit %d\n%s", args, code, stderr)
		}
		return stdout
	}
	var got []string
	for l := range strings.Lines(inspect("blocks", "--model", llama, "--pod", podA)) {
		if !strings.HasPrefix(l, "#") {
			got = append(got, strings.TrimSpace(l))
		}
	}
	if !slices.Equal(got, blocks) {
		t.Fatalf("inspect blocks = %q, want %q", got, blocks)
	}
	var models struct {
		Models []struct {
			Model     string
			Endpoints int
			Chunks    map[string]int
			Blocks    map[string]int
		}
		Problems []json.RawMessage
	}
	if err := json.Unmarshal([]byte(inspect("models", "-o", "json")), &models); err != nil {
		t.Fatal(err)
	}
	if len(models.Models) != 2 || len(models.Problems) != 0 {
		t.Fatalf("inspect models: %+v", models)
	}
	for _, m := range models.Models {
		if want := map[string]int{qwen: 1, llama: 2}[m.Model]; m.Endpoints != 1 || m.Chunks["gpu"] != 1 || m.Blocks["gpu"] != want {
			t.Errorf("inspect models: %+v, want 1 endpoint, 1 gpu chunk, %d gpu blocks", m, want)
		}
	}
	var chunks struct {
		Tiers []struct {
			Tier    string
			Chunks  int
			Entries int
		}
	}
	if err := json.Unmarshal([]byte(inspect("chunks", "-o", "json")), &chunks); err != nil {
		t.Fatal(err)
	}
	if len(chunks.Tiers) == 0 || chunks.Tiers[0].Tier != "gpu" || chunks.Tiers[0].Chunks != 2 || chunks.Tiers[0].Entries != 3 {
		t.Fatalf("inspect chunks: %+v", chunks)
	}
	if out := inspect("endpoints"); !strings.Contains(out, podA) || !strings.Contains(out, podB) || !strings.Contains(out, "gpu=1") {
		t.Fatalf("inspect endpoints:\n%s", out)
	}
}

// runScenario replays one fixture file into st and requires it to pass.
func runScenario(t *testing.T, st *stack.Stack, file string) {
	t.Helper()
	s, err := scenario.Load(filepath.Join(testutil.RepoRoot(t), "testdata", "fixtures", "scenarios", file))
	if err != nil {
		t.Fatal(err)
	}
	prod, err := kgo.NewClient(kgo.SeedBrokers(st.KafkaAddr()))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	idx := newClient(t, st.GRPCAddr())
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(time.Minute))
	defer cancel()
	res, err := replay.Run(ctx, replay.Target{Producer: prod, Topic: st.Topic(), Index: idx}, s)
	if err != nil || len(res.Mismatches) > 0 {
		t.Fatalf("replaying %s: %v %+v", file, err, res.Mismatches)
	}
}
