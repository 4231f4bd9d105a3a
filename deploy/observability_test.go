package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"

	"github.com/kvindex/kvindex/bridge"
	"github.com/kvindex/kvindex/internal/opsserver"
	"github.com/kvindex/kvindex/internal/testutil"
)

// The dashboards deploy/observability must hold.
var requiredDashboards = []string{"overview.json", "write-path.json", "router.json", "bridge.json"}

// targetLabels are the labels Prometheus attaches to every scraped series
// from its target (the PodMonitors and the ServiceMonitor of
// deploy/components/monitoring); no kvindex process exports them, so the
// scrape cannot show them.
var targetLabels = map[string]bool{"namespace": true, "pod": true, "job": true, "instance": true, "container": true, "service": true, "endpoint": true}

// checkedInRouter is the metric prefix the router plugin (router/gie, a
// module of its own whose k8s.io versions this module cannot share)
// exports; router/gie's TestObservabilityMetricsExist checks those names
// and labels against the plugin's own scrape, with the same rules.
const checkedInRouter = "kvindex_gie_"

// expr is one PromQL expression of a dashboard or the rules file.
type expr struct {
	Where string // "overview.json: panel \"...\"" or "rules: alert X"
	Expr  string
}

// grafanaDashboard is the subset of a Grafana dashboard JSON the tests read.
type grafanaDashboard struct {
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []grafanaPanel `json:"panels"`
}

type grafanaPanel struct {
	Type        string `json:"type"`
	Title       string `json:"title"`
	Description string `json:"description"`
	Datasource  *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		Expr       string `json:"expr"`
		Datasource *struct {
			UID string `json:"uid"`
		} `json:"datasource"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"`
}

func observabilityDir(t *testing.T) string {
	return filepath.Join(testutil.RepoRoot(t), "deploy", "observability")
}

// loadDashboards reads every dashboard of deploy/observability.
func loadDashboards(t *testing.T) map[string]*grafanaDashboard {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(observabilityDir(t), "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*grafanaDashboard{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d grafanaDashboard
		dec := json.NewDecoder(bytes.NewReader(data))
		if err := dec.Decode(&d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[filepath.Base(f)] = &d
	}
	return out
}

// promParser is Prometheus's PromQL parser with its default options (the
// ones Prometheus and its rule loader use).
var promParser = parser.NewParser(parser.Options{})

var grafanaVar = regexp.MustCompile(`\$\{?([A-Za-z_]\w*)\}?`)

// grafanaToPromQL replaces Grafana's variables by what they expand to in
// a query: the interval variables by durations, every other variable (a
// label value in a regex matcher) by ".*".
func grafanaToPromQL(s string) string {
	s = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "6h").Replace(s)
	return grafanaVar.ReplaceAllString(s, ".*")
}

var labelValuesQuery = regexp.MustCompile(`^label_values\((.+),\s*([A-Za-z_]\w*)\)$`)

// dashboardExprs returns every query of every dashboard: the panels'
// targets and the variables' label_values(selector, label) queries (as
// "count by (label) (selector)", which uses the same metric and label).
func dashboardExprs(t *testing.T, ds map[string]*grafanaDashboard) []expr {
	t.Helper()
	var out []expr
	for name, d := range ds {
		for _, v := range d.Templating.List {
			if v.Type != "query" {
				continue
			}
			var q struct {
				Query string `json:"query"`
			}
			if err := json.Unmarshal(v.Query, &q); err != nil {
				if err := json.Unmarshal(v.Query, &q.Query); err != nil {
					t.Fatalf("%s: variable %s: query: %v", name, v.Name, err)
				}
			}
			m := labelValuesQuery.FindStringSubmatch(q.Query)
			if m == nil {
				t.Errorf("%s: variable %s: query %q is not label_values(selector, label)", name, v.Name, q.Query)
				continue
			}
			out = append(out, expr{Where: fmt.Sprintf("%s: variable %s", name, v.Name), Expr: fmt.Sprintf("count by (%s) (%s)", m[2], grafanaToPromQL(m[1]))})
		}
		var walk func(ps []grafanaPanel)
		walk = func(ps []grafanaPanel) {
			for _, p := range ps {
				for _, tg := range p.Targets {
					out = append(out, expr{Where: fmt.Sprintf("%s: panel %q", name, p.Title), Expr: grafanaToPromQL(tg.Expr)})
				}
				walk(p.Panels)
			}
		}
		walk(d.Panels)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Where < out[j].Where })
	return out
}

