package replay

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/ingester"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/scenario"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/wiring/stack"
	"github.com/kvindex/kvindex/wiring/stack/stacktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testutil.LeakOptions()...) }

// startStack runs a fresh in-process stack with short group timeouts in
// hash mode mode.
func startStack(t *testing.T, mode string) *stack.Stack {
	t.Helper()
	return stacktest.Start(t, func(c *stack.Config) {
		c.Ingester = func(c *ingester.Config) {
			c.SessionTimeout, c.RebalanceTimeout, c.LeaseTTL = 6*time.Second, 6*time.Second, 30*time.Second
			c.HashMode = keyspace.HashMode(mode)
		}
	})
}

// targetOf returns a Target of st, its producer and index client closed
// when the test ends.
func targetOf(t *testing.T, st *stack.Stack) Target {
	t.Helper()
	prod, err := kgo.NewClient(kgo.SeedBrokers(st.KafkaAddr()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prod.Close)
	idx, err := client.New(st.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { idx.Close() })
	return Target{Producer: prod, Topic: st.Topic(), Index: idx}
}

func replay(t *testing.T, s *scenario.Scenario) Result {
	t.Helper()
	st := startStack(t, s.HashMode)
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(60*time.Second))
	defer cancel()
	res, err := Run(ctx, targetOf(t, st), s)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestFixtures replays every fixture through a real in-process stack.
func TestFixtures(t *testing.T) {
	all, err := scenario.Glob(testutil.ScenarioGlob(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range all {
		t.Run(s.Name, func(t *testing.T) {
			res := replay(t, s)
			if len(res.Mismatches) > 0 || res.Lookups == 0 {
				t.Fatalf("%d lookups, mismatches: %+v", res.Lookups, res.Mismatches)
			}
		})
	}
}

// TestMismatchIsReported doctors one expectation of a fixture: the replay
// must report exactly that step, with what was expected and what came back.
func TestMismatchIsReported(t *testing.T) {
	s, err := scenario.Load(filepath.Join(testutil.RepoRoot(t), "testdata", "fixtures", "scenarios", "p01_shared_prefix.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var doctored *scenario.Step
	for i := range s.Steps {
		if s.Steps[i].Kind == scenario.KindLookup {
			doctored = &s.Steps[i]
			break
		}
	}
	doctored.Lookup.Expect[0].Blocks--
	res := replay(t, s)
	if len(res.Mismatches) != 1 {
		t.Fatalf("mismatches %+v, want exactly the doctored step", res.Mismatches)
	}
	m := res.Mismatches[0]
	if m.Line != doctored.Line || len(m.Diffs) != 1 || !strings.Contains(m.Diffs[0], "expected 3 blocks, got 4") {
		t.Fatalf("mismatch %+v, want line %d saying expected 3 blocks, got 4", m, doctored.Line)
	}
}

// TestHashModeProbe: HashMode learns a deployment's hash mode from a probe
// endpoint, which it leaves behind for no one.
func TestHashModeProbe(t *testing.T) {
	for _, mode := range []string{scenario.HashModeToken, scenario.HashModeEngine} {
		t.Run(mode, func(t *testing.T) {
			st := startStack(t, mode)
			target := targetOf(t, st)
			prod, idx := target.Producer, target.Index
			ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(60*time.Second))
			defer cancel()
			for st.Ready() != nil { // a deployment a replay targets is up
				select {
				case <-ctx.Done():
					t.Fatal("the stack never got ready")
				case <-time.After(20 * time.Millisecond):
				}
			}
			got, err := HashMode(ctx, target, "probe")
			if err != nil || got != mode {
				t.Fatalf("HashMode = %q, %v; want %q", got, err, mode)
			}
			// The goodbye went out after the probe: once applied, no
			// probe endpoint is listed.
			rec := &kgo.Record{Topic: st.Topic(), Key: []byte("probe"), Headers: []kgo.RecordHeader{{Key: "kind", Value: []byte("heartbeat")}, {Key: "model", Value: []byte("other")}}}
			if err := prod.ProduceSync(ctx, rec).FirstErr(); err != nil {
				t.Fatal(err)
			}
			if _, err := idx.Lookup(ctx, "other", []uint64{0}, client.WithBarrier(30*time.Second, client.PartitionOffset{Topic: st.Topic(), Partition: rec.Partition, Offset: rec.Offset})); err != nil {
				t.Fatal(err)
			}
			list, err := idx.ListEndpoints(ctx, ProbeModel)
			if err != nil {
				t.Fatal(err)
			}
			if len(list.Endpoints) != 0 {
				t.Errorf("probe endpoints left: %+v", list.Endpoints)
			}
		})
	}
}

// TestHeldBeforeIsReported: a scenario replayed a second time into the
// same stack reports the models the index already held, the likeliest
// reason for its failure (every scenario expects an empty index); the
// first replay reports none.
func TestHeldBeforeIsReported(t *testing.T) {
	s, err := scenario.Load(filepath.Join(testutil.RepoRoot(t), "testdata", "fixtures", "scenarios", "t01_same_prompt_across_pods.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	target := targetOf(t, startStack(t, s.HashMode))
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(60*time.Second))
	defer cancel()
	first, err := Run(ctx, target, s)
	if err != nil || len(first.HeldBefore) != 0 || len(first.Mismatches) != 0 {
		t.Fatalf("first replay: %+v, %v; want a pass holding nothing before", first, err)
	}
	second, err := Run(ctx, target, s)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"org/token-demo"}, second.HeldBefore); diff != "" {
		t.Fatalf("second replay's HeldBefore (-want +got):\n%s", diff)
	}
}
