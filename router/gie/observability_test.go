package gie

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

// TestObservabilityMetricsExist is the router half of the deploy module's
// TestObservedMetricsExist (deploy/observability_test.go, which skips the
// kvindex_gie_ names: this module's k8s.io versions and the deploy
// module's cannot share a graph). Every kvindex_gie_ series a dashboard
// or an alerting rule of deploy/observability selects, and every label it
// matches on, must be in a scrape of the plugin's Metrics; equality
// matchers' values must be among the scraped series' values.
func TestObservabilityMetricsExist(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics()
	// The per-model counters have a series once a model is counted.
	m.mismatch.WithLabelValues("llama")
	m.unknown.WithLabelValues("llama")
	reg.MustRegister(m)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}

	exprs := observabilityExprs(t)
	used := 0
	for _, e := range exprs {
		pe, err := parser.ParseExpr(e)
		if err != nil {
			t.Errorf("%q: %v", e, err)
			continue
		}
		parser.Inspect(pe, func(n parser.Node, _ []parser.Node) error {
			vs, ok := n.(*parser.VectorSelector)
			if !ok || !strings.HasPrefix(vs.Name, "kvindex_gie_") {
				return nil
			}
			used++
			mf, le := family(mfs, vs.Name)
			if mf == nil {
				t.Errorf("%q: metric %s is not in the plugin's scrape", e, vs.Name)
				return nil
			}
			for _, m := range vs.LabelMatchers {
				if m.Name == labels.MetricName || m.Name == "namespace" || m.Name == "pod" || (le && m.Name == "le") {
					continue
				}
				values := map[string]bool{}
				for _, s := range mf.GetMetric() {
					for _, lp := range s.GetLabel() {
						if lp.GetName() == m.Name {
							values[lp.GetValue()] = true
						}
					}
				}
				if len(values) == 0 {
					t.Errorf("%q: label %s of %s is in no scraped series", e, m.Name, vs.Name)
				} else if m.Type == labels.MatchEqual && !values[m.Value] {
					t.Errorf("%q: no scraped series of %s has %s=%q", e, vs.Name, m.Name, m.Value)
				}
			}
			return nil
		})
	}
	if used < 10 {
		t.Errorf("only %d kvindex_gie_ selectors in the dashboards and rules: the Router dashboard is missing?", used)
	}
}

// family finds the scraped family of a series name (histograms through
// their _bucket, _sum and _count series); le says the name is a _bucket.
func family(mfs map[string]*dto.MetricFamily, name string) (*dto.MetricFamily, bool) {
	if mf := mfs[name]; mf != nil {
		return mf, false
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suf); ok && mfs[base].GetType() == dto.MetricType_HISTOGRAM {
			return mfs[base], suf == "_bucket"
		}
	}
	return nil, false
}

var grafanaVariable = regexp.MustCompile(`\$\{?([A-Za-z_]\w*)\}?`)

// observabilityExprs returns every panel query of the dashboards and
// every rule expression, with Grafana's variables expanded as the deploy
// module's test does.
func observabilityExprs(t *testing.T) []string {
	t.Helper()
	dir := filepath.Join("..", "..", "deploy", "observability")
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards in %s (%v)", dir, err)
	}
	var out []string
	type panel struct {
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			Panels []panel `json:"panels"`
		}
		if err := json.Unmarshal(data, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, p := range d.Panels {
			for _, tg := range p.Targets {
				e := strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "6h").Replace(tg.Expr)
				out = append(out, grafanaVariable.ReplaceAllString(e, ".*"))
			}
		}
	}
	data, err := os.ReadFile(filepath.Join(dir, "kvindex.rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rf struct {
		Groups []struct {
			Rules []struct {
				Expr string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(data, &rf); err != nil {
		t.Fatal(err)
	}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			out = append(out, r.Expr)
		}
	}
	return out
}
