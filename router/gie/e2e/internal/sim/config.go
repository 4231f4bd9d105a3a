package sim

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"time"
)

// CPUHitWeight is what a block found on the CPU tier counts for in the
// hit rate, against 1 for a GPU block: loading it back costs about a
// fifth of computing it (see Config's cost model).
const CPUHitWeight = 0.8

// podPort is the pods' serving port; their bridges name them
// address:8000, as deploy/examples/vllm-sidecar does.
const podPort = 8000

// Config configures a simulation. DefaultConfig and QuickConfig return
// filled ones; Validate checks one.
//
// The prefill cost model behind the TTFT estimate: each pod prefills one
// request at a time, in arrival order, in trace time. A request's service
// time is PrefillOverhead plus its uncached tokens at PrefillTokensPerSec
// plus its CPU-tier hit tokens at a fifth of that cost (1 - CPUHitWeight);
// GPU hits cost nothing. Its TTFT is its wait behind the pod's earlier
// prefills plus its service time. Decoding is not modelled. The pods
// report that queue to the EPPs before each request, as vLLM's metrics
// would (waiting and running requests, the running request's share of the
// GPU cache: prefillQueues), so the stock queue and KV-cache-utilization
// scorers weigh the load the cost model charges for.
type Config struct {
	// TracePath is the Mooncake trace (JSON lines).
	TracePath string
	// ConfigDir holds the example EPP configs (deploy/examples/gie).
	ConfigDir string
	// MaxRequests keeps the trace's first requests only; 0 keeps all.
	MaxRequests int
	// Pods is the number of simulated vLLM pods.
	Pods int
	// Fractions are the cache sizes run: a pod's GPU cache holds
	// fraction x (the trace's unique blocks / Pods) blocks.
	Fractions []float64
	// CPURatio sizes each pod's CPU tier, in GPU caches (1: as many blocks
	// as its GPU); 0 runs without a CPU tier.
	CPURatio float64
	// Strategies are the strategies run (Strategies lists them).
	Strategies []string
	// Scenarios are the router setups each stateful strategy (approx,
	// kvindex, kvindex-tier) runs in.
	Scenarios []Scenario
	// RestartEvery is how many requests a restarting instance takes
	// before it is replaced.
	RestartEvery int
	// Speedup divides the trace's time: a request at trace time t is
	// issued t / Speedup after its run starts.
	Speedup float64
	// LoadWindow and LoadSlack are the load cap (LoadCap): over the last
	// LoadWindow requests no pod takes more than LoadSlack x its share.
	LoadWindow int
	LoadSlack  float64
	// Parallel is how many runs go at once (each on its own model in the
	// one stack).
	Parallel int
	// Seed seeds the pods' engine hashes, the oracle's tie breaks and the
	// arrival orders' jitter.
	Seed uint64
	// Orders is how many arrival orders each cell runs in: order 0 is the
	// trace's own, orders 1 to Orders-1 jittered ones (ArrivalOrder, with
	// Jitter). The tables report a cell's mean [min, max] over them.
	Orders int
	// Jitter bounds how far a jittered order moves a request's arrival,
	// either way, in trace time (see ArrivalOrder).
	Jitter time.Duration
	// The cost model (see above).
	PrefillTokensPerSec float64
	PrefillOverhead     time.Duration
	// LagProbeEvery is how often the event-lag probe stores a block and
	// waits to see it in the index.
	LagProbeEvery time.Duration
	// Quick marks a quick run (a label in the report only).
	Quick bool
	// Progress, when set, receives one line per finished run.
	Progress io.Writer
}

// Scenario is a router setup: K instances behind the load balancer,
// restarting every Config.RestartEvery requests or never.
type Scenario struct {
	Routers  int
	Restarts bool
	// Strategies limits the scenario to these stateful strategies; nil
	// runs every stateful strategy of the config in it.
	Strategies []string
}

// CrossScenarios returns every combination of routers and restarts, for
// every strategy.
func CrossScenarios(routers []int, restarts []bool) []Scenario {
	var out []Scenario
	for _, k := range routers {
		for _, r := range restarts {
			out = append(out, Scenario{Routers: k, Restarts: r})
		}
	}
	return out
}

