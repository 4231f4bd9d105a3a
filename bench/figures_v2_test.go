package bench

import (
	"math"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
)

// figureCheck is what a test expects of one figure.
type figureCheck struct {
	value, ratio float64
	hasGoal      bool
	met          bool
}

func checkFigures(t *testing.T, fs []Figure, want map[string]figureCheck) {
	t.Helper()
	got := map[string]figureCheck{}
	for _, f := range fs {
		c := figureCheck{value: f.Value}
		c.ratio, _ = f.Ratio()
		c.met, c.hasGoal = f.Met()
		got[f.Name] = c
	}
	for name, w := range want {
		g, ok := got[name]
		if !ok {
			t.Errorf("no figure %s", name)
			continue
		}
		if !near(g.value, w.value) || !near(g.ratio, w.ratio) || g.hasGoal != w.hasGoal || g.met != w.met {
			t.Errorf("%s = %+v, want %+v", name, g, w)
		}
	}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

func fleetResult() *FleetResult {
	return &FleetResult{
		Partitions: 4, Records: 10, Events: 20, BlockOps: 1000,
		CeilingTime: 2 * time.Second, Captured: captureCounts{Layout: "v2"}, CeilingDB: dbSize{InUse: 30_000},
		V1Time: 10 * time.Second, V1: v1Counts{Ops: 1100}, V1DB: dbSize{InUse: 145_000},
		TargetRate: 50_000, Fraction: 0.8,
		Paced: FleetRun{Elapsed: 4 * time.Second, Ops: 50, DB: dbSize{InUse: 20_000}, WatchBytes: 21_000,
			Freshness: Latencies{Sorted: []time.Duration{10 * time.Millisecond, 40 * time.Millisecond}}},
		E2E: FleetRun{Elapsed: time.Second},
	}
}

func TestFleetFigures(t *testing.T) {
	r := fleetResult()
	checkFigures(t, r.Figures(), map[string]figureCheck{
		"fleet_block_ops_per_second": {value: 250, ratio: 0.5},
		"fleet_freshness_p99":        {value: 40, hasGoal: true, met: true},
		// 50 ops for 1,000 block ops, v1 1,100.
		"etcd_ops_per_block_op": {value: 0.05, ratio: 0.05 / 1.1, hasGoal: true, met: true},
		// 20 B against v1's 145 B.
		"etcd_db_bytes_per_block_op_vs_v1":       {value: 20, ratio: 20.0 / 145, hasGoal: true, met: true},
		"etcd_db_bytes_per_block_op_raw_vs_v1":   {value: 30, ratio: 30.0 / 145},
		"watch_bytes_per_block_op":               {value: 21},
		"fleet_raw_ceiling_block_ops_per_second": {value: 500, ratio: 5},
		// 1,000 block ops/s end to end against v1's raw 100.
		"fleet_ceiling_vs_v1_raw": {value: 1000, ratio: 10, hasGoal: true, met: true},
	})
	for _, f := range r.Figures() {
		if f.Labels["fsync"] != "on" || f.Labels["rate"] != "50000" || f.Labels["layout"] != "v2" {
			t.Errorf("%s labels %v: want fsync on, rate 50000, layout v2", f.Name, f.Labels)
		}
	}

	// Missed goals: slow, fat, busy.
	r.Paced.Freshness.Sorted = []time.Duration{10 * time.Millisecond, 51 * time.Millisecond}
	r.Paced.Ops, r.Paced.DB.InUse, r.E2E.Elapsed = 101, 40_000, 3*time.Second
	checkFigures(t, r.Figures(), map[string]figureCheck{
		"fleet_freshness_p99":              {value: 51, hasGoal: true},
		"etcd_ops_per_block_op":            {value: 0.101, ratio: 0.101 / 1.1, hasGoal: true},
		"etcd_db_bytes_per_block_op_vs_v1": {value: 40, ratio: 40.0 / 145, hasGoal: true},
		"fleet_ceiling_vs_v1_raw":          {value: 1000.0 / 3, ratio: 10.0 / 3, hasGoal: true},
	})
}

// TestFleetFreshnessGoal checks when the freshness p99 is held to 50 ms:
// at DESIGN's half of the ceiling, or at the fixed rate of 50,000
// block-ops/s or more; not at other paces.
func TestFleetFreshnessGoal(t *testing.T) {
	for _, tc := range []struct {
		name           string
		rate, fraction float64
		want           bool
	}{
		{"half_the_ceiling", 20_000, 0.5, true},
		{"fixed_50k", 50_000, 1.2, true},
		{"fixed_60k", 60_000, 0.9, true},
		{"lighter", 10_000, 0.2, false},
		{"unpaced", 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := fleetResult()
			r.TargetRate, r.Fraction = tc.rate, tc.fraction
			if got := r.freshnessGoal() != nil; got != tc.want {
				t.Fatalf("goal held: %v, want %v", got, tc.want)
			}
		})
	}
}

