package main

import (
	"os/exec"
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
// tests import (issue 12). It lists the importing packages so the fix is
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
// module alone (issue 12), so that a module requiring this one does not
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
