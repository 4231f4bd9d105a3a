package bridge_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/bridge"
)

// failRecorder is a testing.TB whose Fatalf records the failure instead of
// ending the test, so a test can check that a helper fails.
type failRecorder struct {
	testing.TB
	failed bool
}

func (r *failRecorder) Fatalf(string, ...any) { r.failed = true }

// TestMetricFailsOnAMissingSeries checks the metric helper the other tests
// read counters through: every series the bridge uses exists at 0 from
// New on, and a name or label value that does not exist fails instead of
// reading as 0.
func TestMetricFailsOnAMissingSeries(t *testing.T) {
	cfg := bridge.DefaultConfig()
	cfg.Endpoint, cfg.Pod, cfg.Model = "tcp://127.0.0.1:5557", "pod", "m"
	cfg.Brokers, cfg.Topic = []string{"127.0.0.1:9092"}, "t"
	cfg.Registry = prometheus.NewRegistry()
	if _, err := bridge.New(cfg); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		metric   string
		labels   []string
		wantFail bool
	}{
		{name: "counter", metric: "kvindex_bridge_gaps_total"},
		{name: "labelled_series_at_zero", metric: "kvindex_bridge_resyncs_total", labels: []string{"reason", "unhealed_gap"}},
		{name: "batch_kind_at_zero", metric: "kvindex_bridge_records_produced_total", labels: []string{"kind", "batch"}},
		{name: "no_such_metric", metric: "kvindex_bridge_no_such_total", wantFail: true},
		{name: "no_such_label_value", metric: "kvindex_bridge_resyncs_total", labels: []string{"reason", "no_such_reason"}, wantFail: true},
		{name: "no_such_label", metric: "kvindex_bridge_gaps_total", labels: []string{"reason", "x"}, wantFail: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &failRecorder{TB: t}
			got := metric(r, cfg, tc.metric, tc.labels...)
			if r.failed != tc.wantFail {
				t.Fatalf("metric(%s, %v) failed = %v, want %v", tc.metric, tc.labels, r.failed, tc.wantFail)
			}
			if !tc.wantFail && got != 0 {
				t.Fatalf("metric(%s, %v) = %v on a new bridge, want 0", tc.metric, tc.labels, got)
			}
		})
	}
}