// loadRules loads the rules file with Prometheus's rule loader.
func loadRules(t *testing.T) *rulefmt.RuleGroups {
	t.Helper()
	rgs, errs := rulefmt.ParseFile(filepath.Join(observabilityDir(t), "kvindex.rules.yaml"), false, model.UTF8Validation, parser.NewParser(parser.Options{}), nil)
	if len(errs) > 0 {
		t.Fatalf("rules file: %v", errs)
	}
	return rgs
}

func alertNames(t *testing.T) []string {
	var out []string
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				out = append(out, r.Alert)
			}
		}
	}
	return out
}

func ruleExprs(t *testing.T) []expr {
	var out []expr
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			out = append(out, expr{Where: "rules: alert " + r.Alert + r.Record, Expr: r.Expr})
		}
	}
	return out
}

// TestDashboards checks the dashboards' shape: the four the issue asks
// for, a Prometheus datasource variable every panel and query uses, a
// namespace variable (and model on the Overview), a description on every
// panel saying what is wrong when, and queries that Prometheus's PromQL
// parser accepts.
func TestDashboards(t *testing.T) {
	ds := loadDashboards(t)
	for _, want := range requiredDashboards {
		if ds[want] == nil {
			t.Errorf("deploy/observability/%s is missing", want)
		}
	}
	uids := map[string]string{}
	for name, d := range ds {
		if prev, ok := uids[d.UID]; ok || d.UID == "" {
			t.Errorf("%s: uid %q empty or also used by %s", name, d.UID, prev)
		}
		uids[d.UID] = name
		vars := map[string]string{}
		for _, v := range d.Templating.List {
			vars[v.Name] = v.Type
		}
		if vars["datasource"] != "datasource" {
			t.Errorf("%s: no datasource variable of type datasource", name)
		}
		if vars["namespace"] != "query" {
			t.Errorf("%s: no namespace query variable", name)
		}
		if name == "overview.json" && vars["model"] != "query" {
			t.Errorf("%s: no model query variable", name)
		}
		var walk func(ps []grafanaPanel)
		walk = func(ps []grafanaPanel) {
			for _, p := range ps {
				walk(p.Panels)
				if p.Type == "row" {
					continue
				}
				if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
					t.Errorf("%s: panel %q does not use the datasource variable", name, p.Title)
				}
				for _, tg := range p.Targets {
					if tg.Datasource == nil || tg.Datasource.UID != "${datasource}" {
						t.Errorf("%s: panel %q: a query does not use the datasource variable", name, p.Title)
					}
				}
				if len(p.Targets) == 0 {
					t.Errorf("%s: panel %q has no query", name, p.Title)
				}
				if !strings.Contains(p.Description, "Wrong when") || len(p.Description) < 80 {
					t.Errorf("%s: panel %q: the description must say what the panel means and, after \"Wrong when\", what to do when it looks wrong: %q", name, p.Title, p.Description)
				}
			}
		}
		walk(d.Panels)
	}
	for _, e := range dashboardExprs(t, ds) {
		if _, err := promParser.ParseExpr(e.Expr); err != nil {
			t.Errorf("%s: %q does not parse: %v", e.Where, e.Expr, err)
		}
	}
}

