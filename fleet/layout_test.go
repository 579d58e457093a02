package fleet_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fleetd/fleetd/scripts/methodcount/methods"
)

const module = "github.com/fleetd/fleetd"

// repoImports maps each package of the module (by import path) to the
// module packages its non-test files import.
func repoImports(t *testing.T) map[string][]string {
	t.Helper()
	root := ".."
	out := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		pkg := module
		if rel != "." {
			pkg += "/" + filepath.ToSlash(rel)
		}
		if _, ok := out[pkg]; !ok {
			out[pkg] = nil
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if (p == module || strings.HasPrefix(p, module+"/")) && !slices.Contains(out[pkg], p) {
				out[pkg] = append(out[pkg], p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// deps is every module package pkg imports, directly or not, with the
// chain that reaches each first.
func deps(graph map[string][]string, pkg string) map[string][]string {
	seen := map[string][]string{}
	var walk func(p string, chain []string)
	walk = func(p string, chain []string) {
		for _, q := range graph[p] {
			if _, ok := seen[q]; ok {
				continue
			}
			c := append(slices.Clone(chain), q)
			seen[q] = c
			walk(q, c)
		}
	}
	walk(pkg, []string{pkg})
	return seen
}

// TestImportDirections enforces the import directions of LAYOUT.md that
// keep the parts separable: providers and plugins can be imported by an
// external provider alone, the node agent never links the daemon, the
// controller knows nothing of the HTTP API, and no package under fleet/
// reaches back into the daemon's wiring (package fleet).
func TestImportDirections(t *testing.T) {
	graph := repoImports(t)
	under := func(p, dir string) bool { return p == module+"/"+dir || strings.HasPrefix(p, module+"/"+dir+"/") }
	rules := []struct {
		name   string
		from   func(p string) bool
		forbid func(dep string) bool
	}{
		{"providers and plugins never import the daemon",
			func(p string) bool { return under(p, "providers") || under(p, "plugins") },
			func(d string) bool { return under(d, "fleet") }},
		{"the agent never imports the daemon",
			func(p string) bool { return under(p, "agent") || under(p, "agentwire") || under(p, "cmd/fleetd-agent") },
			func(d string) bool { return under(d, "fleet") }},
		{"the controller never imports the API or the daemon",
			func(p string) bool { return under(p, "fleet/controller") },
			func(d string) bool { return under(d, "fleet/api") || d == module+"/fleet" }},
		// internal/ holds the leaves every part shares (test helpers, the
		// context-aware sleep, option defaults): importing the module
		// would put them above some of their users.
		{"internal/ packages import nothing of the module",
			func(p string) bool { return under(p, "internal") },
			func(d string) bool { return strings.HasPrefix(d, module+"/") }},
		// fleettest starts whole daemons for other packages' tests.
		{"packages under fleet/ never import the daemon's wiring",
			func(p string) bool { return strings.HasPrefix(p, module+"/fleet/") && !under(p, "fleet/fleettest") },
			func(d string) bool { return d == module+"/fleet" }},
	}
	for _, r := range rules {
		checked := 0
		for pkg := range graph {
			if !r.from(pkg) {
				continue
			}
			checked++
			for dep, chain := range deps(graph, pkg) {
				if r.forbid(dep) {
					t.Errorf("%s: %s imports %s (%s)", r.name, pkg, dep, strings.Join(chain, " → "))
				}
			}
		}
		if checked == 0 {
			t.Errorf("%s: no package matched: the rule checks nothing", r.name)
		}
	}
}

// TestDaemonPackagesStayReadable is a check on the daemon's structure, not
// a goal: no file of package fleet or fleet/controller over 600 lines, no
// type under fleet/ with over 40 methods.
func TestDaemonPackagesStayReadable(t *testing.T) {
	const maxLines, maxMethods = 600, 40
	for _, dir := range []string{".", "controller"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(string(b), "\n"); n > maxLines {
				t.Errorf("%s: %d lines, over %d: split it by what it holds", f, n, maxLines)
			}
		}
	}
	counts, err := methods.Count(".")
	if err != nil {
		t.Fatal(err)
	}
	if len(counts) == 0 {
		t.Fatal("no methods found: the check checks nothing")
	}
	for typ, files := range counts {
		if n := methods.Total(files); n > maxMethods {
			t.Errorf("type %s.%s has %d methods, over %d (go run ./scripts/methodcount ./fleet)", typ.Pkg, typ.Name, n, maxMethods)
		}
	}
}
