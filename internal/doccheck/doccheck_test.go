package doccheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvindex/kvindex/internal/testutil"
)

// TestExportedIdentifiersHaveDocs parses every non-test Go file of the
// module (generated protobuf code excepted: its docs come from the .proto
// comments buf lint checks) and fails for each package without a package
// doc and each exported identifier without a doc comment. A grouped
// const or var block counts as documented by its group comment.
func TestExportedIdentifiersHaveDocs(t *testing.T) {
	root := testutil.RepoRoot(t)
	fset := token.NewFileSet()
	pkgDoc := map[string]bool{}
	var missing []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || strings.HasSuffix(path, ".pb.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		dir := filepath.Dir(rel)
		if _, ok := pkgDoc[dir]; !ok {
			pkgDoc[dir] = false
		}
		if f.Doc != nil {
			pkgDoc[dir] = true
		}
		if f.Name.Name == "main" {
			return nil
		}
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() || d.Doc != nil {
					continue
				}
				if d.Recv != nil && !exportedRecv(d.Recv) {
					continue
				}
				missing = append(missing, rel+": func "+recvName(d)+d.Name.Name)
			case *ast.GenDecl:
				if d.Tok == token.IMPORT {
					continue
				}
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() && s.Doc == nil && d.Doc == nil {
							missing = append(missing, rel+": type "+s.Name.Name)
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() && s.Doc == nil && d.Doc == nil && s.Comment == nil {
								missing = append(missing, rel+": "+d.Tok.String()+" "+n.Name)
							}
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for dir, ok := range pkgDoc {
		if !ok {
			missing = append(missing, dir+": package doc")
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("undocumented: %s", m)
	}
}

func exportedRecv(fl *ast.FieldList) bool {
	if len(fl.List) == 0 {
		return false
	}
	typ := fl.List[0].Type
	for {
		switch x := typ.(type) {
		case *ast.StarExpr:
			typ = x.X
		case *ast.IndexExpr:
			typ = x.X
		case *ast.IndexListExpr:
			typ = x.X
		case *ast.Ident:
			return x.IsExported()
		default:
			return false
		}
	}
}

func recvName(d *ast.FuncDecl) string {
	if d.Recv == nil || len(d.Recv.List) == 0 {
		return ""
	}
	typ := d.Recv.List[0].Type
	if s, ok := typ.(*ast.StarExpr); ok {
		typ = s.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return "(" + id.Name + ")."
	}
	return ""
}

// TestIngesterMetricsListed checks that ingester/doc.go's metric list
// names every metric ingester/metrics.go defines, and no other.
func TestIngesterMetricsListed(t *testing.T) {
	root := testutil.RepoRoot(t)
	src, err := os.ReadFile(filepath.Join(root, "ingester", "metrics.go"))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "ingester", "doc.go"))
	if err != nil {
		t.Fatal(err)
	}
	var defined []string
	for _, m := range regexp.MustCompile(`Name: "(\w+)"`).FindAllSubmatch(src, -1) {
		defined = append(defined, string(m[1]))
	}
	_, list, ok := strings.Cut(string(doc), "// Metrics (subsystem kvindex_ingester")
	if !ok {
		t.Fatal(`ingester/doc.go has no "Metrics (subsystem kvindex_ingester" paragraph`)
	}
	list, _, _ = strings.Cut(list, "\n//\n")
	var listed []string
	for _, m := range regexp.MustCompile(`\b([a-z]+(?:_[a-z]+)+|leases|partitions)\b`).FindAllString(list, -1) {
		if m != "kvindex_ingester" {
			listed = append(listed, m)
		}
	}
	if len(defined) < 20 {
		t.Fatalf("found %d metrics in ingester/metrics.go: has its form changed?", len(defined))
	}
	sort.Strings(defined)
	sort.Strings(listed)
	if diff := cmp.Diff(defined, listed); diff != "" {
		t.Errorf("ingester/doc.go's metric list differs from metrics.go (-defined +listed):\n%s", diff)
	}
}

// TestMakefileModules checks the Makefile's MODULES against the go.mod
// files of the repository, and docs/STYLE.md's count of them.
func TestMakefileModules(t *testing.T) {
	root := testutil.RepoRoot(t)
	var found []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.Name() == "go.mod" {
			rel, _ := filepath.Rel(root, filepath.Dir(path))
			found = append(found, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^MODULES\s*:=\s*(.*)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("the Makefile has no MODULES := line")
	}
	listed := strings.Fields(string(m[1]))
	sort.Strings(found)
	sort.Strings(listed)
	if diff := cmp.Diff(found, listed); diff != "" {
		t.Errorf("Makefile MODULES differs from the go.mod files (-go.mod +MODULES):\n%s", diff)
	}
	style, err := os.ReadFile(filepath.Join(root, "docs", "STYLE.md"))
	if err != nil {
		t.Fatal(err)
	}
	words := []string{"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"}
	if n := len(found); n < len(words) && !strings.Contains(string(style), words[n]+"\n  today") && !strings.Contains(string(style), words[n]+" today") {
		t.Errorf("docs/STYLE.md does not say %q: the repository has %d modules", words[n]+" today", n)
	}
}

// TestArchitectureNamesIngesterFiles checks docs/ARCHITECTURE.md's write
// path against ingester/: every file it names exists there, and every
// non-test file there is named.
func TestArchitectureNamesIngesterFiles(t *testing.T) {
	root := testutil.RepoRoot(t)
	arch, err := os.ReadFile(filepath.Join(root, "docs", "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	start := strings.Index(string(arch), "## Write path")
	end := strings.Index(string(arch), "## Read path")
	if start < 0 || end < start {
		t.Fatal(`docs/ARCHITECTURE.md lacks "## Write path" before "## Read path"`)
	}
	named := map[string]bool{}
	for _, m := range regexp.MustCompile("`(\\w+\\.go)`").FindAllStringSubmatch(string(arch)[start:end], -1) {
		named[m[1]] = true
	}
	files, err := filepath.Glob(filepath.Join(root, "ingester", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	exists := map[string]bool{}
	for _, f := range files {
		if b := filepath.Base(f); !strings.HasSuffix(b, "_test.go") && b != "doc.go" {
			exists[b] = true
			if !named[b] {
				t.Errorf("docs/ARCHITECTURE.md's write path does not name ingester/%s", b)
			}
		}
	}
	if len(exists) == 0 {
		t.Fatal("no files in ingester/")
	}
	for f := range named {
		if !exists[f] {
			t.Errorf("docs/ARCHITECTURE.md's write path names %s, which ingester/ does not have", f)
		}
	}
}
