package main

import (
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// goList runs go list with args in this package's directory (inside the
// main module) and returns its output lines.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list"}, args...)...).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, ee.Stderr)
		}
		t.Fatalf("go list %s: %v", strings.Join(args, " "), err)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// TestBinaryLinksNoTesting fails for each package linked into the kvindex
// binary that imports testing or one of its subpackages: test helpers,
// simulators that need testing.TB and the like belong in packages only
// tests import. It lists the importing packages so the fix is
// plain.
func TestBinaryLinksNoTesting(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	lines := goList(t, "-deps", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", ".")
	sawCobra := false
	for _, line := range lines {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		sawCobra = sawCobra || f[0] == "github.com/spf13/cobra"
		for _, imp := range f[1:] {
			if imp == "testing" || strings.HasPrefix(imp, "testing/") {
				t.Errorf("%s, linked into the binary, imports %s", f[0], imp)
			}
		}
	}
	if !sawCobra {
		t.Fatalf("go list -deps lacks github.com/spf13/cobra: is it reading ./cmd/kvindex? %d packages", len(lines))
	}
}

// TestModuleGraphHasNoKubernetes checks `go list -m all` of the main
// module: kustomize and the Kubernetes API modules belong to the deploy
// module alone, so that a module requiring this one does not
// inherit their versions. k8s.io/utils and sigs.k8s.io/yaml stay: etcd's
// server requires them.
func TestModuleGraphHasNoKubernetes(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	forbidden := []string{
		"sigs.k8s.io/kustomize/",
		"k8s.io/api",
		"k8s.io/apimachinery",
		"k8s.io/client-go",
		"k8s.io/kube-openapi",
	}
	mods := goList(t, "-m", "-f", "{{.Path}}", "all")
	sawEtcd := false
	for _, m := range mods {
		sawEtcd = sawEtcd || m == "go.etcd.io/etcd/server/v3"
		for _, f := range forbidden {
			if m == f || strings.HasPrefix(m, f) && strings.HasSuffix(f, "/") {
				t.Errorf("the main module's graph holds %s", m)
			}
		}
	}
	if !sawEtcd {
		t.Fatalf("go list -m all lacks go.etcd.io/etcd/server/v3: is it reading the main module? %d modules", len(mods))
	}
}

// module is the main module's path.
const module = "github.com/kvindex/kvindex"

// The layers of docs/ARCHITECTURE.md ("Layers"), lowest first. A package
// may import packages of its own layer or of a lower one, never of a
// higher one.
const (
	layerFoundation = iota // internal/...: formats, helpers, simulators' models, test support
	layerComponent         // bridge, ingester, indexd (and their ...test packages)
	layerWiring            // wiring/...: the commands' wiring, the in-process stack
	layerTool              // bench/...: the benchmark instruments
	layerCommand           // cmd/..., e2e: mains and the whole-pipeline tests
)

var layerNames = []string{"foundation", "component", "wiring", "tool", "command"}

// layerOf returns the layer of a package of the main module (path relative
// to the module, "" for the root) and false for a path no layer names: a
// new top-level folder must be given a layer here and in ARCHITECTURE.md.
func layerOf(rel string) (int, bool) {
	top, _, _ := strings.Cut(rel, "/")
	switch top {
	case "internal":
		return layerFoundation, true
	case "bridge", "ingester", "indexd":
		return layerComponent, true
	case "wiring":
		return layerWiring, true
	case "bench":
		return layerTool, true
	case "cmd", "e2e":
		return layerCommand, true
	}
	return 0, false
}

// component returns the component a package belongs to ("" outside the
// component layer).
func component(rel string) string {
	if l, _ := layerOf(rel); l != layerComponent {
		return ""
	}
	top, _, _ := strings.Cut(rel, "/")
	return top
}

// layeringViolations checks the import edges pkg → imp (module-relative
// paths, non-test imports) against the layers: no edge runs up a layer,
// no component imports another component, and every package has a layer.
func layeringViolations(edges map[string][]string) []string {
	var out []string
	for pkg, imps := range edges {
		pl, ok := layerOf(pkg)
		if !ok {
			out = append(out, fmt.Sprintf("%s: no layer (cmd/kvindex/deps_test.go layerOf, docs/ARCHITECTURE.md)", pkg))
			continue
		}
		for _, imp := range imps {
			il, ok := layerOf(imp)
			if !ok {
				continue // reported as a package of its own
			}
			if il > pl {
				out = append(out, fmt.Sprintf("%s (%s) imports %s (%s): an edge running up", pkg, layerNames[pl], imp, layerNames[il]))
			}
			if pc, ic := component(pkg), component(imp); pc != "" && ic != "" && pc != ic {
				out = append(out, fmt.Sprintf("%s imports %s: components meet only in etcd and Kafka, never import each other", pkg, imp))
			}
		}
	}
	slices.Sort(out)
	return out
}

// moduleEdges returns the non-test import edges between the main module's
// packages, module-relative.
func moduleEdges(t *testing.T) map[string][]string {
	t.Helper()
	lines := goList(t, "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", module+"/...")
	edges := map[string][]string{}
	for _, line := range lines {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		pkg, ok := relative(f[0])
		if !ok {
			continue
		}
		edges[pkg] = nil
		for _, imp := range f[1:] {
			if r, ok := relative(imp); ok {
				edges[pkg] = append(edges[pkg], r)
			}
		}
	}
	return edges
}

// relative returns path relative to the main module, and false for a
// path outside it (other modules of the repository included: client and
// proto are the API, beneath every layer).
func relative(path string) (string, bool) {
	if path == module {
		return "", true
	}
	rel, ok := strings.CutPrefix(path, module+"/")
	if !ok {
		return "", false
	}
	top, _, _ := strings.Cut(rel, "/")
	switch top {
	case "client", "proto", "deploy", "router":
		return "", false
	}
	return rel, true
}

// TestLayering enforces the layers docs/ARCHITECTURE.md draws over every
// package of the main module: foundations import no component, wiring or
// tool; components import no wiring and not each other; wiring imports no
// tool. Test files are exempt (a foundation's benchmark may use the
// instruments of bench/).
func TestLayering(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	edges := moduleEdges(t)
	for _, want := range []string{"internal/keyspace", "ingester", "wiring/stack", "bench", "cmd/kvindex"} {
		if _, ok := edges[want]; !ok {
			t.Fatalf("go list lacks %s: is it reading the main module? %d packages", want, len(edges))
		}
	}
	for _, v := range layeringViolations(edges) {
		t.Error(v)
	}
}

// TestLayeringViolations checks that the rule of TestLayering catches
// each kind of edge it forbids, and passes the allowed ones.
func TestLayeringViolations(t *testing.T) {
	tests := []struct {
		name  string
		edges map[string][]string
		want  int
	}{
		{"allowed, downward and sideways", map[string][]string{
			"internal/index":    {"internal/keyspace"},
			"indexd":            {"internal/index"},
			"bridge/bridgetest": {"bridge"},
			"wiring/stack":      {"ingester", "indexd"},
			"bench":             {"wiring/cli/common", "ingester"},
			"cmd/kvindex":       {"wiring/cli"},
		}, 0},
		{"foundation imports a component", map[string][]string{"internal/index": {"indexd"}}, 1},
		{"foundation imports wiring", map[string][]string{"internal/scenario": {"wiring/stack"}}, 1},
		{"component imports wiring", map[string][]string{"ingester": {"wiring/cli/common"}}, 1},
		{"component imports a component", map[string][]string{"indexd": {"ingester"}}, 1},
		{"wiring imports a tool", map[string][]string{"wiring/cli": {"bench/benchcmd"}}, 1},
		{"a folder with no layer", map[string][]string{"tools/x": nil}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := layeringViolations(tc.edges)
			if len(got) != tc.want {
				t.Errorf("violations = %q, want %d", got, tc.want)
			}
		})
	}
}

// TestBinaryLinksNoBench fails for each simulator or benchmark package
// linked into the kvindex binary: they belong to cmd/kvindex-bench and the
// tests (docs/ARCHITECTURE.md, "Layers").
func TestBinaryLinksNoBench(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	deps := goList(t, "-deps", "-f", "{{.ImportPath}}", ".")
	for _, p := range deps {
		rel, ok := relative(p)
		if !ok {
			continue
		}
		if rel == "bench" || strings.HasPrefix(rel, "bench/") || strings.HasPrefix(rel, "internal/sim/") {
			t.Errorf("the kvindex binary links %s", p)
		}
	}
	if !slices.Contains(deps, module+"/ingester") {
		t.Fatalf("go list -deps lacks the ingester: is it reading ./cmd/kvindex? %d packages", len(deps))
	}
}
