package e2e

import (
	"testing"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"

	"github.com/kvindex/kvindex/router/gie/internal/epptest"
)

// TestEndpointMetricsReachTheQueueScorer: per-endpoint metrics set with
// SetEndpointMetrics reach GIE's queue and KV-cache-utilization scorers
// through the data layer, as the simulator's pods report their queues.
// With no prefix anywhere (fresh prompts, the approximate config), each
// request goes to the one pod with an empty queue, and follows it when
// the empty queue moves.
func TestEndpointMetricsReachTheQueueScorer(t *testing.T) {
	raw, err := osReadExample("epp-config-approx.yaml")
	if err != nil {
		t.Fatal(err)
	}
	e := epptest.Start(t, raw, pods, []int{8000})
	for round, idle := range []int{2, 0, 1, 2} {
		m := map[string]*fwkdl.Metrics{}
		for i := range pods {
			pm := &fwkdl.Metrics{WaitingQueueSize: 8, RunningRequestsSize: 1, KVCacheUsagePercent: 0.7}
			if i == idle {
				pm = &fwkdl.Metrics{}
			}
			m[podID(i)] = pm
		}
		e.SetEndpointMetrics(m)
		text, _ := prompt("round"+string(rune('a'+round)), 32)
		if got, want := send(t, e, epptest.Completion(model, text)), podID(idle); got != want {
			t.Errorf("round %d: routed to %s, want %s, the only pod with an empty queue", round, got, want)
		}
	}
}