// The alerts the issue lists, by the concept each covers.
var requiredAlerts = map[string]string{
	"partition lag growing":                 "KvindexPartitionLagGrowing",
	"no progress from etcd":                 "KvindexNoProgressFromEtcd",
	"indexd not ready":                      "KvindexIndexdNotReady",
	"indexd stale":                          "KvindexIndexdStale",
	"skips rising by reason":                "KvindexRecordsSkipped",
	"bridge records lost":                   "KvindexBridgeRecordsLost",
	"outage state entered":                  "KvindexOutageEntered",
	"etcd DB above 80% of its quota":        "KvindexEtcdDBNearQuota",
	"transaction limit clamps":              "KvindexTxnLimitClamped",
	"endpoint flapping alive/expired":       "KvindexEndpointFlapping",
	"router falling back":                   "KvindexRouterFallingBack",
	"router identity mismatches":            "KvindexRouterIdentityMismatch",
	"bridge engine connection flapping":     "KvindexBridgeEngineFlapping",
	"indexd refusing Lookups":               "KvindexLookupErrors",
	"events skipped inside applied batches": "KvindexEventsSkipped",
}

var runbookHeading = regexp.MustCompile(`(?m)^## (\S+)\s*$`)

// TestRules loads the rules file with Prometheus's rule loader and checks
// every alert: the alerts are there, each has a severity, a
// summary and a runbook_url naming its section of docs/runbook.md, and
// that section says what it means, how to confirm it (with a command) and
// what to do.
func TestRules(t *testing.T) {
	rgs := loadRules(t)
	root := testutil.RepoRoot(t)
	runbook, err := os.ReadFile(filepath.Join(root, "docs", "runbook.md"))
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]string{}
	locs := runbookHeading.FindAllSubmatchIndex(runbook, -1)
	for i, l := range locs {
		end := len(runbook)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		sections[strings.ToLower(string(runbook[l[2]:l[3]]))] = string(runbook[l[1]:end])
	}
	have := map[string]bool{}
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			have[r.Alert] = true
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("alert %s: needs a severity label and summary and description annotations", r.Alert)
			}
			const base = "https://github.com/kvindex/kvindex/blob/main/docs/runbook.md#"
			url := r.Annotations["runbook_url"]
			anchor, ok := strings.CutPrefix(url, base)
			if !ok {
				t.Errorf("alert %s: runbook_url %q is not a section of docs/runbook.md (%s...)", r.Alert, url, base)
				continue
			}
			if anchor != strings.ToLower(r.Alert) {
				t.Errorf("alert %s: runbook_url names section %q, want its own (%q)", r.Alert, anchor, strings.ToLower(r.Alert))
			}
			sec, ok := sections[anchor]
			if !ok {
				t.Errorf("alert %s: docs/runbook.md has no section \"## %s\"", r.Alert, r.Alert)
				continue
			}
			for _, part := range []string{"**Means.**", "**Confirm.**", "**Do.**", "```"} {
				if !strings.Contains(sec, part) {
					t.Errorf("alert %s: its runbook section lacks %s", r.Alert, part)
				}
			}
			if confirm, _, _ := strings.Cut(sec[strings.Index(sec, "**Confirm.**")+1:], "**Do.**"); !strings.Contains(confirm, "```") {
				t.Errorf("alert %s: its runbook section's Confirm has no command or query", r.Alert)
			}
		}
	}
	for concept, name := range requiredAlerts {
		if !have[name] {
			t.Errorf("no alert %s (%s)", name, concept)
		}
	}
}

