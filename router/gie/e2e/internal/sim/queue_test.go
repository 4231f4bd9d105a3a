package sim

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
)

// TestPrefillQueues: admitted prefills run one at a time per pod, in
// arrival order; TTFT is the wait plus the service time; the metrics at a
// trace time count the running and the waiting requests and the running
// one's share of the GPU blocks.
func TestPrefillQueues(t *testing.T) {
	ms := time.Millisecond
	q := newPrefillQueues(2, 100)
	// Pod 0: one at 0 for 100 ms (40 blocks), one at 10 ms for 50 ms (waits
	// 90 ms), one at 20 ms for 10 ms (waits 130 ms). Pod 1: one at 500 ms.
	got := []time.Duration{
		q.admit(0, 0, 100*ms, 40),
		q.admit(0, 10*ms, 50*ms, 30),
		q.admit(0, 20*ms, 10*ms, 200),
		q.admit(1, 500*ms, 5*ms, 10),
	}
	if diff := cmp.Diff([]time.Duration{100 * ms, 140 * ms, 140 * ms, 5 * ms}, got); diff != "" {
		t.Errorf("TTFT (-want +got):\n%s", diff)
	}
	type state struct {
		Waiting, Running int
		Usage            float64
		Blocks           int
	}
	base := &fwkdl.Metrics{CacheNumBlocks: 100}
	for _, tc := range []struct {
		at   time.Duration
		want []state
	}{
		{20 * ms, []state{{2, 1, 0.4, 100}, {0, 0, 0, 100}}},
		{100 * ms, []state{{1, 1, 0.3, 100}, {0, 0, 0, 100}}},
		// The third needs 200 blocks of 100: usage saturates at 1.
		{155 * ms, []state{{0, 1, 1, 100}, {0, 0, 0, 100}}},
		{160 * ms, []state{{0, 0, 0, 100}, {0, 0, 0, 100}}},
		{502 * ms, []state{{0, 0, 0, 100}, {0, 1, 0.1, 100}}},
		{505 * ms, []state{{0, 0, 0, 100}, {0, 0, 0, 100}}},
	} {
		var gotS []state
		for _, m := range q.metrics(tc.at, base) {
			gotS = append(gotS, state{m.WaitingQueueSize, m.RunningRequestsSize, m.KVCacheUsagePercent, m.CacheNumBlocks})
		}
		if diff := cmp.Diff(tc.want, gotS); diff != "" {
			t.Errorf("at %v (-want +got):\n%s", tc.at, diff)
		}
	}
	if base.WaitingQueueSize != 0 || base.RunningRequestsSize != 0 {
		t.Errorf("metrics changed its base: %+v", base)
	}
	// A pod idle again starts the next prefill on arrival.
	if got := q.admit(0, time.Second, 10*ms, 1); got != 10*ms {
		t.Errorf("TTFT on an idle pod = %v, want its service time 10ms", got)
	}
}
