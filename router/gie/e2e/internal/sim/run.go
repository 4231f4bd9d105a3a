package sim

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/indexd"
	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/router/gie"
	"github.com/kvindex/kvindex/router/gie/e2e/internal/kvevents"
	"github.com/kvindex/kvindex/router/gie/internal/epptest"
	"github.com/kvindex/kvindex/wiring/stack"
)

// RunSpec is one run of the grid: a strategy with K router instances,
// restarting or not, at one cache size (together, a cell), in one arrival
// order.
type RunSpec struct {
	Strategy string
	Routers  int
	Restarts bool
	Fraction float64
	// GPUBlocks and CPUBlocks are each pod's cache sizes.
	GPUBlocks, CPUBlocks int
	// Order is the arrival order (ArrivalOrder's k; 0 the trace's own).
	Order int
}

// cell returns the spec without its order: the runs of one cell in
// every order share it.
func (s RunSpec) cell() RunSpec {
	s.Order = 0
	return s
}

// RunResult is what one run measured.
type RunResult struct {
	Spec RunSpec
	// Requests counts the requests routed; RouteErrors those the director
	// refused (not served, not counted anywhere else).
	Requests, RouteErrors int
	// PromptTokens sums the routed prompts' tokens; GPUHitTokens and
	// CPUHitTokens their tokens found on GPU and only on the CPU tier.
	PromptTokens, GPUHitTokens, CPUHitTokens int64
	// TierSplits counts the requests where a tier-blind choice can cost
	// hit value (TierHeadroom > 0 for the request), and TierHeadroom sums
	// that cost in tokens, both judged in the pods' true states when the
	// request was routed (tierHeadroom): what a tier-aware choice gains
	// over a tier-blind one, decision by decision, in the states this
	// run's strategy made.
	TierSplits   int
	TierHeadroom float64
	// Ghosts counts requests sent to a pod for more cached blocks than it
	// had (the router's match on the chosen endpoint exceeded the pod's
	// true prefix).
	Ghosts int
	// TTFT is each request's estimated time to first token (the cost
	// model of Config), in trace time.
	TTFT []time.Duration
	// PerPod counts the requests each pod took.
	PerPod []int
	// RouterRestarts counts router instances replaced.
	RouterRestarts int
	// Late are the requests' delays past their due wall time (the
	// simulator falling behind the trace / speedup).
	Late []time.Duration
	// Wall is the run's wall time.
	Wall time.Duration
	// Span is the trace time of the run's last request; Issued the wall
	// time from the run's start until that request was routed.
	Span, Issued time.Duration
	// Lag are the event-lag probe's samples sent while the run went, and
	// LagMisses its probes of that time not seen within 10 s: the
	// pipeline's lag under this run and the runs beside it (with Parallel
	// 1, this run's alone).
	Lag       []time.Duration
	LagMisses int
	// began and ended bound the run in wall time (for Lag).
	began, ended time.Time
}

// EffectiveSpeedup is the speedup the run really kept: its trace span
// over the wall time it took to issue it. It equals Config.Speedup when
// the simulator kept up with the schedule and is lower when it fell
// behind (see Late); 0 for a run without requests.
func (r RunResult) EffectiveSpeedup() float64 {
	if r.Issued <= 0 {
		return 0
	}
	return float64(r.Span) / float64(r.Issued)
}

// Validity bounds: a run's figures hold only if its requests
// went out on schedule and it kept the speedup asked for.
const (
	// MaxLateFraction bounds a valid run's p99 lateness, as a fraction of
	// its trace span.
	MaxLateFraction = 0.01
	// MaxSpeedupShortfall bounds how far below the requested speedup a
	// valid run's effective speedup may be, as a fraction of it.
	MaxSpeedupShortfall = 0.10
)

// LateP99 is the p99 of every request's lateness, on-time requests
// counting 0 (Late holds only the late ones).
func (r RunResult) LateP99() time.Duration {
	n := max(r.Requests, len(r.Late))
	if n == 0 || len(r.Late) == 0 {
		return 0
	}
	s := slices.Clone(r.Late)
	slices.Sort(s)
	rank := min(n-1, int(0.99*float64(n))) // among n values, the first n-len(Late) being 0
	if i := rank - (n - len(s)); i >= 0 {
		return s[i]
	}
	return 0
}

