package sim

import (
	"cmp"
	"fmt"
	"image/color"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/kvindex/kvindex/bench"
)

// Figure names the simulator prints (bench.Figure's Name).
const (
	FigHitRate   = "hit_rate_pct"
	FigOracleGap = "oracle_gap_pts"
	FigGhosts    = "ghost_routes_pct"
	FigTTFTP50   = "ttft_p50_ms"
	FigTTFTP99   = "ttft_p99_ms"
	FigSpread    = "load_spread_max_over_mean"
	FigLagP50    = "event_lag_p50_ms"
	FigLagP99    = "event_lag_p99_ms"
	FigLagMax    = "event_lag_max_ms"
	FigLate      = "schedule_late_p99_ms"
	FigFallbacks = "kvindex_fallbacks"
)

// FigCeiling is the trace's reuse ceiling (Ceiling), one figure per
// arrival order and their aggregate.
const FigCeiling = "hit_rate_ceiling_pct"

// FigTierSplits is the requests where a tier-blind choice can cost hit
// value, in percent (RunResult.TierSplitRate); FigTierHeadroom what a
// tier-aware choice could add, in hit-rate points
// (RunResult.TierHeadroomPoints).
const (
	FigTierSplits   = "tier_split_pct"
	FigTierHeadroom = "tier_headroom_pts"
)

// FigLagMisses counts a cell's event-lag probes not seen within 10 s.
const FigLagMisses = "event_lag_misses"

// Labels of the aggregate figures: order is OrderAll, stat one of
// StatMean, StatMin, StatMax.
const (
	OrderAll = "all"
	StatMean = "mean"
	StatMin  = "min"
	StatMax  = "max"
)

// labels returns a run's labels: strategy, routers, restarts,
// cache_fraction, order, speedup.
func (c Config) labels(s RunSpec) map[string]string {
	return map[string]string{
		"strategy":       s.Strategy,
		"routers":        strconv.Itoa(s.Routers),
		"restarts":       strconv.FormatBool(s.Restarts),
		"cache_fraction": fmtFloat(s.Fraction),
		"order":          strconv.Itoa(s.Order),
		"speedup":        fmtFloat(c.Speedup),
	}
}

func fmtFloat(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }

// quantile returns the q quantile of ds (sorting a copy); 0 when empty.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// spread is the busiest pod's requests over the mean.
func spread(perPod []int) float64 {
	total, most := 0, 0
	for _, n := range perPod {
		total += n
		most = max(most, n)
	}
	if total == 0 {
		return 0
	}
	return float64(most) * float64(len(perPod)) / float64(total)
}

// oracleOf returns the oracle run at fraction f in arrival order k, if
// there is one.
func (r *Result) oracleOf(f float64, k int) (RunResult, bool) {
	for _, x := range r.Runs {
		if x.Spec.Strategy == StrategyOracle && x.Spec.Fraction == f && x.Spec.Order == k {
			return x, true
		}
	}
	return RunResult{}, false
}

// Valid reports whether every run is valid (RunResult.Valid at the
// configured speedup); false without runs.
func (r *Result) Valid() bool {
	for _, x := range r.Runs {
		if !x.Valid(r.Config.Speedup) {
			return false
		}
	}
	return len(r.Runs) > 0
}

// Invalid returns the invalid runs.
func (r *Result) Invalid() []RunResult {
	var out []RunResult
	for _, x := range r.Runs {
		if !x.Valid(r.Config.Speedup) {
			out = append(out, x)
		}
	}
	return out
}

