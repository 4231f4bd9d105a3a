package sim

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestHitRate(t *testing.T) {
	for _, tc := range []struct {
		name         string
		tokens, g, c int64
		want         float64
	}{
		{"nothing", 0, 0, 0, 0},
		{"all GPU", 1000, 1000, 0, 100},
		{"CPU hits at 0.8", 1000, 0, 500, 40},
		{"mixed", 2048, 512, 512, 100 * (512 + 0.8*512) / 2048},
	} {
		got := RunResult{PromptTokens: tc.tokens, GPUHitTokens: tc.g, CPUHitTokens: tc.c}.HitRate()
		if math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestSpreadAndQuantile(t *testing.T) {
	if got := spread([]int{10, 10, 10, 10}); got != 1 {
		t.Errorf("even spread = %v", got)
	}
	if got := spread([]int{40, 0, 0, 0}); got != 4 {
		t.Errorf("one pod = %v", got)
	}
	ds := []time.Duration{5, 1, 4, 2, 3}
	if q := quantile(ds, 0.5); q != 3 {
		t.Errorf("median = %v", q)
	}
	if q := quantile(ds, 1); q != 5 {
		t.Errorf("max = %v", q)
	}
	if ds[0] != 5 {
		t.Error("quantile sorted its argument")
	}
}

func TestGrid(t *testing.T) {
	c := DefaultConfig()
	c.Fractions = []float64{0.1, 0.5}
	c.Pods = 4
	c.CPURatio = 2
	grid := c.Grid(1000)
	count := map[string]int{}
	for _, s := range grid {
		count[s.Strategy]++
		if s.Fraction == 0.1 && (s.GPUBlocks != 25 || s.CPUBlocks != 50) {
			t.Errorf("fraction 0.1 of 1000 blocks / 4 pods: %d GPU, %d CPU blocks; want 25, 50", s.GPUBlocks, s.CPUBlocks)
		}
		if stateless(s.Strategy) && (s.Routers != 1 || s.Restarts) {
			t.Errorf("%s runs with %d routers, restarts %v", s.Strategy, s.Routers, s.Restarts)
		}
	}
	// Every cell in each of the 3 orders.
	want := map[string]int{StrategyRandom: 6, StrategyOracle: 6, StrategyApprox: 18, StrategyKVIndex: 18, StrategyKVIndexTier: 6}
	if diff := cmp.Diff(want, count); diff != "" {
		t.Errorf("runs per strategy (-want +got):\n%s", diff)
	}
	orders := map[RunSpec][]int{}
	for _, s := range grid {
		orders[s.cell()] = append(orders[s.cell()], s.Order)
	}
	for cell, os := range orders {
		if diff := cmp.Diff([]int{0, 1, 2}, os); diff != "" {
			t.Errorf("%+v: orders (-want +got):\n%s", cell, diff)
		}
	}
}

func TestValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Errorf("default: %v", err)
	}
	if err := QuickConfig().Validate(); err != nil {
		t.Errorf("quick: %v", err)
	}
	for name, mut := range map[string]func(*Config){
		"no trace":           func(c *Config) { c.TracePath = "" },
		"zero pods":          func(c *Config) { c.Pods = 0 },
		"bad fraction":       func(c *Config) { c.Fractions = []float64{0} },
		"unknown strategy":   func(c *Config) { c.Strategies = []string{"magic"} },
		"no scenario":        func(c *Config) { c.Scenarios = nil },
		"zero routers":       func(c *Config) { c.Scenarios = []Scenario{{Routers: 0}} },
		"restart every 0":    func(c *Config) { c.RestartEvery = 0 },
		"stateless scenario": func(c *Config) { c.Scenarios = []Scenario{{Routers: 1, Strategies: []string{StrategyOracle}}} },
		"zero speedup":       func(c *Config) { c.Speedup = 0 },
		"slack below 1":      func(c *Config) { c.LoadSlack = 0.5 },
		"no parallelism":     func(c *Config) { c.Parallel = 0 },
		"no prefill rate":    func(c *Config) { c.PrefillTokensPerSec = 0 },
		"no order":           func(c *Config) { c.Orders = 0 },
		"orders, no jitter":  func(c *Config) { c.Jitter = 0 },
	} {
		c := DefaultConfig()
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// fakeResult is a Result of the default config's three fractions with
// every strategy in 3 orders: a run's hit rate is 100 x its fraction
// plus its order (plus 10 for the oracle), its event lag (order+1) ms,
// (order+1) x 10 ms and (order+1) x 100 ms; every run valid but the
// kvindex-tier's in order 2.
func fakeResult() *Result {
	c := DefaultConfig()
	r := &Result{Config: c, Lag: []time.Duration{time.Millisecond, 3 * time.Millisecond}, Lookups: 10, Fallbacks: 1,
		Ceilings: []float64{50, 51, 52}}
	for _, s := range c.Grid(80000) {
		hit := int64(100*s.Fraction) + int64(s.Order)
		if s.Strategy == StrategyOracle {
			hit += 10
		}
		o := time.Duration(s.Order + 1)
		issued := time.Duration(float64(100*time.Second) / c.Speedup)
		if s.Strategy == StrategyKVIndexTier && s.Order == 2 {
			issued *= 2
		}
		r.Runs = append(r.Runs, RunResult{Spec: s, Requests: 10, Ghosts: 1, PromptTokens: 100, GPUHitTokens: hit,
			TTFT: []time.Duration{time.Second, 2 * time.Second}, PerPod: []int{6, 4, 0, 0, 0, 0, 0, 0},
			Span: 100 * time.Second, Issued: issued,
			Lag: []time.Duration{o * time.Millisecond, o * 10 * time.Millisecond, o * 100 * time.Millisecond}})
	}
	return r
}

// A run that kept its schedule reports the speedup it was given; one that
// fell behind, the lower one it kept.
func TestEffectiveSpeedup(t *testing.T) {
	for _, tt := range []struct {
		span, issued time.Duration
		want         float64
	}{
		{span: 20 * time.Minute, issued: time.Minute, want: 20},
		{span: 20 * time.Minute, issued: 2 * time.Minute, want: 10},
		{span: time.Minute, issued: 0, want: 0},
	} {
		if got := (RunResult{Span: tt.span, Issued: tt.issued}).EffectiveSpeedup(); got != tt.want {
			t.Errorf("span %v issued in %v: effective speedup %v, want %v", tt.span, tt.issued, got, tt.want)
		}
	}
}

func TestFigures(t *testing.T) {
	r := fakeResult()
	names := map[string]int{}
	for _, f := range r.Figures() {
		names[f.Name]++
		if f.Name == FigHitRate || f.Name == FigGhosts {
			for _, k := range []string{"strategy", "routers", "restarts", "cache_fraction", "speedup", "effective_speedup"} {
				if _, ok := f.Labels[k]; !ok {
					t.Errorf("%s %v: no %s label", f.Name, f.Labels, k)
				}
			}
		}
		if st := f.Labels["stat"]; f.Name == FigOracleGap && f.Labels["strategy"] == StrategyKVIndex && f.Labels["routers"] == "4" && f.Labels["restarts"] == "true" && st != StatMin && st != StatMax {
			if f.Goal == nil || !f.Goal.AtMost || f.Goal.Target != 1 {
				t.Errorf("the goal scenario's gap has goal %+v, want at most 1 point", f.Goal)
			}
			if f.Value != 10 {
				t.Errorf("gap = %v, want the oracle's 10 points", f.Value)
			}
		}
	}
	// Per run, and mean, min and max per cell (a third as many cells as
	// runs): 2 per run.
	runs := len(r.Runs)
	nonOracle := runs - 3*len(r.Config.Fractions)
	per := 2 * runs
	want := map[string]int{FigHitRate: per, FigOracleGap: 2 * nonOracle, FigGhosts: per, FigTTFTP50: per, FigTTFTP99: per, FigSpread: per,
		FigLagP50: per + 1, FigLagP99: per + 1, FigLagMax: per + 1, FigLagMisses: per, FigCeiling: 6, FigLate: 1, FigFallbacks: 1,
		FigTierSplits: per, FigTierHeadroom: per}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("figures (-want +got):\n%s", diff)
	}
}

func TestReport(t *testing.T) {
	r := fakeResult()
	var b bytes.Buffer
	if err := r.WriteMarkdown(&b, "hit_rate.svg"); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, want := range []string{
		"![hit rate against cache size](hit_rate.svg)",
		"**Not valid: 3 of 81 runs fell behind their schedule**",
		"mean [min, max] over 3 arrival orders",
		"| strategy | 0.05 | 0.1 | 0.2 |",
		"| kvindex, 4 routers, restarts | 6.0 [5.0, 7.0] | 11.0 [10.0, 12.0] | 21.0 [20.0, 22.0] |",
		"| oracle | 16.0 [15.0, 17.0] | 21.0 [20.0, 22.0] | 31.0 [30.0, 32.0] |",
		"| ceiling (1 pod, infinite cache) | 51.0 [50.0, 52.0] | 51.0 [50.0, 52.0] | 51.0 [50.0, 52.0] |",
		// Every cell: hit, gap (the same in every order), ghosts, TTFT,
		// event lag p50, p99, max (per order: its middle, its largest
		// sample), load, valid runs.
		"| kvindex, 4 routers, restarts | 0.05 | 500 | 6.00 [5.00, 7.00] | 10.00 | 10.0 | 2000 | 2000 | 20 [10, 30] | 200 [100, 300] | 200 [100, 300] | 4.80 | 3 of 3 |",
		"| kvindex-tier, 4 routers, restarts | 0.05 | 500 | 6.00 [5.00, 7.00] | 10.00 | 10.0 | 2000 | 2000 | 20 [10, 30] | 200 [100, 300] | 200 [100, 300] | 4.80 | 2 of 3 |",
		// Every run.
		"| kvindex-tier, 4 routers, restarts | 0.05 | 2 | 7.00 | 10.0 | 2000 | 2000 | 30 | 300 | 300 | 0 | 0 | 0 | 10.0 | 0 | **no** |",
		"| oracle | 0.2 | 0 | 30.00 | 10.0 | 2000 | 2000 | 10 | 100 | 100 | 0 | 0 | 0 | 20.0 | 0 | yes |",
		"Arrival orders: 3 per cell",
		"Reuse ceiling: the hit rate of one pod with an infinite cache over the same requests (from the block hashes; every hit is a GPU hit), 51.00 [50.00, 52.00].",
		"TTFT cost model",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	path := filepath.Join(t.TempDir(), "hit_rate.svg")
	if err := r.WritePlot(path); err != nil {
		t.Fatal(err)
	}
	svg, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(svg, []byte("<svg")) || !bytes.Contains(svg, []byte("kvindex-tier")) {
		t.Errorf("the plot is not an SVG with the strategies' legend (%d bytes)", len(svg))
	}
}

func TestTierRates(t *testing.T) {
	r := RunResult{Requests: 200, TierSplits: 3, PromptTokens: 10000, TierHeadroom: 50}
	if got := r.TierSplitRate(); got != 1.5 {
		t.Errorf("TierSplitRate = %v, want 1.5 (%%)", got)
	}
	if got := r.TierHeadroomPoints(); got != 0.5 {
		t.Errorf("TierHeadroomPoints = %v, want 0.5 (points)", got)
	}
	if got := (RunResult{}).TierSplitRate() + (RunResult{}).TierHeadroomPoints(); got != 0 {
		t.Errorf("an empty run's tier rates sum to %v, want 0", got)
	}
}