// Valid reports whether the run's figures hold at requested speedup
// speedup: its p99 lateness is at most MaxLateFraction of its trace span,
// and its effective speedup within MaxSpeedupShortfall of speedup. A run
// without requests is not valid.
func (r RunResult) Valid(speedup float64) bool {
	if r.Requests == 0 || r.Span <= 0 {
		return false
	}
	return float64(r.LateP99()) <= MaxLateFraction*float64(r.Span) &&
		math.Abs(r.EffectiveSpeedup()-speedup) <= MaxSpeedupShortfall*speedup
}

// GhostRate returns the ghost routes in percent of the routed requests.
func (r RunResult) GhostRate() float64 {
	if r.Requests == 0 {
		return 0
	}
	return 100 * float64(r.Ghosts) / float64(r.Requests)
}

// TierSplitRate returns the requests with a tier split (TierSplits) in
// percent of the routed requests.
func (r RunResult) TierSplitRate() float64 {
	if r.Requests == 0 {
		return 0
	}
	return 100 * float64(r.TierSplits) / float64(r.Requests)
}

// TierHeadroomPoints returns TierHeadroom in hit-rate points (percent of
// the prompt tokens, as HitRate): what a perfect tier-aware choice adds,
// decision by decision in this run's pod states, to a perfect tier-blind
// one breaking its ties at random (a worse tie-break loses more; later
// effects on the caches are not followed).
func (r RunResult) TierHeadroomPoints() float64 {
	if r.PromptTokens == 0 {
		return 0
	}
	return 100 * r.TierHeadroom / float64(r.PromptTokens)
}

// HitRate returns the token-weighted hit rate in percent: GPU hit tokens
// count 1, CPU-tier hit tokens CPUHitWeight.
func (r RunResult) HitRate() float64 {
	if r.PromptTokens == 0 {
		return 0
	}
	return 100 * (float64(r.GPUHitTokens) + CPUHitWeight*float64(r.CPUHitTokens)) / float64(r.PromptTokens)
}

// Result is a whole simulation's measurements.
type Result struct {
	Config Config
	// Trace is the trace as loaded (its requests are not kept here).
	Requests, Skipped, Clamped, UniqueBlocks, MaxBlocks int
	FirstSkip                                           string
	Runs                                                []RunResult
	// Ceilings is the trace's reuse ceiling (Ceiling) in each arrival
	// order, by order.
	Ceilings []float64
	// Lag are the event-lag probe's samples: produce -> visible in a
	// Lookup; LagMisses counts probes not visible within 10 s.
	Lag       []time.Duration
	LagMisses int
	// PublishErrors counts KV event records the broker refused;
	// PublishLastErr is the last refusal.
	PublishErrors  int
	PublishLastErr string
	// Lookups, Fallbacks and SpeculativeBlocks total the kvindex
	// producers' kvindex_gie_lookups_total, kvindex_gie_fallbacks_total and
	// kvindex_gie_speculative_blocks_total over every kvindex run.
	Lookups, Fallbacks, SpeculativeBlocks float64
	// TokenizeCalls counts the kvindex producers' calls to the
	// simulator's tokenizer (0 when every request carried its token ids).
	TokenizeCalls int64
	// StackStart is how long the stack took to be ready; Wall the whole
	// simulation.
	StackStart, Wall time.Duration
}

// Grid returns the runs of c for a trace of uniqueBlocks unique blocks,
// in order: by cache fraction, then strategy, scenario and arrival order. A
// stateless strategy (random, oracle) runs once per fraction, with one
// router and no restarts: more instances or restarts change nothing in
// it.
func (c Config) Grid(uniqueBlocks int) []RunSpec {
	var out []RunSpec
	for _, f := range c.Fractions {
		gpu := max(1, int(math.Round(f*float64(uniqueBlocks)/float64(c.Pods))))
		cpu := int(math.Round(c.CPURatio * float64(gpu)))
		for _, s := range c.Strategies {
			add := func(routers int, restarts bool) {
				for o := range c.Orders {
					out = append(out, RunSpec{Strategy: s, Routers: routers, Restarts: restarts, Fraction: f, GPUBlocks: gpu, CPUBlocks: cpu, Order: o})
				}
			}
			if stateless(s) {
				add(1, false)
				continue
			}
			for _, sc := range c.Scenarios {
				if sc.Strategies == nil || slices.Contains(sc.Strategies, s) {
					add(sc.Routers, sc.Restarts)
				}
			}
		}
	}
	return out
}