// runFigures returns one run's figures: hit rate (the oracle's of the
// same cache size and order as reference), gap to the oracle, ghost
// routes, TTFT p50 and p99, load spread, and the event lag while it ran
// (p50, p99, max, misses). labels are shared, not copied.
func (r *Result) runFigures(x RunResult, l map[string]string) []bench.Figure {
	var out []bench.Figure
	hit := bench.Figure{Name: FigHitRate, Labels: l, Value: x.HitRate(), Unit: "%"}
	o, hasOracle := r.oracleOf(x.Spec.Fraction, x.Spec.Order)
	hasOracle = hasOracle && x.Spec.Strategy != StrategyOracle
	if hasOracle {
		hit.Reference, hit.HasReference, hit.RefName = o.HitRate(), true, StrategyOracle
	}
	out = append(out, hit)
	if hasOracle {
		gap := bench.Figure{Name: FigOracleGap, Labels: l, Value: o.HitRate() - x.HitRate(), Unit: "points"}
		if x.Spec.Strategy == StrategyKVIndex && x.Spec.Routers > 1 && x.Spec.Restarts {
			gap.Goal = &bench.Goal{Target: 1, AtMost: true}
		}
		out = append(out, gap)
	}
	return append(out,
		bench.Figure{Name: FigGhosts, Labels: l, Value: x.GhostRate(), Unit: "%"},
		bench.Figure{Name: FigTTFTP50, Labels: l, Value: ms(quantile(x.TTFT, 0.5)), Unit: "ms"},
		bench.Figure{Name: FigTTFTP99, Labels: l, Value: ms(quantile(x.TTFT, 0.99)), Unit: "ms"},
		bench.Figure{Name: FigSpread, Labels: l, Value: spread(x.PerPod), Unit: "ratio"},
		bench.Figure{Name: FigLagP50, Labels: l, Value: ms(quantile(x.Lag, 0.5)), Unit: "ms"},
		bench.Figure{Name: FigLagP99, Labels: l, Value: ms(quantile(x.Lag, 0.99)), Unit: "ms"},
		bench.Figure{Name: FigLagMax, Labels: l, Value: ms(quantile(x.Lag, 1)), Unit: "ms"},
		bench.Figure{Name: FigLagMisses, Labels: l, Value: float64(x.LagMisses), Unit: "probes"},
		bench.Figure{Name: FigTierSplits, Labels: l, Value: x.TierSplitRate(), Unit: "%"},
		bench.Figure{Name: FigTierHeadroom, Labels: l, Value: x.TierHeadroomPoints(), Unit: "points"},
	)
}

// stats are the mean, min and max of a figure over arrival orders.
type stats struct{ mean, min, max float64 }

func statsOf(vs []float64) stats {
	if len(vs) == 0 {
		return stats{}
	}
	s := stats{min: vs[0], max: vs[0]}
	for _, v := range vs {
		s.mean += v
		s.min, s.max = min(s.min, v), max(s.max, v)
	}
	s.mean /= float64(len(vs))
	return s
}

// aggregate returns the mean, min and max figures of per-order figures
// fs of one name and cell: labels l with order OrderAll and stat, the
// reference aggregated alike, the goal on the mean only.
func aggregate(fs []bench.Figure, l map[string]string) []bench.Figure {
	var vals, refs []float64
	for _, f := range fs {
		vals = append(vals, f.Value)
		refs = append(refs, f.Reference)
	}
	v, ref := statsOf(vals), statsOf(refs)
	var out []bench.Figure
	for _, st := range []struct {
		name     string
		val, ref float64
	}{{StatMean, v.mean, ref.mean}, {StatMin, v.min, ref.min}, {StatMax, v.max, ref.max}} {
		al := maps.Clone(l)
		al["order"], al["stat"] = OrderAll, st.name
		f := fs[0]
		f.Labels, f.Value, f.Reference = al, st.val, st.ref
		if st.name != StatMean {
			f.Goal = nil
		}
		out = append(out, f)
	}
	return out
}

