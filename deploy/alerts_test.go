package deploy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/rules"
	"sigs.k8s.io/yaml"

	"github.com/kvindex/kvindex/internal/testutil"
)

// ruleTestFile is promtool's `test rules` input (the subset the alert
// tests use: alert_rule_test, no promql_expr_test).
type ruleTestFile struct {
	RuleFiles          []string       `json:"rule_files"`
	EvaluationInterval model.Duration `json:"evaluation_interval"`
	Tests              []struct {
		Name        string         `json:"name"`
		Interval    model.Duration `json:"interval"`
		InputSeries []struct {
			Series string `json:"series"`
			Values string `json:"values"`
		} `json:"input_series"`
		AlertRuleTest []struct {
			EvalTime  model.Duration `json:"eval_time"`
			Alertname string         `json:"alertname"`
			ExpAlerts []struct {
				ExpLabels      map[string]string `json:"exp_labels"`
				ExpAnnotations map[string]string `json:"exp_annotations"`
			} `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// firing is one firing alert as a test compares it.
type firing struct {
	Labels      map[string]string
	Annotations map[string]string
}

// TestAlertRules runs every test of deploy/observability/tests in
// promtool's way: the input series are loaded into Prometheus's test
// storage, the rules file is loaded by Prometheus's rule manager (its own
// loader and parser), every group is evaluated at each evaluation
// interval from 0 to the last eval_time, and at each eval_time the firing
// alerts of the named rule must be exactly the expected ones (labels
// exactly, annotations where the test names them). It also requires that
// every alert of the rules file has a test where it fires and one where it
// stays quiet.
func TestAlertRules(t *testing.T) {
	root := testutil.RepoRoot(t)
	dir := filepath.Join(root, "deploy", "observability", "tests")
	files, err := filepath.Glob(filepath.Join(dir, "*.test.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no rule test files in %s (%v)", dir, err)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var tf ruleTestFile
		if err := yaml.UnmarshalStrict(data, &tf); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var ruleFiles []string
		for _, rf := range tf.RuleFiles {
			ruleFiles = append(ruleFiles, filepath.Join(filepath.Dir(f), rf))
		}
		evalEvery := time.Duration(tf.EvaluationInterval)
		if evalEvery <= 0 {
			evalEvery = time.Minute
		}
		for _, tc := range tf.Tests {
			for _, a := range tc.AlertRuleTest {
				if len(a.ExpAlerts) > 0 {
					fires[a.Alertname] = true
				} else {
					quiet[a.Alertname] = true
				}
			}
			t.Run(tc.Name, func(t *testing.T) {
				interval := time.Duration(tc.Interval)
				if interval <= 0 {
					interval = evalEvery
				}
				var load strings.Builder
				fmt.Fprintf(&load, "load %s\n", model.Duration(interval))
				for _, s := range tc.InputSeries {
					fmt.Fprintf(&load, "  %s %s\n", s.Series, s.Values)
				}
				st := promqltest.LoadedStorage(t, load.String())
				engine := promqltest.NewTestEngine(t, false, 0, promqltest.DefaultMaxSamplesPerQuery)
				m := rules.NewManager(&rules.ManagerOptions{
					QueryFunc:    rules.EngineQueryFunc(engine, st),
					AppendableV2: st,
					Context:      context.Background(),
					NotifyFunc:   func(context.Context, string, ...*rules.Alert) {},
				})
				groups, errs := m.LoadGroups(evalEvery, labels.EmptyLabels(), "", nil, false, ruleFiles...)
				if len(errs) > 0 {
					t.Fatalf("loading %v: %v", ruleFiles, errs)
				}
				names := slices.Sorted(func(yield func(string) bool) {
					for k := range groups {
						if !yield(k) {
							return
						}
					}
				})
				var last time.Duration
				for _, a := range tc.AlertRuleTest {
					last = max(last, time.Duration(a.EvalTime))
				}
				start := time.Unix(0, 0).UTC()
				for ts := time.Duration(0); ts <= last; ts += evalEvery {
					for _, n := range names {
						g := groups[n]
						g.Eval(context.Background(), start.Add(ts))
						for _, r := range g.Rules() {
							if err := r.LastError(); err != nil {
								t.Fatalf("rule %s at %s: %v", r.Name(), ts, err)
							}
						}
					}
					for _, a := range tc.AlertRuleTest {
						at := time.Duration(a.EvalTime)
						if at < ts || at >= ts+evalEvery {
							continue
						}
						got, found := firingAlerts(groups, a.Alertname)
						if !found {
							t.Fatalf("alert %s is not in the rules file", a.Alertname)
						}
						var want []firing
						for _, e := range a.ExpAlerts {
							l := map[string]string{"alertname": a.Alertname}
							for k, v := range e.ExpLabels {
								l[k] = v
							}
							want = append(want, firing{Labels: l, Annotations: e.ExpAnnotations})
						}
						// Annotations are compared only where the test names
						// them.
						for i := range got {
							if i < len(want) && want[i].Annotations == nil {
								got[i].Annotations = nil
							}
						}
						if diff := cmp.Diff(want, got); diff != "" {
							t.Errorf("%s at %s: firing alerts (-want +got):\n%s", a.Alertname, at, diff)
						}
					}
				}
			})
		}
	}
	for _, name := range alertNames(t) {
		if !fires[name] {
			t.Errorf("alert %s has no test in which it fires", name)
		}
		if !quiet[name] {
			t.Errorf("alert %s has no test in which it stays quiet (exp_alerts: [])", name)
		}
	}
}

// firingAlerts returns the firing alerts of the alerting rule named name
// across groups, ordered by labels, and whether such a rule exists.
func firingAlerts(groups map[string]*rules.Group, name string) ([]firing, bool) {
	var out []firing
	found := false
	for _, g := range groups {
		for _, ar := range g.AlertingRules() {
			if ar.Name() != name {
				continue
			}
			found = true
			for _, a := range ar.ActiveAlerts() {
				if a.State == rules.StateFiring {
					out = append(out, firing{Labels: a.Labels.Map(), Annotations: a.Annotations.Map()})
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b firing) int {
		return labels.Compare(labels.FromMap(a.Labels), labels.FromMap(b.Labels))
	})
	return out, found
}