func TestIngestFigures(t *testing.T) {
	r := &IngestResult{Partitions: 4, Rounds: 2, StreamOps: 1000, IngestTime: 4 * time.Second, SteadyTime: 2 * time.Second,
		RefTime: 3 * time.Second, V1Time: 6 * time.Second, Captured: captureCounts{Layout: "v1"}}
	checkFigures(t, r.Figures(), map[string]figureCheck{
		// 2,000 block ops in 4 s against 3 s: 0.75, under 0.8.
		"ingest_block_ops_per_second":             {value: 500, ratio: 0.75, hasGoal: true},
		"ingest_steady_block_ops_per_second":      {value: 1000, ratio: 1.5},
		"raw_etcd_block_ops_per_second":           {value: 2000.0 / 3},
		"raw_etcd_vs_v1_raw_block_ops_per_second": {value: 2000.0 / 3, ratio: 2},
	})
	r.IngestTime = 3500 * time.Millisecond
	checkFigures(t, r.Figures(), map[string]figureCheck{
		"ingest_block_ops_per_second": {value: 2000.0 / 3.5, ratio: 3 / 3.5, hasGoal: true, met: true},
	})
}

func TestColdStartFigures(t *testing.T) {
	s := func(ds ...float64) []time.Duration {
		var out []time.Duration
		for _, d := range ds {
			out = append(out, time.Duration(d*float64(time.Second)))
		}
		return out
	}
	r := &ColdStartResult{Entries: 100, Endpoints: 2, HashMode: "token",
		Get: s(0.2, 0.1, 0.3), Ready: s(0.12, 0.3, 0.11), HeapPerEntry: []float64{20, 22, 21},
		V1Get: s(1, 2, 3), V1List: s(1.5, 1.5, 1.5), GetBytes: 50, V1GetBytes: 500}
	checkFigures(t, r.Figures(), map[string]figureCheck{
		// Medians: ready 0.12 s against the Get's 0.2 s.
		"coldstart_ready_seconds":            {value: 0.12, ratio: 0.6, hasGoal: true, met: true},
		"coldstart_ready_vs_v1_list_seconds": {value: 0.12, ratio: 0.08},
		"coldstart_v1_list_seconds":          {value: 1.5, ratio: 0.75},
		"coldstart_get_seconds_vs_v1":        {value: 0.2, ratio: 0.1},
		"coldstart_get_bytes_vs_v1":          {value: 50, ratio: 0.1},
		"coldstart_heap_bytes_per_entry":     {value: 21},
	})
	r.Ready = s(0.26, 0.26, 0.26)
	checkFigures(t, r.Figures(), map[string]figureCheck{
		"coldstart_ready_seconds": {value: 0.26, ratio: 1.3, hasGoal: true},
	})
	if diff := gocmp.Diff(map[string]string{"entries": "100", "rounds": "3", "hash_mode": "token"}, r.Figures()[0].Labels); diff != "" {
		t.Errorf("labels (-want +got):\n%s", diff)
	}
}
