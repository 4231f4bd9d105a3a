package sim

import (
	"time"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
)

// prefillQueues is the cost model of Config at work: each pod prefills
// one request at a time, first come first served, in trace time. It gives
// each admitted request its TTFT, and at any trace time the metrics a
// vLLM pod would report for that state, so the EPPs' queue and
// KV-cache-utilization scorers see the load the cost model charges for
// (with constant metrics they scored every pod alike, and only affinity
// and the load cap spread the requests). Owned by one run; not safe for
// concurrent use.
type prefillQueues struct {
	gpuBlocks int
	// free is when each pod's last admitted prefill ends.
	free []time.Duration
	// pending are each pod's admitted prefills not known to have ended,
	// in start order.
	pending [][]prefill
}

// prefill is one admitted request: it arrives at at, its prefill runs in
// [start, end) and holds blocks GPU blocks while it runs.
type prefill struct {
	at, start, end time.Duration
	blocks         int
}

func newPrefillQueues(pods, gpuBlocks int) *prefillQueues {
	return &prefillQueues{gpuBlocks: max(gpuBlocks, 1), free: make([]time.Duration, pods), pending: make([][]prefill, pods)}
}

// admit queues a request of blocks blocks arriving at trace time at on
// pod, with prefill time svc, and returns its TTFT: its wait behind the
// pod's earlier prefills plus svc.
func (q *prefillQueues) admit(pod int, at, svc time.Duration, blocks int) time.Duration {
	start := max(at, q.free[pod])
	q.free[pod] = start + svc
	q.pending[pod] = append(q.pending[pod], prefill{at: at, start: start, end: start + svc, blocks: blocks})
	return q.free[pod] - at
}

// metrics returns, per pod, base's copy with the queue at trace time t, as
// vLLM's metrics: WaitingQueueSize counts the requests admitted but not
// yet started (vllm:num_requests_waiting; one arriving after t is not
// there yet), RunningRequestsSize the one prefilling
// (vllm:num_requests_running), and KVCacheUsagePercent, a fraction in
// [0, 1] as GIE reads it, the GPU blocks the running request holds
// (vllm:kv_cache_usage_perc; the cached prefix blocks no request uses are
// free to evict, so they are not counted). t must not decrease between
// calls.
func (q *prefillQueues) metrics(t time.Duration, base *fwkdl.Metrics) []*fwkdl.Metrics {
	out := make([]*fwkdl.Metrics, len(q.pending))
	for p, pend := range q.pending {
		done := 0
		for done < len(pend) && pend[done].end <= t {
			done++
		}
		pend = pend[done:]
		q.pending[p] = pend
		m := base.Clone()
		m.WaitingQueueSize, m.RunningRequestsSize, m.KVCacheUsagePercent = 0, 0, 0
		for _, r := range pend {
			if r.start <= t {
				m.RunningRequestsSize++
				m.KVCacheUsagePercent += float64(r.blocks) / float64(q.gpuBlocks)
			} else if r.at <= t {
				m.WaitingQueueSize++
			}
		}
		m.KVCacheUsagePercent = min(m.KVCacheUsagePercent, 1)
		out[p] = m
	}
	return out
}
