package sim

import (
	"fmt"
	"image/color"
	"io"
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

// labels returns a run's labels: strategy, routers, restarts,
// cache_fraction, speedup.
func (c Config) labels(s RunSpec) map[string]string {
	return map[string]string{
		"strategy":       s.Strategy,
		"routers":        strconv.Itoa(s.Routers),
		"restarts":       strconv.FormatBool(s.Restarts),
		"cache_fraction": fmtFloat(s.Fraction),
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

// oracleOf returns the oracle run at fraction f, if there is one.
func (r *Result) oracleOf(f float64) (RunResult, bool) {
	for _, x := range r.Runs {
		if x.Spec.Strategy == StrategyOracle && x.Spec.Fraction == f {
			return x, true
		}
	}
	return RunResult{}, false
}

// Figures returns the simulation's figures in bench's shape: per run the
// hit rate (with the oracle's at the same cache size as reference), its
// gap to the oracle in points (held to at most 1 for kvindex with several
// restarting routers: the goal), ghost routes, the TTFT estimate
// and the load spread; then the event lag, the schedule's lateness and
// the kvindex producers' fallbacks. Every figure carries a valid label:
// a run's figures that run's RunResult.Valid, the run-wide ones whether
// every run was valid (an invalid figure measures the machine falling
// behind, not the router).
func (r *Result) Figures() []bench.Figure {
	var out []bench.Figure
	allValid := len(r.Runs) > 0
	for _, x := range r.Runs {
		allValid = allValid && x.Valid(r.Config.Speedup)
	}
	// The run-wide figures are valid when every run is.
	sp := map[string]string{"speedup": fmtFloat(r.Config.Speedup), "valid": strconv.FormatBool(allValid)}
	for _, x := range r.Runs {
		l := r.Config.labels(x.Spec)
		l["valid"] = strconv.FormatBool(x.Valid(r.Config.Speedup))
		// The speedup label is the schedule asked for; this one is what
		// the run kept (lower when the simulator fell behind).
		l["effective_speedup"] = strconv.FormatFloat(x.EffectiveSpeedup(), 'f', 1, 64)
		hit := bench.Figure{Name: FigHitRate, Labels: l, Value: x.HitRate(), Unit: "%"}
		o, hasOracle := r.oracleOf(x.Spec.Fraction)
		if hasOracle && x.Spec.Strategy != StrategyOracle {
			hit.Reference, hit.HasReference, hit.RefName = o.HitRate(), true, StrategyOracle
		}
		out = append(out, hit)
		if hasOracle && x.Spec.Strategy != StrategyOracle {
			gap := bench.Figure{Name: FigOracleGap, Labels: l, Value: o.HitRate() - x.HitRate(), Unit: "points"}
			if x.Spec.Strategy == StrategyKVIndex && x.Spec.Routers > 1 && x.Spec.Restarts {
				gap.Goal = &bench.Goal{Target: 1, AtMost: true}
			}
			out = append(out, gap)
		}
		ghosts := 0.0
		if x.Requests > 0 {
			ghosts = 100 * float64(x.Ghosts) / float64(x.Requests)
		}
		out = append(out,
			bench.Figure{Name: FigGhosts, Labels: l, Value: ghosts, Unit: "%"},
			bench.Figure{Name: FigTTFTP50, Labels: l, Value: ms(quantile(x.TTFT, 0.5)), Unit: "ms"},
			bench.Figure{Name: FigTTFTP99, Labels: l, Value: ms(quantile(x.TTFT, 0.99)), Unit: "ms"},
			bench.Figure{Name: FigSpread, Labels: l, Value: spread(x.PerPod), Unit: "ratio"},
		)
	}
	var late []time.Duration
	for _, x := range r.Runs {
		late = append(late, x.Late...)
	}
	out = append(out,
		bench.Figure{Name: FigLagP50, Labels: sp, Value: ms(quantile(r.Lag, 0.5)), Unit: "ms"},
		bench.Figure{Name: FigLagP99, Labels: sp, Value: ms(quantile(r.Lag, 0.99)), Unit: "ms"},
		bench.Figure{Name: FigLagMax, Labels: sp, Value: ms(quantile(r.Lag, 1)), Unit: "ms"},
		bench.Figure{Name: FigLate, Labels: sp, Value: ms(quantile(late, 0.99)), Unit: "ms"},
		bench.Figure{Name: FigFallbacks, Labels: sp, Value: r.Fallbacks, Unit: "requests",
			Reference: r.Lookups, HasReference: true, RefName: "lookups"},
	)
	return out
}

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

// WriteMarkdown writes the report: the hit-rate table (rows: strategy
// variants; columns: cache fractions), the detail table of every run and
// what was run.
func (r *Result) WriteMarkdown(w io.Writer, plotName string) error {
	c := r.Config
	var b strings.Builder
	if c.Quick {
		fmt.Fprintf(&b, "# kvindex-sim report (quick run)\n\n")
	} else {
		fmt.Fprintf(&b, "# kvindex-sim report\n\n")
	}
	if plotName != "" {
		fmt.Fprintf(&b, "![hit rate against cache size](%s)\n\n", plotName)
	}
	fmt.Fprintf(&b, "Token-weighted hit rate (%%; CPU-tier hits count %v) by cache size (a pod's GPU cache as a fraction of the trace's unique blocks / %d pods):\n\n", CPUHitWeight, c.Pods)
	var rows []string
	cells := map[string]map[float64]float64{}
	for _, x := range r.Runs {
		v := variant(x.Spec)
		if cells[v] == nil {
			cells[v] = map[float64]float64{}
			rows = append(rows, v)
		}
		cells[v][x.Spec.Fraction] = x.HitRate()
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
			if h, ok := cells[v][f]; ok {
				fmt.Fprintf(&b, " %.1f |", h)
			} else {
				b.WriteString(" - |")
			}
		}
		b.WriteString("\n")
	}
	b.WriteString("\nEvery run:\n\n| strategy | fraction | GPU blocks/pod | hit % | gap to oracle (points) | ghost routes % | TTFT p50 ms | TTFT p99 ms | load max/mean | router restarts | refused | effective speedup |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, x := range r.Runs {
		gap := "-"
		if o, ok := r.oracleOf(x.Spec.Fraction); ok && x.Spec.Strategy != StrategyOracle {
			gap = fmt.Sprintf("%.2f", o.HitRate()-x.HitRate())
		}
		ghosts := 0.0
		if x.Requests > 0 {
			ghosts = 100 * float64(x.Ghosts) / float64(x.Requests)
		}
		fmt.Fprintf(&b, "| %s | %v | %d | %.2f | %s | %.1f | %.0f | %.0f | %.2f | %d | %d | %.1f |\n", variant(x.Spec), x.Spec.Fraction, x.Spec.GPUBlocks,
			x.HitRate(), gap, ghosts, ms(quantile(x.TTFT, 0.5)), ms(quantile(x.TTFT, 0.99)), spread(x.PerPod), x.RouterRestarts, x.RouteErrors, x.EffectiveSpeedup())
	}
	var late []time.Duration
	for _, x := range r.Runs {
		late = append(late, x.Late...)
	}
	fmt.Fprintf(&b, "\nRun: %d requests of %s (%d malformed lines skipped, %d input lengths clamped), %d unique blocks, %d pods, CPU tier %v x GPU, speedup %v, load cap %v x share over %d requests, restarts every %d requests, %d runs at a time.\n",
		r.Requests, filepath.Base(c.TracePath), r.Skipped, r.Clamped, r.UniqueBlocks, c.Pods, c.CPURatio, c.Speedup, c.LoadSlack, c.LoadWindow, c.RestartEvery, c.Parallel)
	fmt.Fprintf(&b, "Event lag (produce -> visible in a Lookup, %d probes, %d not seen in 10 s): p50 %.1f ms, p99 %.1f ms, max %.1f ms. Requests issued late: %d, p99 lateness %.1f ms.\n",
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

// WritePlot draws hit rate against cache fraction, one line per strategy
// variant, to path (.svg or .png).
func (r *Result) WritePlot(path string) error {
	p := plot.New()
	p.Title.Text = "kvindex-sim: token-weighted hit rate"
	p.X.Label.Text = "GPU cache per pod (fraction of unique blocks / pods)"
	p.Y.Label.Text = "hit rate (%)"
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	series := map[string]plotter.XYs{}
	var names []string
	for _, x := range r.Runs {
		v := variant(x.Spec)
		if _, ok := series[v]; !ok {
			names = append(names, v)
		}
		series[v] = append(series[v], plotter.XY{X: x.Spec.Fraction, Y: x.HitRate()})
	}
	slices.SortStableFunc(names, func(a, b string) int { return strategyRank(a) - strategyRank(b) })
	palette := []color.Color{
		color.RGBA{R: 0x99, G: 0x99, B: 0x99, A: 255}, color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 255},
		color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 255}, color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 255},
		color.RGBA{A: 255},
	}
	for i, v := range names {
		pts := series[v]
		slices.SortFunc(pts, func(a, b plotter.XY) int {
			return int(math.Copysign(1, a.X-b.X))
		})
		line, points, err := plotter.NewLinePoints(pts)
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
		_ = i
		p.Add(line, points)
		p.Legend.Add(v, line, points)
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
