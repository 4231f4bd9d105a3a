package doccheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/testutil"
)

// TestGoroutinePackagesCheckLeaks keeps docs/ARCHITECTURE.md's claim
// ("Goroutines and their owners") true: every package of the main module
// whose non-test code starts a goroutine (a go statement, or a call of a
// method named Go, as errgroup's), and that has
// tests, runs them under goleak.VerifyTestMain.
func TestGoroutinePackagesCheckLeaks(t *testing.T) {
	root := testutil.RepoRoot(t)
	fset := token.NewFileSet()
	starts := map[string]bool{}   // dir → a non-test file has a go statement
	hasTests := map[string]bool{} // dir → has a _test.go file
	verifies := map[string]bool{} // dir → a _test.go file calls goleak.VerifyTestMain
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && path != root {
				return filepath.SkipDir // another module: its own rules
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, ".pb.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		dir := filepath.Dir(rel)
		if strings.HasSuffix(path, "_test.go") {
			hasTests[dir] = true
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			verifies[dir] = verifies[dir] || strings.Contains(string(b), "goleak.VerifyTestMain(")
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.GoStmt:
				starts[dir] = true
			case *ast.CallExpr:
				// errgroup's Go (and any other method named Go).
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Go" {
					starts[dir] = true
				}
			}
			return !starts[dir]
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !starts["ingester"] || !verifies["ingester"] {
		t.Fatalf("the walk did not find the ingester's goroutines and its goleak check: is %s the repository root?", root)
	}
	var missing []string
	for dir := range starts {
		if hasTests[dir] && !verifies[dir] {
			missing = append(missing, dir)
		}
	}
	sort.Strings(missing)
	for _, dir := range missing {
		t.Errorf("%s starts goroutines but its tests do not run under goleak.VerifyTestMain", dir)
	}
}
