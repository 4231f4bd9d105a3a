package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/router/gie/e2e/internal/sim"
)

// raceEnabled is set by race_test.go under -race.
var raceEnabled bool

func TestHelp(t *testing.T) {
	var out, errb bytes.Buffer
	if err := run(t.Context(), []string{"--help"}, &out, &errb); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	for _, want := range []string{"usage: kvindex-sim", "-quick", "-speedup", "-report"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("--help does not mention %q:\n%s", want, errb.String())
		}
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-o", "yaml"}, {"--fractions", "x"}, {"--routers", "0"}, {"--strategies", "magic"}, {"extra"}} {
		var out, errb bytes.Buffer
		if err := run(t.Context(), args, &out, &errb); err == nil {
			t.Errorf("%v: accepted", args)
		}
	}
}

// TestQuickSmoke runs `kvindex-sim --quick -o json` and checks the
// output's shape, not its numbers: one JSON figure per line in bench's
// shape, a hit rate for every strategy with every label, the other
// figures, and the report and plot. It runs the whole pipeline for
// about a minute: skipped under -short and -race (.ci/run runs it
// without the race detector).
func TestQuickSmoke(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("the quick simulation runs without -short and -race (.ci/run)")
	}
	dir := t.TempDir()
	var out, errb bytes.Buffer
	if err := run(t.Context(), []string{"--quick", "-o", "json", "--report", dir}, &out, &errb); err != nil {
		t.Fatalf("kvindex-sim --quick: %v\n%s", err, errb.String())
	}
	type line struct {
		Figure    string            `json:"figure"`
		Value     *float64          `json:"value"`
		Unit      string            `json:"unit"`
		Reference *float64          `json:"reference"`
		Ratio     *float64          `json:"ratio"`
		Goal      *float64          `json:"goal"`
		Met       *bool             `json:"met"`
		Labels    map[string]string `json:"labels"`
	}
	seen := map[string]int{}
	strategies := map[string]bool{}
	for i, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		// bench's fields; reference_name, goal_on and goal_op are optional.
		var loose map[string]any
		if err := json.Unmarshal([]byte(l), &loose); err != nil {
			t.Fatalf("line %d is not a JSON object: %q", i+1, l)
		}
		for k := range loose {
			switch k {
			case "figure", "value", "unit", "reference", "ratio", "goal", "met", "labels", "reference_name", "goal_on", "goal_op":
			default:
				t.Errorf("line %d: unexpected field %q", i+1, k)
			}
		}
		for _, k := range []string{"reference", "ratio", "goal", "met"} {
			if _, ok := loose[k]; !ok {
				t.Errorf("line %d lacks %q (null when there is none)", i+1, k)
			}
		}
		var f line
		if err := json.Unmarshal([]byte(l), &f); err != nil {
			t.Fatalf("line %d: %v", i+1, err)
		}
		if f.Figure == "" || f.Value == nil || f.Unit == "" {
			t.Errorf("line %d lacks figure, value or unit: %s", i+1, l)
		}
		if f.Labels["speedup"] == "" {
			t.Errorf("line %d has no speedup label: %s", i+1, l)
		}
		seen[f.Figure]++
		if v := f.Labels["valid"]; v != "true" && v != "false" {
			t.Errorf("line %d: valid label %q, want true or false: %s", i+1, v, l)
		}
		if f.Figure == sim.FigHitRate {
			for _, k := range []string{"strategy", "routers", "restarts", "cache_fraction"} {
				if f.Labels[k] == "" {
					t.Errorf("hit rate without %s: %s", k, l)
				}
			}
			strategies[f.Labels["strategy"]] = true
		}
		// The goal is on each order's gap and on their mean, not on the
		// min and max.
		if st := f.Labels["stat"]; f.Figure == sim.FigOracleGap && f.Labels["strategy"] == sim.StrategyKVIndex && st != sim.StatMin && st != sim.StatMax && (f.Goal == nil || f.Met == nil) {
			t.Errorf("the goal scenario's gap has no goal or verdict: %s", l)
		}
	}
	for _, s := range sim.Strategies {
		if !strategies[s] {
			t.Errorf("no hit rate for %s", s)
		}
	}
	for _, name := range []string{sim.FigHitRate, sim.FigOracleGap, sim.FigGhosts, sim.FigTTFTP50, sim.FigTTFTP99, sim.FigSpread, sim.FigLagP50, sim.FigLagP99, sim.FigLagMax, sim.FigLagMisses, sim.FigCeiling, sim.FigFallbacks} {
		if seen[name] == 0 {
			t.Errorf("no %s figure", name)
		}
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(md, []byte("| strategy |")) || !bytes.Contains(md, []byte("hit_rate.svg")) {
		t.Errorf("report.md has no table or plot:\n%s", md)
	}
	svg, err := os.ReadFile(filepath.Join(dir, "hit_rate.svg"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(bytes.TrimSpace(svg), []byte("<?xml")) && !bytes.Contains(svg, []byte("<svg")) {
		t.Errorf("hit_rate.svg is not an SVG")
	}
}

// TestValidity: a run that is not valid fails, unless quick or allowed;
// the error names the run that fell behind.
func TestValidity(t *testing.T) {
	run := func(issued time.Duration) sim.RunResult {
		return sim.RunResult{Spec: sim.RunSpec{Strategy: sim.StrategyKVIndex, Fraction: 0.05, Order: 2}, Requests: 100,
			Span: 200 * time.Second, Issued: issued}
	}
	onTime, behind := run(10*time.Second), run(20*time.Second) // 20x kept; 10x against 20
	for _, tc := range []struct {
		name         string
		quick, allow bool
		runs         []sim.RunResult
		wantErr      string
	}{
		{name: "valid", runs: []sim.RunResult{onTime, onTime}},
		{name: "invalid", runs: []sim.RunResult{onTime, behind}, wantErr: "not valid: 1 of 2 runs fell behind their schedule"},
		{name: "invalid_names_the_run", runs: []sim.RunResult{behind}, wantErr: "kvindex at fraction 0.05 order 2: late p99 0s, speedup kept 10.0"},
		{name: "invalid_quick", quick: true, runs: []sim.RunResult{behind}},
		{name: "invalid_allowed", allow: true, runs: []sim.RunResult{behind}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := sim.DefaultConfig()
			c.Quick = tc.quick
			err := validity(&sim.Result{Config: c, Runs: tc.runs}, tc.allow)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("err = %v, want none", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("err = %v, want it to say %q", err, tc.wantErr)
			}
		})
	}
}