// cells groups the runs by cell (RunSpec.cell), cells in grid order,
// each cell's runs by order.
func (r *Result) cells() [][]RunResult {
	var out [][]RunResult
	at := map[RunSpec]int{}
	for _, x := range r.Runs {
		c := x.Spec.cell()
		i, ok := at[c]
		if !ok {
			i = len(out)
			at[c] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], x)
	}
	for _, rs := range out {
		slices.SortStableFunc(rs, func(a, b RunResult) int { return a.Spec.Order - b.Spec.Order })
	}
	return out
}

// Figures returns the simulation's figures in bench's shape. Per run (a
// cell in one arrival order, label order) runFigures: hit rate, gap to
// the oracle (held to at most 1 for kvindex with several restarting
// routers: the goal), ghost routes, TTFT, load spread and the
// event lag while it ran. Per cell, the mean, min and max of each over
// its orders (order "all", label stat; effective_speedup its slowest
// run's). The trace's reuse ceiling per
// order and aggregated. Then the run-wide event lag, the schedule's
// lateness and the kvindex producers' fallbacks. Every figure carries a
// valid label: a run's figures that run's RunResult.Valid, a cell's
// aggregate whether each of its runs is, the ceiling true (it is
// computed, not run), the run-wide ones whether every run was valid (an
// invalid figure measures the machine falling behind, not the router).
func (r *Result) Figures() []bench.Figure {
	var out []bench.Figure
	sp := fmtFloat(r.Config.Speedup)
	for _, runs := range r.cells() {
		byName := map[string][]bench.Figure{}
		var names []string
		cellValid, minSpeedup := true, math.Inf(1)
		for _, x := range runs {
			minSpeedup = min(minSpeedup, x.EffectiveSpeedup())
			l := r.Config.labels(x.Spec)
			valid := x.Valid(r.Config.Speedup)
			cellValid = cellValid && valid
			l["valid"] = strconv.FormatBool(valid)
			// The speedup label is the schedule asked for; this one is
			// what the run kept (lower when the simulator fell behind).
			l["effective_speedup"] = strconv.FormatFloat(x.EffectiveSpeedup(), 'f', 1, 64)
			for _, f := range r.runFigures(x, l) {
				if _, ok := byName[f.Name]; !ok {
					names = append(names, f.Name)
				}
				byName[f.Name] = append(byName[f.Name], f)
				out = append(out, f)
			}
		}
		al := r.Config.labels(runs[0].Spec)
		al["valid"] = strconv.FormatBool(cellValid)
		// The aggregate's effective speedup is its slowest run's.
		al["effective_speedup"] = strconv.FormatFloat(minSpeedup, 'f', 1, 64)
		for _, n := range names {
			out = append(out, aggregate(byName[n], al)...)
		}
	}
	var ceil []bench.Figure
	for k, v := range r.Ceilings {
		ceil = append(ceil, bench.Figure{Name: FigCeiling, Value: v, Unit: "%", Labels: map[string]string{
			"strategy": StrategyCeiling, "order": strconv.Itoa(k), "speedup": sp, "valid": "true"}})
	}
	if len(ceil) > 0 {
		out = append(out, ceil...)
		out = append(out, aggregate(ceil, map[string]string{"strategy": StrategyCeiling, "speedup": sp, "valid": "true"})...)
	}
	// The run-wide figures are valid when every run is.
	wide := map[string]string{"speedup": sp, "valid": strconv.FormatBool(r.Valid())}
	var late []time.Duration
	for _, x := range r.Runs {
		late = append(late, x.Late...)
	}
	out = append(out,
		bench.Figure{Name: FigLagP50, Labels: wide, Value: ms(quantile(r.Lag, 0.5)), Unit: "ms"},
		bench.Figure{Name: FigLagP99, Labels: wide, Value: ms(quantile(r.Lag, 0.99)), Unit: "ms"},
		bench.Figure{Name: FigLagMax, Labels: wide, Value: ms(quantile(r.Lag, 1)), Unit: "ms"},
		bench.Figure{Name: FigLate, Labels: wide, Value: ms(quantile(late, 0.99)), Unit: "ms"},
		bench.Figure{Name: FigFallbacks, Labels: wide, Value: r.Fallbacks, Unit: "requests",
			Reference: r.Lookups, HasReference: true, RefName: "lookups"},
	)
	return out
}

