package ingester

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/scenario"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
)

func ingesttestProducer(t *testing.T, brokers []string) *kgo.Client {
	return ingesttest.NewProducer(t, brokers)
}

// TestScenarios runs every public scenario through Kafka and the ingester
// and checks each lookup step against the block keys in etcd once the
// publishes before it are applied; the reference model must agree.
func TestScenarios(t *testing.T) {
	t.Parallel()
	scs, err := scenario.Glob(testutil.ScenarioGlob(t))
	if err != nil {
		t.Fatal(err)
	}
	topics := make([]string, len(scs))
	for i, sc := range scs {
		topics[i] = "t-" + sc.Name
	}
	e := newEnv(t, 2, topics)
	for i, sc := range scs {
		t.Run(sc.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(60*time.Second))
			defer cancel()
			topic := topics[i]
			cfg := e.config(t, topic, "g-"+sc.Name, fmt.Sprintf("/kvindex/scenario-%d/", i))
			cfg.HashMode = keyspace.HashMode(sc.HashMode) // token-mode files run in token mode
			start(t, cfg)
			model := refmodel.New(refmodel.Config{LivenessWindow: cfg.LivenessWindow, HashMode: cfg.HashMode})
			produced := ingesttest.Offsets{}
			for _, st := range sc.Steps {
				switch st.Kind {
				case scenario.KindPublish:
					r := refmodel.Record{Key: st.Publish.Key, Headers: st.Publish.Headers, Value: st.Publish.Value, Time: time.Now()}
					model.Apply(r)
					produced.Merge(ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{r}))
				case scenario.KindLookup:
					ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic, produced)
					blocks := ingesttest.Blocks(t, ctx, e.etcd.Client, cfg.Keyspace)
					got := refmodel.LookupBlocks(blocks, st.Lookup.Model, st.Lookup.Keys())
					if diffs := scenario.Compare(st.Lookup.Expect, got); diffs != nil {
						t.Errorf("line %d: lookup differs from the scenario: %v", st.Line, diffs)
					}
					if diff := cmp.Diff(model.Blocks(), blocks, cmpopts.EquateEmpty()); diff != "" {
						t.Errorf("line %d: etcd blocks differ from the reference model (-model +etcd):\n%s", st.Line, diff)
					}
				}
			}
		})
	}
}
