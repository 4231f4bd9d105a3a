package sim

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestRunValidity(t *testing.T) {
	late := func(n int, d time.Duration) []time.Duration {
		out := make([]time.Duration, n)
		for i := range out {
			out[i] = d
		}
		return out
	}
	// 1000 requests over 1000 s of trace, issued in 50 s: speedup 20.
	base := RunResult{Requests: 1000, Span: 1000 * time.Second, Issued: 50 * time.Second}
	for _, tc := range []struct {
		name    string
		mod     func(*RunResult)
		wantP99 time.Duration
		want    bool
	}{
		{"on_schedule", func(*RunResult) {}, 0, true},
		{"under_one_percent_late_is_p99_zero", func(r *RunResult) { r.Late = late(9, time.Minute) }, 0, true},
		{"late_p99_at_the_bound", func(r *RunResult) { r.Late = late(11, 10*time.Second) }, 10 * time.Second, true},
		{"late_p99_past_the_bound", func(r *RunResult) { r.Late = late(11, 10*time.Second+time.Millisecond) }, 10*time.Second + time.Millisecond, false},
		{"speedup_kept_within_10pct", func(r *RunResult) { r.Issued = 55 * time.Second }, 0, true},
		{"speedup_fell_behind", func(r *RunResult) { r.Issued = 60 * time.Second }, 0, false},
		{"no_requests", func(r *RunResult) { r.Requests, r.Span = 0, 0 }, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := base
			tc.mod(&r)
			got := struct {
				P99   time.Duration
				Valid bool
			}{r.LateP99(), r.Valid(20)}
			want := struct {
				P99   time.Duration
				Valid bool
			}{tc.wantP99, tc.want}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestEveryFigureCarriesValid(t *testing.T) {
	cfg := QuickConfig()
	r := &Result{Config: cfg, Runs: []RunResult{
		{Spec: RunSpec{Strategy: StrategyKVIndex, Fraction: 0.2, Routers: 4, Restarts: true}, Requests: 10, Span: 100 * time.Second, Issued: time.Duration(float64(100*time.Second) / cfg.Speedup)},
		{Spec: RunSpec{Strategy: StrategyApprox, Fraction: 0.2, Routers: 4, Restarts: true}, Requests: 10, Span: 100 * time.Second, Issued: 100 * time.Second},
	}}
	want := map[string]string{"kvindex": "true", "approx": "false", "": "false"}
	for _, f := range r.Figures() {
		if got := f.Labels["valid"]; got != want[f.Labels["strategy"]] {
			t.Errorf("%s %v: valid = %q, want %q", f.Name, f.Labels, got, want[f.Labels["strategy"]])
		}
	}
}
