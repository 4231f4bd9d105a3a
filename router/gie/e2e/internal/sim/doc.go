// Package sim is kvindex's routing-quality simulator (the command
// cmd/kvindex-sim): it replays a Mooncake trace through real GIE
// endpoint pickers (router/gie/internal/epptest: GIE v1.5.0's config
// loader and Director in process) in front of simulated vLLM pods whose
// KV events go through the real kvindex pipeline in process (embedded
// etcd, kfake, the ingester in token mode and indexd: wiring/stack), and
// measures what each routing strategy makes of the pods' caches.
//
// The parts, each in its own file:
//
//   - trace.go: the trace (timestamps in ms, hash_ids of 512-token blocks)
//     and each request's chained block keys;
//   - orders.go: the jittered arrival orders (a conversation's turns kept
//     in order) and the trace's reuse ceiling (one pod, infinite cache);
//   - tokens.go: the deterministic token ids and prompt text of a block,
//     and the tokenize endpoint that maps a prompt back to its ids;
//   - pod.go: a pod's GPU LRU and optional CPU tier, and the vLLM events
//     serving a request produces;
//   - loadcap.go: the sliding-window load cap every strategy shares;
//   - queue.go: each pod's prefill queue under the cost model, which
//     gives each request its TTFT and the pods' reported queue metrics;
//   - router.go: the strategies (GIE configs, restarts, the load
//     balancer over K instances, the oracle);
//   - run.go: Config, Run, the per-run accounting and the event-lag probe;
//   - report.go: the figures (per run and per cell: mean, min, max over
//     the orders), the Markdown tables and the plot.
//
// The prefill cost model behind the TTFT estimate is in Config's doc.
package sim
