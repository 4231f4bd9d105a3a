package replay

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/ingester"
	"github.com/kvindex/kvindex/internal/scenario"
	"github.com/kvindex/kvindex/internal/stack"
	"github.com/kvindex/kvindex/internal/stack/stacktest"
	"github.com/kvindex/kvindex/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testutil.LeakOptions()...) }

// startStack runs a fresh in-process stack with short group timeouts.
func startStack(t *testing.T) *stack.Stack {
	t.Helper()
	return stacktest.Start(t, func(c *stack.Config) {
		c.Ingester = func(c *ingester.Config) {
			c.SessionTimeout, c.RebalanceTimeout, c.LeaseTTL = 6*time.Second, 6*time.Second, 30*time.Second
		}
	})
}

func replay(t *testing.T, s *scenario.Scenario) Result {
	t.Helper()
	st := startStack(t)
	prod, err := kgo.NewClient(kgo.SeedBrokers(st.KafkaAddr()))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	idx, err := client.New(st.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer idx.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := Run(ctx, Target{Producer: prod, Topic: st.Topic(), Index: idx}, s)
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
