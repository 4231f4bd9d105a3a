package bridge_test

import (
	"fmt"
	"testing"

	"github.com/kvindex/kvindex/internal/sim/enginesim"
)

// TestStreamStartsAtZeroOrOne: an engine whose replay buffer is empty at
// the bridge's start may number its batches from 0 (vLLM) or from 1
// (llm-d-inference-sim); either first batch starts the stream, with no
// resync (a stream from 1 cost a replay_overrun resync), and a
// gap right after the start is still healed. The engine from 1 answers
// replays with the topic frame, as the sim does.
func TestStreamStartsAtZeroOrOne(t *testing.T) {
	for _, first := range []uint64{0, 1} {
		for _, dropFirst := range []int{0, 2} {
			t.Run(fmt.Sprintf("from_%d_drop_%d", first, dropFirst), func(t *testing.T) {
				e := newEnv(t, func(c *enginesim.Config) {
					c.FirstSeq = first
					c.ReplayTopicFrame = first == 1
					c.Topic = "kv@10.0.0.1:8000@m"
				})
				cfg := e.config(nil)
				e.start(cfg, true)
				e.engine.DropNext(dropFirst)
				var payloads [][]byte
				for range 6 {
					payloads = append(payloads, e.workload.Next().MustEncode())
				}
				want := e.publishRaw(payloads...)
				if s, _ := want[0].Seq(); s != first {
					t.Fatalf("first batch at seq %d, want %d", s, first)
				}
				check(t, "records", want, e.read(len(want)))
				gaps := 0.0
				if dropFirst > 0 {
					gaps = 1
				}
				checkMetrics(t, cfg, map[string]float64{
					"kvindex_bridge_resyncs_total": 0,
					"kvindex_bridge_gaps_total":    gaps,
				})
			})
		}
	}
}