// DefaultConfig returns the default run: the whole conversation trace, 8
// pods with a CPU tier as large as their GPU cache, three cache fractions;
// approx and kvindex with 1 router, 4 routers, and 4 routers restarting
// every 2000 requests; kvindex-tier in that last setup (the goal
// scenario); random and the oracle; each cell in 3 arrival orders (the
// trace's own and 2 jittered by up to 1.5 s, half the conversation
// trace's 3 s spacing between arrivals); at 20x, 4 runs at a time.
func DefaultConfig() Config {
	return Config{
		TracePath:  "testdata/mooncake/conversation_trace.jsonl",
		ConfigDir:  "deploy/examples/gie",
		Pods:       8,
		Fractions:  []float64{0.05, 0.1, 0.2},
		CPURatio:   1,
		Strategies: slices.Clone(Strategies),
		Scenarios: []Scenario{
			{Routers: 1, Strategies: []string{StrategyApprox, StrategyKVIndex}},
			{Routers: 4, Strategies: []string{StrategyApprox, StrategyKVIndex}},
			{Routers: 4, Restarts: true},
		},
		RestartEvery:        2000,
		Speedup:             20,
		LoadWindow:          200,
		LoadSlack:           1.5,
		Parallel:            4,
		Seed:                17,
		Orders:              3,
		Jitter:              1500 * time.Millisecond,
		PrefillTokensPerSec: 10000,
		PrefillOverhead:     20 * time.Millisecond,
		LagProbeEvery:       250 * time.Millisecond,
	}
}

// QuickConfig returns the quick run (--quick): the trace's first 1500
// requests, one cache fraction, 4 routers restarting every 300 requests,
// every strategy, in the trace's own arrival order only.
func QuickConfig() Config {
	c := DefaultConfig()
	c.MaxRequests = 1500
	c.Fractions = []float64{0.2}
	c.Scenarios = []Scenario{{Routers: 4, Restarts: true}}
	c.RestartEvery = 300
	c.Speedup = 30
	c.Parallel = 5
	c.Orders = 1
	c.Quick = true
	return c
}

// Validate reports the first problem of c.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.TracePath == "" {
		bad("no trace")
	}
	if c.ConfigDir == "" {
		bad("no example config directory")
	}
	if c.MaxRequests < 0 {
		bad("max requests %d is negative", c.MaxRequests)
	}
	if c.Pods < 1 || c.Pods > 250 {
		bad("pods %d is not in [1, 250]", c.Pods)
	}
	if len(c.Fractions) == 0 {
		bad("no cache fraction")
	}
	for _, f := range c.Fractions {
		if !(f > 0 && f <= 100) {
			bad("cache fraction %v is not in (0, 100]", f)
		}
	}
	if !(c.CPURatio >= 0 && c.CPURatio <= 100) {
		bad("CPU ratio %v is not in [0, 100]", c.CPURatio)
	}
	if len(c.Strategies) == 0 {
		bad("no strategy")
	}
	for _, s := range c.Strategies {
		if !slices.Contains(Strategies, s) {
			bad("unknown strategy %q (known: %v)", s, Strategies)
		}
	}
	if len(c.Scenarios) == 0 {
		bad("no router scenario")
	}
	for _, sc := range c.Scenarios {
		if sc.Routers < 1 || sc.Routers > 64 {
			bad("router count %d is not in [1, 64]", sc.Routers)
		}
		if sc.Restarts && c.RestartEvery < 1 {
			bad("restarts need RestartEvery >= 1 (got %d)", c.RestartEvery)
		}
		for _, s := range sc.Strategies {
			if !slices.Contains(Strategies, s) || stateless(s) {
				bad("scenario strategy %q is not a stateful strategy", s)
			}
		}
	}
	if !(c.Speedup > 0) {
		bad("speedup %v is not positive", c.Speedup)
	}
	if c.LoadWindow < 0 {
		bad("load window %d is negative", c.LoadWindow)
	}
	if c.LoadWindow > 0 && !(c.LoadSlack >= 1) {
		bad("load slack %v is below 1", c.LoadSlack)
	}
	if c.Parallel < 1 {
		bad("parallel %d is below 1", c.Parallel)
	}
	if c.Orders < 1 || c.Orders > 100 {
		bad("orders %d is not in [1, 100]", c.Orders)
	}
	if c.Orders > 1 && c.Jitter <= 0 {
		bad("jittered orders need a positive jitter (got %v)", c.Jitter)
	}
	if !(c.PrefillTokensPerSec > 0) || c.PrefillOverhead < 0 {
		bad("the cost model needs a positive prefill rate and no negative overhead")
	}
	if c.LagProbeEvery <= 0 {
		bad("lag probe interval %v is not positive", c.LagProbeEvery)
	}
	return errors.Join(errs...)
}
