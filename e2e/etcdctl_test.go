package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kvindex/kvindex/ingester"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/replay"
	"github.com/kvindex/kvindex/internal/scenario"
	"github.com/kvindex/kvindex/internal/stack"
	"github.com/kvindex/kvindex/internal/stack/stacktest"
	"github.com/kvindex/kvindex/internal/testutil"
)

// etcdctl runs the etcdctl this module pins (`go tool etcdctl`) against
// endpoint.
func etcdctl(t *testing.T, endpoint string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(2*time.Minute))
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", append([]string{"tool", "etcdctl", "--endpoints", endpoint}, args...)...)
	cmd.Dir = testutil.RepoRoot(t)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("etcdctl %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// TestREADMEEtcdctlCommands runs the etcdctl commands the README documents,
// as written there, against the keys a real pipeline wrote for the names
// fixture (model and pod names that need escaping), and checks they show
// what the README says they show.
func TestREADMEEtcdctlCommands(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented := func(cmd string) []string {
		t.Helper()
		if !strings.Contains(string(readme), "etcdctl "+cmd) {
			t.Fatalf("README does not document `etcdctl %s`", cmd)
		}
		return splitArgs(cmd)
	}

	st := stacktest.Start(t, func(c *stack.Config) {
		c.Ingester = func(c *ingester.Config) { c.HashMode = keyspace.HashModeEngine } // p09 names engine hashes
	})
	runScenario(t, st, "p09_names_and_models.jsonl")
	url := st.EtcdURL()

	const model, pod = "meta-llama/Llama-3.1-8B-Instruct", "team-a/vllm 0@10.0.0.5:8000"
	ks := keyspace.Default()
	ep := keyspace.Endpoint{Model: model, Pod: pod}
	sub := func(args []string) []string {
		r := strings.NewReplacer("<model>", "meta-llama%2FLlama-3.1-8B-Instruct", "<pod>", "team-a%2Fvllm%200@10.0.0.5:8000", "<rank>", "0")
		out := make([]string, len(args))
		for i, a := range args {
			out[i] = r.Replace(a)
		}
		return out
	}

	out := etcdctl(t, url, documented("get --prefix /kvindex/v1/endpoints/ --keys-only")...)
	if !strings.Contains(out, ks.EndpointKey(ep)) || !strings.Contains(out, "/kvindex/v1/endpoints/Qwen%2FQwen3-32B/team-b%2Fvllm-1/0") {
		t.Fatalf("endpoints listing:\n%s", out)
	}

	out = etcdctl(t, url, sub(documented("get --prefix '/kvindex/v1/blocks/<model>/<pod>/' --keys-only"))...)
	want := []string{"/kvindex/v1/blocks/meta-llama%2FLlama-3.1-8B-Instruct/team-a%2Fvllm%200@10.0.0.5:8000/0/gpu/21cfe11cd0b23978",
		"/kvindex/v1/blocks/meta-llama%2FLlama-3.1-8B-Instruct/team-a%2Fvllm%200@10.0.0.5:8000/0/gpu/7b05ab3397532bcc"}
	if got := strings.Fields(out); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("pod blocks listing = %q, want %q", got, want)
	}

	out = etcdctl(t, url, sub(documented("get --prefix '/kvindex/v1/blocks/<model>/' --count-only -w fields"))...)
	if !strings.Contains(out, `"Count" : 2`) {
		t.Fatalf("count of the model's entries:\n%s", out)
	}

	out = etcdctl(t, url, sub(documented("get '/kvindex/v1/endpoints/<model>/<pod>/<rank>' --print-value-only"))...)
	rec, err := keyspace.UnmarshalEndpointRecord([]byte(strings.TrimSpace(out)))
	if err != nil {
		t.Fatalf("endpoint record %q: %v", out, err)
	}
	if rec.Topic != st.Topic() || rec.Lease == 0 || len(rec.Shards(1)) == 0 {
		t.Fatalf("endpoint record %+v lacks its topic or leases", rec)
	}

	lease := strings.Replace(documented("lease timetolive <lease> --keys")[2], "<lease>", rec.Shards(1)[0].ID.String(), 1)
	out = etcdctl(t, url, "lease", "timetolive", lease, "--keys")
	if !strings.Contains(out, "granted with TTL") || !strings.Contains(out, "7b05ab3397532bcc") {
		t.Fatalf("lease timetolive of the gpu shard:\n%s", out)
	}

	out = etcdctl(t, url, documented("get --prefix /kvindex/v1/offsets/")...)
	if !strings.Contains(out, "/kvindex/v1/offsets/"+st.Topic()+"/") {
		t.Fatalf("offsets:\n%s", out)
	}
	out = etcdctl(t, url, documented("get --prefix /kvindex/v1/owners/")...)
	var owner keyspace.OwnerRecord
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 2 || json.Unmarshal([]byte(lines[1]), &owner) != nil || owner.MemberID == "" {
		t.Fatalf("owners:\n%s", out)
	}
	out = etcdctl(t, url, documented("get --prefix /kvindex/v1/ingesters/")...)
	lines = strings.Split(strings.TrimSpace(out), "\n")
	var ing keyspace.IngesterRecord
	if len(lines) != 2 || lines[0] != ks.IngesterKey(owner.Ingester) || json.Unmarshal([]byte(lines[1]), &ing) != nil || len(ing.Partitions) == 0 {
		t.Fatalf("ingesters (want the owner's key %s with its partitions):\n%s", ks.IngesterKey(owner.Ingester), out)
	}
}

// splitArgs splits a documented command line into arguments, honouring
// single quotes as a shell would.
func splitArgs(s string) []string {
	var out []string
	var cur strings.Builder
	quoted, have := false, false
	for _, r := range s {
		switch {
		case r == '\'':
			quoted, have = !quoted, true
		case r == ' ' && !quoted:
			if have {
				out = append(out, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteRune(r)
			have = true
		}
	}
	if have {
		out = append(out, cur.String())
	}
	return out
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