// Run runs the simulation: it loads the trace, starts the kvindex stack
// in process, runs the grid (Parallel runs at a time) and stops
// everything before it returns. It fails on a bad config, an unreadable
// trace or configs, a cache too small for the trace's longest request, or
// a part of the pipeline failing; a run's refused requests are counted,
// not fatal.
func Run(ctx context.Context, c Config) (*Result, error) {
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	began := time.Now()
	f, err := os.Open(c.TracePath)
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	tr, err := ReadTrace(f, c.MaxRequests)
	_ = f.Close()
	if err != nil {
		return nil, fmt.Errorf("sim: %s: %w", c.TracePath, err)
	}
	grid := c.Grid(tr.UniqueBlocks)
	for _, s := range grid {
		if s.GPUBlocks < tr.MaxBlocks {
			return nil, fmt.Errorf("sim: cache fraction %v gives %d GPU blocks a pod, fewer than the trace's longest request (%d blocks)", s.Fraction, s.GPUBlocks, tr.MaxBlocks)
		}
	}
	res := &Result{Config: c, Requests: len(tr.Requests), Skipped: tr.Skipped, Clamped: tr.Clamped,
		UniqueBlocks: tr.UniqueBlocks, MaxBlocks: tr.MaxBlocks, FirstSkip: tr.FirstSkip}
	orders := make([][]Request, c.Orders)
	for k := range orders {
		orders[k] = ArrivalOrder(tr.Requests, k, c.Jitter, c.Seed)
		res.Ceilings = append(res.Ceilings, Ceiling(orders[k]))
	}
	// The longest prompt, in tokens: indexd and the producer take it whole.
	maxTokens := max(indexd.DefaultMaxTokens, (tr.MaxBlocks+1)*BlockTokens)

	dir, err := os.MkdirTemp("", "kvindex-sim-")
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	defer os.RemoveAll(dir)
	stackCtx, stopStack := context.WithCancel(context.Background())
	defer stopStack()
	st, err := stack.Start(stackCtx, stack.Config{DataDir: dir, EtcdAddr: "127.0.0.1:0", KafkaAddr: "127.0.0.1:0",
		GRPCAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0", UnsafeNoFsync: true,
		// The in-process broker holds its log in memory, and a run
		// produces about half a GB of token ids: keep a minute of it (the
		// ingester is seconds behind at worst). etcd's history likewise.
		KafkaRetention: simRetention, CompactionRetention: simRetention,
		Indexd: func(ic *indexd.Config) { ic.MaxTokens = maxTokens }})
	if err != nil {
		return nil, fmt.Errorf("sim: starting the stack: %w", err)
	}
	stackDone := make(chan error, 1)
	go func() { stackDone <- st.Run(stackCtx) }()
	var stackErr error
	stackStopped := false
	stop := func() {
		if !stackStopped {
			stackStopped = true
			stopStack()
			stackErr = <-stackDone
		}
	}
	defer stop()
	if err := waitReady(ctx, st, stackDone); err != nil {
		return nil, err
	}
	res.StackStart = time.Since(began)

	tok, err := StartTokenizer()
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tok.Close(sctx)
	}()
	configs, err := Configs(c.ConfigDir, st.GRPCAddr(), tok.URL(), maxTokens)
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	registerPlugins()
	metrics := gie.Register()
	pub, err := kvevents.New([]string{st.KafkaAddr()}, st.Topic())
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = pub.Close(cctx)
	}()
	kv, err := client.New(st.GRPCAddr())
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	defer func() { _ = kv.Close() }()

	// The lag probe runs beside the runs until they end.
	probeCtx, stopProbe := context.WithCancel(ctx)
	var lp lagProbe
	var probeWG sync.WaitGroup
	probeWG.Go(func() { lp.run(probeCtx, pub, kv, c.LagProbeEvery) })

	results := make([]RunResult, len(grid))
	var progressMu sync.Mutex
	done := 0
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(c.Parallel)
	for i, spec := range grid {
		g.Go(func() error {
			// Records are produced under ctx, not gctx: gctx ends when the
			// last run does, and would cancel its records still buffered.
			r, err := runOne(gctx, ctx, c, orders[spec.Order], spec, i, configs[spec.Strategy], pub)
			if err != nil {
				return fmt.Errorf("sim: run %d (%s, %d routers, restarts %v, fraction %v, order %d): %w",
					i, spec.Strategy, spec.Routers, spec.Restarts, spec.Fraction, spec.Order, err)
			}
			results[i] = r
			if c.Progress != nil {
				progressMu.Lock()
				done++
				fmt.Fprintf(c.Progress, "kvindex-sim: %d/%d done: %s at fraction %v, order %d: hit rate %.2f%% (%d requests, %d late, p99 %v, speedup kept %.1f, %v)\n",
					done, len(grid), variant(spec), spec.Fraction, spec.Order, r.HitRate(), r.Requests, len(r.Late), r.LateP99().Round(time.Millisecond), r.EffectiveSpeedup(), r.Wall.Round(time.Second))
				progressMu.Unlock()
			}
			return nil
		})
	}
	err = g.Wait()
	stopProbe()
	probeWG.Wait()
	if err != nil {
		return nil, err
	}
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := pub.Flush(fctx); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	var perr error
	if res.PublishErrors, perr = pub.Errors(); perr != nil {
		res.PublishLastErr = perr.Error()
	}
	for i := range results {
		results[i].Lag, results[i].LagMisses = lp.during(results[i].began, results[i].ended)
	}
	res.Runs = results
	res.Lag, res.LagMisses = lp.lags(), len(lp.misses)
	res.TokenizeCalls = tok.Calls.Load()
	res.Lookups, res.Fallbacks, res.SpeculativeBlocks, err = producerTotals(metrics)
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	stop()
	if stackErr != nil {
		return nil, fmt.Errorf("sim: the stack: %w", stackErr)
	}
	res.Wall = time.Since(began)
	return res, nil
}