// TestPrometheusRuleMatchesRulesFile: the component's PrometheusRule holds
// exactly the rules file's groups.
func TestPrometheusRuleMatchesRulesFile(t *testing.T) {
	root := testutil.RepoRoot(t)
	plain, err := os.ReadFile(filepath.Join(root, "deploy", "observability", "kvindex.rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cr, err := os.ReadFile(filepath.Join(root, "deploy", "components", "monitoring", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var a struct {
		Groups any `json:"groups"`
	}
	var b struct {
		Kind string `json:"kind"`
		Spec struct {
			Groups any `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(plain, &a); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(cr, &b); err != nil {
		t.Fatal(err)
	}
	ja, _ := json.Marshal(a.Groups)
	jb, _ := json.Marshal(b.Spec.Groups)
	if b.Kind != "PrometheusRule" || !bytes.Equal(ja, jb) {
		t.Errorf("deploy/components/monitoring/prometheusrule.yaml's spec.groups differ from deploy/observability/kvindex.rules.yaml's groups")
	}
}

// usage is what an expression needs of the metrics: a selector's metric
// and matchers, or a grouping (by, on, ignoring, group_left) whose labels
// one of the selectors below it must carry.
type usage struct {
	Where    string
	Metrics  []string // a selector: one; a grouping: the selectors it groups
	Labels   []string
	Equal    map[string]string // a selector's equality matchers
	Grouping bool
}

// usages walks a parsed expression.
func usages(where string, e parser.Expr) []usage {
	var out []usage
	selectors := func(n parser.Node) []string {
		var names []string
		parser.Inspect(n, func(n parser.Node, _ []parser.Node) error {
			if vs, ok := n.(*parser.VectorSelector); ok && vs.Name != "" {
				names = append(names, vs.Name)
			}
			return nil
		})
		return names
	}
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			u := usage{Where: where, Metrics: []string{n.Name}, Equal: map[string]string{}}
			for _, m := range n.LabelMatchers {
				if m.Name == labels.MetricName {
					continue
				}
				u.Labels = append(u.Labels, m.Name)
				if m.Type == labels.MatchEqual {
					u.Equal[m.Name] = m.Value
				}
			}
			out = append(out, u)
		case *parser.AggregateExpr:
			if len(n.Grouping) > 0 {
				out = append(out, usage{Where: where, Metrics: selectors(n.Expr), Labels: n.Grouping, Grouping: true})
			}
		case *parser.BinaryExpr:
			if vm := n.VectorMatching; vm != nil {
				ls := slices.Concat(vm.MatchingLabels, vm.Include)
				if len(ls) > 0 {
					out = append(out, usage{Where: where, Metrics: slices.Concat(selectors(n.LHS), selectors(n.RHS)), Labels: ls, Grouping: true})
				}
			}
		}
		return nil
	})
	return out
}

// family is one scraped metric family: its type and, per label, the
// values seen.
type family struct {
	Type   dto.MetricType
	Labels map[string]map[string]bool
}

// scraped is every family of the scrapes, by name.
type scraped map[string]*family

func (s scraped) add(mfs map[string]*dto.MetricFamily) {
	for name, mf := range mfs {
		f := s[name]
		if f == nil {
			f = &family{Type: mf.GetType(), Labels: map[string]map[string]bool{}}
			s[name] = f
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if f.Labels[lp.GetName()] == nil {
					f.Labels[lp.GetName()] = map[string]bool{}
				}
				f.Labels[lp.GetName()][lp.GetValue()] = true
			}
		}
	}
}

// series resolves a series name of a query to its family: histograms and
// summaries are queried by their _bucket (with le), _sum and _count
// series.
func (s scraped) series(name string) (*family, string) {
	if f := s[name]; f != nil {
		return f, ""
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suf)
		if !ok {
			continue
		}
		if f := s[base]; f != nil && (f.Type == dto.MetricType_HISTOGRAM || f.Type == dto.MetricType_SUMMARY) {
			if suf == "_bucket" {
				if f.Type != dto.MetricType_HISTOGRAM {
					return nil, ""
				}
				return f, "le"
			}
			return f, ""
		}
	}
	return nil, ""
}

// check reports the usages of exprs the scrape does not back, skipping
// names with skipPrefix (checked elsewhere).
func (s scraped) check(exprs []expr, skipPrefix string) []string {
	var problems []string
	for _, e := range exprs {
		pe, err := promParser.ParseExpr(e.Expr)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", e.Where, err))
			continue
		}
		for _, u := range usages(e.Where, pe) {
			var fams []*family
			var extras []string
			for _, name := range u.Metrics {
				if skipPrefix != "" && strings.HasPrefix(name, skipPrefix) {
					continue
				}
				f, extra := s.series(name)
				if f == nil {
					if !u.Grouping {
						problems = append(problems, fmt.Sprintf("%s: metric %s is in no scrape", u.Where, name))
					}
					continue
				}
				fams = append(fams, f)
				extras = append(extras, extra)
			}
			if len(fams) == 0 {
				continue
			}
			for _, l := range u.Labels {
				if targetLabels[l] {
					continue
				}
				ok := false
				for i, f := range fams {
					if f.Labels[l] != nil || extras[i] == l {
						ok = true
					}
				}
				if !ok {
					problems = append(problems, fmt.Sprintf("%s: label %q of %v is in no scraped series", u.Where, l, u.Metrics))
					continue
				}
				if v, eq := u.Equal[l]; eq && !fams[0].Labels[l][v] {
					problems = append(problems, fmt.Sprintf("%s: no scraped series of %s has %s=%q", u.Where, u.Metrics[0], l, v))
				}
			}
		}
	}
	sort.Strings(problems)
	return problems
}

// scrape GETs a /metrics page and parses it as Prometheus does.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := httpGet(t, url)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d", url, code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parsing %s: %v", url, err)
	}
	return mfs
}

// TestObservedMetricsExist: every metric and label a dashboard or an
// alert uses is in what a live stack exports. It starts a standalone stack
// and drives it with scenarios (records of every kind, skipped ones
// included, Lookups and ListEndpoints), builds a bridge on its own
// registry, and scrapes both over HTTP; etcd's own metrics (DB size and
// quota) come from the embedded etcd member, which registers them in the
// process's default registry. A label counts only when a scraped series
// carries it, and an equality matcher's value only when a scraped series
// has it, so a counter vector without a series would fail: the series the
// rules select by value (drops{reason="expired"}, outages by kind, every
// bridge reason) are created at registration for this reason, and the rest
// by the scenarios. Target labels (namespace, pod, ...) are Prometheus's.
func TestObservedMetricsExist(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a stack")
	}
	s, idx := engineStack(t, "p01_shared_prefix.jsonl", "p05_tiers_and_offload.jsonl", "p08_bad_records_skipped.jsonl",
		"p10_signed_hashes_and_mediums.jsonl", "p11_goodbye_resync_heartbeat.jsonl", "e05_hybrid_attention_group.jsonl")
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	if _, err := idx.ListEndpoints(ctx, ""); err != nil {
		t.Fatal(err)
	}
	got := scraped{}
	got.add(scrape(t, "http://"+s.MetricsAddr()+"/metrics"))

	reg := prometheus.NewRegistry()
	cfg := bridge.DefaultConfig()
	cfg.Endpoint, cfg.Pod, cfg.Model = "tcp://127.0.0.1:1", "vllm-0", "m"
	cfg.Brokers, cfg.Topic, cfg.Registry = []string{s.KafkaAddr()}, s.Topic(), reg
	if _, err := bridge.New(cfg); err != nil {
		t.Fatal(err)
	}
	ops, err := opsserver.New(opsserver.Config{Addr: "127.0.0.1:0", Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	octx, ocancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ops.Run(octx) }()
	got.add(scrape(t, "http://"+ops.Addr()+"/metrics"))
	ocancel()
	if err := <-done; err != nil {
		t.Error(err)
	}

	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	etcd := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "etcd_") {
			etcd[mf.GetName()] = mf
		}
	}
	got.add(etcd)

	exprs := slices.Concat(dashboardExprs(t, loadDashboards(t)), ruleExprs(t))
	for _, p := range got.check(exprs, checkedInRouter) {
		t.Error(p)
	}
	// The check itself must fail on a name and a label that do not exist.
	bad := got.check([]expr{{Where: "probe", Expr: `sum by (nope) (kvindex_indexd_ready) + kvindex_indexd_readyy + kvindex_indexd_requests_total{method="Lookupp"}`}}, "")
	if len(bad) != 3 {
		t.Errorf("the check missed a bad name, label or value: %v", bad)
	}
}