// StrategyCeiling labels the reuse ceiling's figures and names its row
// (it is computed, not a strategy that runs).
const StrategyCeiling = "ceiling"

// variant names a stateful strategy's row: "kvindex, 4 routers,
// restarts".
func variant(s RunSpec) string {
	if stateless(s.Strategy) {
		return s.Strategy
	}
	v := fmt.Sprintf("%s, %d router", s.Strategy, s.Routers)
	if s.Routers > 1 {
		v += "s"
	}
	if s.Restarts {
		v += ", restarts"
	}
	return v
}

// spreadCell formats vs as "mean [min, max]" with prec decimals, or as
// the one value when they are all equal (one order); "-" when empty.
func spreadCell(vs []float64, prec int) string {
	if len(vs) == 0 {
		return "-"
	}
	s := statsOf(vs)
	f := func(x float64) string { return strconv.FormatFloat(x, 'f', prec, 64) }
	if f(s.min) == f(s.max) {
		return f(s.mean)
	}
	return f(s.mean) + " [" + f(s.min) + ", " + f(s.max) + "]"
}

// ceilingRow names the ceiling's row in the report.
const ceilingRow = "ceiling (1 pod, infinite cache)"

// WriteMarkdown writes the report: the hit-rate table (rows: strategy
// variants and the reuse ceiling; columns: cache fractions; each cell
// its mean [min, max] over the arrival orders), the table of every cell
// (the same aggregate of each figure), where the tiers can matter (each
// cell's tier splits and tier headroom), the table of every run (one cell
// in one order) and what was run.
func (r *Result) WriteMarkdown(w io.Writer, plotName string) error {
	c := r.Config
	var b strings.Builder
	if c.Quick {
		fmt.Fprintf(&b, "# kvindex-sim report (quick run)\n\n")
	} else {
		fmt.Fprintf(&b, "# kvindex-sim report\n\n")
	}
	if r.Valid() {
		fmt.Fprintf(&b, "Valid: every run went out on schedule (p99 lateness at most %v%% of its trace span, effective speedup within %v%% of %v).\n\n",
			100*MaxLateFraction, 100*MaxSpeedupShortfall, c.Speedup)
	} else {
		fmt.Fprintf(&b, "**Not valid: %d of %d runs fell behind their schedule** (p99 lateness above %v%% of the trace span, or effective speedup more than %v%% off %v; see the last columns of every run). Their figures measure the machine, not the routers.\n\n",
			len(r.Invalid()), len(r.Runs), 100*MaxLateFraction, 100*MaxSpeedupShortfall, c.Speedup)
	}
	if plotName != "" {
		fmt.Fprintf(&b, "![hit rate against cache size](%s)\n\n", plotName)
	}
	orders := "the trace's own arrival order"
	if c.Orders > 1 {
		orders = fmt.Sprintf("mean [min, max] over %d arrival orders", c.Orders)
	}
	fmt.Fprintf(&b, "Token-weighted hit rate (%%; CPU-tier hits count %v; %s) by cache size (a pod's GPU cache as a fraction of the trace's unique blocks / %d pods):\n\n", CPUHitWeight, orders, c.Pods)
	cells := r.cells()
	var rows []string
	hits := map[string]map[float64][]float64{}
	for _, runs := range cells {
		v := variant(runs[0].Spec)
		if hits[v] == nil {
			hits[v] = map[float64][]float64{}
			rows = append(rows, v)
		}
		for _, x := range runs {
			hits[v][x.Spec.Fraction] = append(hits[v][x.Spec.Fraction], x.HitRate())
		}
	}
	slices.SortStableFunc(rows, func(a, b string) int { return strategyRank(a) - strategyRank(b) })
	b.WriteString("| strategy |")
	for _, f := range c.Fractions {
		fmt.Fprintf(&b, " %v |", f)
	}
	b.WriteString("\n|---|")
	for range c.Fractions {
		b.WriteString("---:|")
	}
	b.WriteString("\n")
	for _, v := range rows {
		fmt.Fprintf(&b, "| %s |", v)
		for _, f := range c.Fractions {
			fmt.Fprintf(&b, " %s |", spreadCell(hits[v][f], 1))
		}
		b.WriteString("\n")
	}
	if len(r.Ceilings) > 0 {
		fmt.Fprintf(&b, "| %s |", ceilingRow)
		for range c.Fractions {
			fmt.Fprintf(&b, " %s |", spreadCell(r.Ceilings, 1))
		}
		b.WriteString("\n")
	}

	fmt.Fprintf(&b, "\nEvery cell (%s; event lag: the probe's samples sent while the cell's runs went):\n\n", orders)
	b.WriteString("| strategy | fraction | GPU blocks/pod | hit % | gap to oracle (points) | ghost routes % | TTFT p50 ms | TTFT p99 ms | event lag p50 ms | p99 ms | max ms | load max/mean | valid runs |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, runs := range cells {
		var hit, gap, ghost, t50, t99, l50, l99, lmax, load []float64
		nValid := 0
		for _, x := range runs {
			hit = append(hit, x.HitRate())
			if o, ok := r.oracleOf(x.Spec.Fraction, x.Spec.Order); ok && x.Spec.Strategy != StrategyOracle {
				gap = append(gap, o.HitRate()-x.HitRate())
			}
			ghost = append(ghost, x.GhostRate())
			t50 = append(t50, ms(quantile(x.TTFT, 0.5)))
			t99 = append(t99, ms(quantile(x.TTFT, 0.99)))
			l50 = append(l50, ms(quantile(x.Lag, 0.5)))
			l99 = append(l99, ms(quantile(x.Lag, 0.99)))
			lmax = append(lmax, ms(quantile(x.Lag, 1)))
			load = append(load, spread(x.PerPod))
			if x.Valid(c.Speedup) {
				nValid++
			}
		}
		s := runs[0].Spec
		fmt.Fprintf(&b, "| %s | %v | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d of %d |\n", variant(s), s.Fraction, s.GPUBlocks,
			spreadCell(hit, 2), spreadCell(gap, 2), spreadCell(ghost, 1), spreadCell(t50, 0), spreadCell(t99, 0),
			spreadCell(l50, 0), spreadCell(l99, 0), spreadCell(lmax, 0), spreadCell(load, 2), nValid, len(runs))
	}

	fmt.Fprintf(&b, "\nWhere the tiers can matter (%s), judged in the pods' true states as each request was routed: the requests where the pods holding the longest prefix on any tier are not all the best by hit value (a tier split), and the hit-rate points a perfect tier-aware choice would add to a perfect tier-blind one (the tier headroom; a blind choice's tie among the longest holders taken as random):\n\n", orders)
	b.WriteString("| strategy | fraction | requests with a tier split % | tier headroom (points) |\n|---|---:|---:|---:|\n")
	for _, runs := range cells {
		var splits, room []float64
		for _, x := range runs {
			splits = append(splits, x.TierSplitRate())
			room = append(room, x.TierHeadroomPoints())
		}
		s := runs[0].Spec
		fmt.Fprintf(&b, "| %s | %v | %s | %s |\n", variant(s), s.Fraction, spreadCell(splits, 2), spreadCell(room, 3))
	}

	b.WriteString("\nEvery run:\n\n| strategy | fraction | order | hit % | ghost routes % | TTFT p50 ms | TTFT p99 ms | event lag p50 ms | p99 ms | max ms | lag probes missed | router restarts | refused | effective speedup | late p99 ms | valid |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, runs := range cells {
		for _, x := range runs {
			valid := "yes"
			if !x.Valid(c.Speedup) {
				valid = "**no**"
			}
			fmt.Fprintf(&b, "| %s | %v | %d | %.2f | %.1f | %.0f | %.0f | %.0f | %.0f | %.0f | %d | %d | %d | %.1f | %.0f | %s |\n", variant(x.Spec), x.Spec.Fraction, x.Spec.Order,
				x.HitRate(), x.GhostRate(), ms(quantile(x.TTFT, 0.5)), ms(quantile(x.TTFT, 0.99)),
				ms(quantile(x.Lag, 0.5)), ms(quantile(x.Lag, 0.99)), ms(quantile(x.Lag, 1)), x.LagMisses,
				x.RouterRestarts, x.RouteErrors, x.EffectiveSpeedup(), ms(x.LateP99()), valid)
		}
	}
	var late []time.Duration
	for _, x := range r.Runs {
		late = append(late, x.Late...)
	}
	fmt.Fprintf(&b, "\nRun: %d requests of %s (%d malformed lines skipped, %d input lengths clamped), %d unique blocks, %d pods, CPU tier %v x GPU, speedup %v, load cap %v x share over %d requests, restarts every %d requests, %d runs at a time.\n",
		r.Requests, filepath.Base(c.TracePath), r.Skipped, r.Clamped, r.UniqueBlocks, c.Pods, c.CPURatio, c.Speedup, c.LoadSlack, c.LoadWindow, c.RestartEvery, c.Parallel)
	if c.Orders > 1 {
		jittered := "order 1 moves"
		if c.Orders > 2 {
			jittered = fmt.Sprintf("orders 1-%d move", c.Orders-1)
		}
		fmt.Fprintf(&b, "Arrival orders: %d per cell; order 0 is the trace's own, %s each request by a seeded uniform jitter of at most %v either way, then no earlier than the previous request with the same first two hash ids (a conversation's turns keep their order).\n",
			c.Orders, jittered, c.Jitter)
	}
	fmt.Fprintf(&b, "Reuse ceiling: the hit rate of one pod with an infinite cache over the same requests (from the block hashes; every hit is a GPU hit), %s.\n", spreadCell(r.Ceilings, 2))
	fmt.Fprintf(&b, "Event lag over the whole run (produce -> visible in a Lookup, %d probes, %d not seen in 10 s): p50 %.1f ms, p99 %.1f ms, max %.1f ms. Requests issued late: %d, p99 lateness %.1f ms.\n",
		len(r.Lag), r.LagMisses, ms(quantile(r.Lag, 0.5)), ms(quantile(r.Lag, 0.99)), ms(quantile(r.Lag, 1)), len(late), ms(quantile(late, 0.99)))
	fmt.Fprintf(&b, "kvindex producers: %.0f Lookups, %.0f fallbacks, %.0f speculative blocks credited, %d tokenize calls. Event records refused by the broker: %d%s. Stack ready in %v; wall time %v.\n",
		r.Lookups, r.Fallbacks, r.SpeculativeBlocks, r.TokenizeCalls, r.PublishErrors, lastErr(r.PublishLastErr), r.StackStart.Round(100*time.Millisecond), r.Wall.Round(time.Second))
	fmt.Fprintf(&b, "TTFT cost model: one prefill at a time per pod in trace time, %v overhead + uncached tokens at %v tokens/s, CPU-tier hits at %v of that cost.\n",
		c.PrefillOverhead, c.PrefillTokensPerSec, 1-CPUHitWeight)
	_, err := io.WriteString(w, b.String())
	return err
}