// waitReady waits until the stack serves its first snapshot.
func waitReady(ctx context.Context, st *stack.Stack, done chan error) error {
	deadline := time.Now().Add(90 * time.Second)
	for err := st.Ready(); err != nil; err = st.Ready() {
		if time.Now().After(deadline) {
			return fmt.Errorf("sim: the stack is not ready after 90 s: %w", err)
		}
		select {
		case err := <-done:
			done <- err
			return fmt.Errorf("sim: the stack stopped before it was ready: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// producerTotals gathers the kvindex producers' counters.
func producerTotals(m *gie.Metrics) (lookups, fallbacks, speculative float64, err error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(m); err != nil {
		return 0, 0, 0, err
	}
	fams, err := reg.Gather()
	if err != nil {
		return 0, 0, 0, err
	}
	for _, f := range fams {
		sum := 0.0
		for _, mt := range f.GetMetric() {
			sum += mt.GetCounter().GetValue()
		}
		switch f.GetName() {
		case "kvindex_gie_lookups_total":
			lookups = sum
		case "kvindex_gie_fallbacks_total":
			fallbacks = sum
		case "kvindex_gie_speculative_blocks_total":
			speculative = sum
		}
	}
	return lookups, fallbacks, speculative, nil
}

// simRetention is how long the simulator's stack keeps Kafka records and
// etcd revisions.
const simRetention = time.Minute

// maxRecordBlocks bounds the stored blocks of one Kafka record (a
// 512-token block is about 2 KiB of msgpack token ids).
const maxRecordBlocks = 64

// runOne runs one spec over the trace on its own model name and pod
// addresses, so runs share the stack without seeing each other.
//
// ctx bounds the run; pubCtx the buffering of its event records.
func runOne(ctx, pubCtx context.Context, c Config, reqs []Request, spec RunSpec, idx int, raw []byte, pub *kvevents.Publisher) (RunResult, error) {
	began := time.Now()
	res := RunResult{Spec: spec, PerPod: make([]int, c.Pods), TTFT: make([]time.Duration, 0, len(reqs)), began: began}
	model := fmt.Sprintf("sim-run-%03d", idx)
	rng := rand.New(rand.NewPCG(c.Seed, uint64(idx)))
	pods := make([]*Pod, c.Pods)
	eps := make([]epptest.Pod, c.Pods)
	addrs := make([]string, c.Pods)
	byAddr := map[string]int{}
	for p := range c.Pods {
		pods[p] = NewPod(spec.GPUBlocks, spec.CPUBlocks, rng.Uint64())
		ip := fmt.Sprintf("10.%d.%d.%d", 1+idx/256, idx%256, p+1)
		eps[p] = epptest.Pod{Name: "vllm-" + strconv.Itoa(p), IP: ip}
		addrs[p] = ip + ":" + strconv.Itoa(podPort)
		byAddr[addrs[p]] = p
	}
	// What every pod reports besides its queue (see prefillQueues).
	base := &fwkdl.Metrics{CacheBlockSize: BlockTokens, CacheNumBlocks: spec.GPUBlocks}
	var rt *routers
	if usesEPP(spec.Strategy) {
		every := 0
		if spec.Restarts {
			every = c.RestartEvery
		}
		var err error
		rt, err = newRouters(ctx, raw, eps, base, spec.Routers, every)
		if err != nil {
			return res, err
		}
		defer rt.close()
	}
	lc := NewLoadCap(c.Pods, c.LoadWindow, c.LoadSlack)
	queues := newPrefillQueues(c.Pods, spec.GPUBlocks)
	podMetrics := make(map[string]*fwkdl.Metrics, c.Pods)
	start := time.Now()
	for _, r := range reqs {
		due := start.Add(time.Duration(float64(r.At) / c.Speedup))
		if d := time.Until(due); d > 0 {
			select {
			case <-ctx.Done():
				return res, ctx.Err()
			case <-time.After(d):
			}
		} else {
			res.Late = append(res.Late, -d)
		}
		allowed := lc.Allowed()
		var pod, believed int
		if rt != nil {
			req := epptest.Request{Model: model, RawBody: completionBody(model, PromptText(r))}
			if slices.Contains(allowed, false) {
				for p, ok := range allowed {
					if ok {
						req.Subset = append(req.Subset, addrs[p])
					}
				}
			}
			for p, m := range queues.metrics(r.At, base) {
				podMetrics[addrs[p]] = m
			}
			ep, b, err := rt.route(ctx, req, podMetrics)
			if err != nil {
				if ctx.Err() != nil {
					return res, ctx.Err()
				}
				res.RouteErrors++
				continue
			}
			p, ok := byAddr[ep]
			if !ok {
				return res, fmt.Errorf("the router chose %q, not a pod of the pool", ep)
			}
			pod, believed = p, b
		}
		matches := matchPods(pods, allowed, r.Keys)
		if rt == nil {
			pod, believed = oracle(matches, rng)
		}
		if room := tierHeadroom(matches); room > 0 {
			res.TierSplits++
			res.TierHeadroom += room * BlockTokens
		}
		s := pods[pod].Serve(r.Keys, r.IDs[:len(r.IDs)-1])
		if err := publish(pubCtx, pub, model, addrs[pod], s.Events); err != nil {
			return res, err
		}
		lc.Add(pod)
		res.Requests++
		res.PerPod[pod]++
		if believed > s.GPUHits+s.CPUHits {
			res.Ghosts++
		}
		tokens := r.Tokens()
		gpuTok, cpuTok := s.GPUHits*BlockTokens, s.CPUHits*BlockTokens
		res.PromptTokens += int64(tokens)
		res.GPUHitTokens += int64(gpuTok)
		res.CPUHitTokens += int64(cpuTok)
		res.Span, res.Issued = r.At, time.Since(start)
		svc := c.PrefillOverhead + time.Duration((float64(tokens-gpuTok-cpuTok)+(1-CPUHitWeight)*float64(cpuTok))/c.PrefillTokensPerSec*float64(time.Second))
		res.TTFT = append(res.TTFT, queues.admit(pod, r.At, svc, len(r.Keys)))
	}
	if rt != nil {
		res.RouterRestarts = rt.restarts
	}
	// The run's pods leave the index: vLLM's AllBlocksCleared.
	for p := range pods {
		if err := pub.PublishAsync(pubCtx, model, addrs[p], 0, []events.Event{{Type: events.AllBlocksCleared}}); err != nil {
			return res, err
		}
	}
	res.ended = time.Now()
	res.Wall = res.ended.Sub(began)
	return res, nil
}

// completionBody is the JSON body of a /v1/completions request of prompt
// for model. Both are plain ASCII without quotes or backslashes (model
// names are the simulator's, prompts PromptText's), so no escaping is
// needed; building it directly spares encoding/json a 50 KB string per
// request.
func completionBody(model, prompt string) []byte {
	b := make([]byte, 0, len(model)+len(prompt)+32)
	b = append(b, `{"model":"`...)
	b = append(b, model...)
	b = append(b, `","prompt":"`...)
	b = append(b, prompt...)
	return append(b, `"}`...)
}

// publish produces a request's events from pod as one or more records
// (at most maxRecordBlocks stored blocks each), in order.
func publish(ctx context.Context, pub *kvevents.Publisher, model, pod string, evs []events.Event) error {
	for len(evs) > 0 {
		n, blocks := 0, 0
		for n < len(evs) && (n == 0 || blocks+len(evs[n].TokenIDs)/BlockTokens <= maxRecordBlocks) {
			blocks += len(evs[n].TokenIDs) / BlockTokens
			n++
		}
		if err := pub.PublishAsync(ctx, model, pod, 0, evs[:n]); err != nil {
			return err
		}
		evs = evs[n:]
	}
	return nil
}

// lagProbe measures the pipeline's event lag while the runs go: every
// interval it stores one fresh block from a pod of its own model, waits
// until a Lookup answers it (at most 10 s), then removes it.
type lagProbe struct {
	samples []lagSample
	// misses are the send times of probes not seen within probeWait.
	misses []time.Time
}

// lagSample is one probe seen: when it was sent and its lag.
type lagSample struct {
	sent time.Time
	lag  time.Duration
}

// lags returns every sample's lag.
func (lp *lagProbe) lags() []time.Duration {
	out := make([]time.Duration, len(lp.samples))
	for i, s := range lp.samples {
		out[i] = s.lag
	}
	return out
}

// during returns the lags of the probes sent in [from, to] and how many
// of that time were missed.
func (lp *lagProbe) during(from, to time.Time) (lags []time.Duration, misses int) {
	for _, s := range lp.samples {
		if !s.sent.Before(from) && !s.sent.After(to) {
			lags = append(lags, s.lag)
		}
	}
	for _, m := range lp.misses {
		if !m.Before(from) && !m.After(to) {
			misses++
		}
	}
	return lags, misses
}

const (
	probeModel = "sim-lag-probe"
	probePod   = "10.255.255.1:8000"
	probeWait  = 10 * time.Second
)

func (lp *lagProbe) run(ctx context.Context, pub *kvevents.Publisher, kv *client.Client, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for i := uint64(1); ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		id := 1<<62 + i
		toks := AppendBlockTokens(nil, id, BlockTokens)
		ev := events.Event{Type: events.BlockStored, BlockSize: BlockTokens, Medium: MediumGPU, BlockHashes: []uint64{mix(id)}}
		for _, tk := range toks {
			ev.TokenIDs = append(ev.TokenIDs, int64(tk))
		}
		sent := time.Now()
		if err := pub.Publish(ctx, probeModel, probePod, 0, []events.Event{ev}); err != nil {
			if ctx.Err() != nil {
				return
			}
			lp.misses = append(lp.misses, sent)
			continue
		}
		seen := false
		for !seen && time.Since(sent) < probeWait && ctx.Err() == nil {
			res, err := kv.LookupTokens(ctx, probeModel, client.TokenPrompt{TokenIDs: toks})
			if err == nil {
				for _, m := range res.Matches {
					seen = seen || (m.Endpoint.Pod == probePod && m.Blocks >= 1)
				}
			}
			if !seen {
				select {
				case <-ctx.Done():
				case <-time.After(2 * time.Millisecond):
				}
			}
		}
		switch {
		case seen:
			lp.samples = append(lp.samples, lagSample{sent, time.Since(sent)})
		case ctx.Err() == nil:
			lp.misses = append(lp.misses, sent)
		}
		rm := events.Event{Type: events.BlockRemoved, Medium: MediumGPU, BlockHashes: []uint64{mix(id)}}
		if err := pub.Publish(ctx, probeModel, probePod, 0, []events.Event{rm}); err != nil && ctx.Err() != nil {
			return
		}
	}
}
