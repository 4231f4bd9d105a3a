package bench

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
)

func TestFigureRatioAndMet(t *testing.T) {
	for _, tc := range []struct {
		name      string
		f         Figure
		wantRatio float64
		hasRatio  bool
		wantMet   bool
		hasGoal   bool
	}{
		{name: "ratio_at_most_met", f: Figure{Value: 150, Reference: 100, HasReference: true, Goal: &Goal{Target: 2, AtMost: true, OnRatio: true}},
			wantRatio: 1.5, hasRatio: true, wantMet: true, hasGoal: true},
		{name: "ratio_at_most_missed", f: Figure{Value: 250, Reference: 100, HasReference: true, Goal: &Goal{Target: 2, AtMost: true, OnRatio: true}},
			wantRatio: 2.5, hasRatio: true, wantMet: false, hasGoal: true},
		{name: "ratio_at_least", f: Figure{Value: 79, Reference: 100, HasReference: true, Goal: &Goal{Target: 0.8, OnRatio: true}},
			wantRatio: 0.79, hasRatio: true, wantMet: false, hasGoal: true},
		{name: "value_goal", f: Figure{Value: 36, Goal: &Goal{Target: 48, AtMost: true}}, wantMet: true, hasGoal: true},
		{name: "no_goal", f: Figure{Value: 3, Reference: 4, HasReference: true}, wantRatio: 0.75, hasRatio: true},
		{name: "ratio_goal_without_reference", f: Figure{Value: 3, Goal: &Goal{Target: 2, AtMost: true, OnRatio: true}}},
		{name: "zero_reference", f: Figure{Value: 3, HasReference: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, ok := tc.f.Ratio()
			if ok != tc.hasRatio || (ok && r != tc.wantRatio) {
				t.Errorf("Ratio() = %v, %v; want %v, %v", r, ok, tc.wantRatio, tc.hasRatio)
			}
			met, ok := tc.f.Met()
			if ok != tc.hasGoal || met != tc.wantMet {
				t.Errorf("Met() = %v, %v; want %v, %v", met, ok, tc.wantMet, tc.hasGoal)
			}
		})
	}
}

func TestFigureJSON(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    Figure
		want map[string]any
	}{
		{
			name: "with_reference_and_goal",
			f: Figure{Name: "lookup_ns_per_hash", Labels: map[string]string{"entries": "10"}, Value: 3, Unit: "ns/hash",
				Reference: 2, HasReference: true, RefName: "map", Goal: &Goal{Target: 2, AtMost: true, OnRatio: true}},
			want: map[string]any{"figure": "lookup_ns_per_hash", "value": 3.0, "unit": "ns/hash", "reference": 2.0, "ratio": 1.5,
				"goal": 2.0, "met": true, "goal_on": "ratio", "goal_op": "<=", "reference_name": "map", "labels": map[string]any{"entries": "10"}},
		},
		{
			name: "bare",
			f:    Figure{Name: "x", Value: 1, Unit: "s"},
			want: map[string]any{"figure": "x", "value": 1.0, "unit": "s", "reference": nil, "ratio": nil, "goal": nil, "met": nil},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			r := Report{Figures: []Figure{tc.f, tc.f}}
			if err := r.WriteJSON(&buf); err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
			if len(lines) != 2 {
				t.Fatalf("%d lines, want one per figure: %q", len(lines), buf.String())
			}
			var got map[string]any
			if err := json.Unmarshal([]byte(lines[0]), &got); err != nil {
				t.Fatal(err)
			}
			if diff := gocmp.Diff(tc.want, got); diff != "" {
				t.Fatalf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestReportText(t *testing.T) {
	r := Report{Title: "t"}
	r.Add(Figure{Name: "ingest_block_ops_per_second", Value: 80, Unit: "block-ops/s", Reference: 100, HasReference: true,
		Goal: &Goal{Target: 0.8, OnRatio: true}})
	r.Notef("note %d", 7)
	var buf bytes.Buffer
	if err := r.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ingest_block_ops_per_second", "0.800", "ratio >= 0.8", "yes", "- note 7"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("text output lacks %q:\n%s", want, buf.String())
		}
	}
}