func lastErr(s string) string {
	if s == "" {
		return ""
	}
	return " (last: " + s + ")"
}

// strategyRank orders rows as Strategies does.
func strategyRank(v string) int {
	name, _, _ := strings.Cut(v, ",")
	return slices.Index(Strategies, name)
}

// errPoints are a variant's points with their min-max spread over the
// arrival orders, for plotter.YErrorBars.
type errPoints struct {
	plotter.XYs
	plotter.YErrors
}

// WritePlot draws hit rate against cache fraction, one line per strategy
// variant through each cell's mean over the arrival orders (with a bar
// from its min to its max when there are several), and the reuse
// ceiling as a horizontal line, to path (.svg or .png).
func (r *Result) WritePlot(path string) error {
	p := plot.New()
	p.Title.Text = "kvindex-sim: token-weighted hit rate"
	p.X.Label.Text = "GPU cache per pod (fraction of unique blocks / pods)"
	p.Y.Label.Text = "hit rate (%)"
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	series := map[string]*errPoints{}
	var names []string
	for _, runs := range r.cells() {
		v := variant(runs[0].Spec)
		if _, ok := series[v]; !ok {
			names = append(names, v)
			series[v] = &errPoints{}
		}
		var hits []float64
		for _, x := range runs {
			hits = append(hits, x.HitRate())
		}
		st := statsOf(hits)
		e := series[v]
		e.XYs = append(e.XYs, plotter.XY{X: runs[0].Spec.Fraction, Y: st.mean})
		e.YErrors = append(e.YErrors, struct{ Low, High float64 }{st.mean - st.min, st.max - st.mean})
	}
	slices.SortStableFunc(names, func(a, b string) int { return strategyRank(a) - strategyRank(b) })
	palette := []color.Color{
		color.RGBA{R: 0x99, G: 0x99, B: 0x99, A: 255}, color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 255},
		color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 255}, color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 255},
		color.RGBA{A: 255},
	}
	for _, v := range names {
		e := series[v]
		idx := make([]int, len(e.XYs))
		for i := range idx {
			idx[i] = i
		}
		slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(e.XYs[a].X, e.XYs[b].X) })
		sorted := &errPoints{}
		for _, i := range idx {
			sorted.XYs = append(sorted.XYs, e.XYs[i])
			sorted.YErrors = append(sorted.YErrors, e.YErrors[i])
		}
		line, points, err := plotter.NewLinePoints(sorted.XYs)
		if err != nil {
			return err
		}
		col := palette[max(0, strategyRank(v))%len(palette)]
		line.Color, points.Color = col, col
		points.Shape = draw.CircleGlyph{}
		if strings.Contains(v, "1 router") {
			line.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		if strings.Contains(v, "restarts") {
			points.Shape = draw.TriangleGlyph{}
		}
		p.Add(line, points)
		if r.Config.Orders > 1 {
			bars, err := plotter.NewYErrorBars(sorted)
			if err != nil {
				return err
			}
			bars.Color = col
			p.Add(bars)
		}
		p.Legend.Add(v, line, points)
	}
	if len(r.Ceilings) > 0 {
		ceil := statsOf(r.Ceilings).mean
		fn := plotter.NewFunction(func(float64) float64 { return ceil })
		fn.Color = color.RGBA{A: 255}
		fn.Width = vg.Points(1.5)
		fn.Dashes = []vg.Length{vg.Points(8), vg.Points(4)}
		lo, hi := slices.Min(r.Config.Fractions), slices.Max(r.Config.Fractions)
		fn.XMin, fn.XMax = lo, hi
		if lo == hi {
			fn.XMin, fn.XMax = lo*0.9, hi*1.1
		}
		p.Add(fn)
		p.Legend.Add(fmt.Sprintf("%s: %.1f%%", ceilingRow, ceil), fn)
		p.Y.Max = max(p.Y.Max, ceil*1.05)
	}
	if len(r.Config.Fractions) > 1 {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	wt, err := p.WriterTo(7*vg.Inch, 5*vg.Inch, strings.TrimPrefix(filepath.Ext(path), "."))
	if err != nil {
		_ = f.Close()
		return err
	}
	if _, err := wt.WriteTo(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
