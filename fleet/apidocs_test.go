package fleet

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// route is one pattern given to (*http.ServeMux).Handle or HandleFunc.
type route struct {
	pattern      string // as registered
	method, path string // method "" when the pattern takes every method
	at           string // file:line, for failure messages
}

// sourceRoutes reads every mux pattern registered in the daemon's source:
// package fleet and the packages under it, and the rendezvous. Source,
// not a running mux: http.ServeMux does not list its patterns, and the
// routes are registered in five packages.
func sourceRoutes(t *testing.T) []route {
	t.Helper()
	var out []route
	fset := token.NewFileSet()
	for _, root := range []string{".", filepath.Join("..", "rendezvous")} {
		err := filepath.WalkDir(root, func(path string, de fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if de.IsDir() && de.Name() == "testdata" {
				return filepath.SkipDir
			}
			if de.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || len(call.Args) != 2 {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok || (sel.Sel.Name != "Handle" && sel.Sel.Name != "HandleFunc") {
					return true
				}
				lit, ok := call.Args[0].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				pattern, err := strconv.Unquote(lit.Value)
				if err != nil {
					return true
				}
				r := route{pattern: pattern, path: pattern, at: fset.Position(lit.Pos()).String()}
				if m, p, ok := strings.Cut(pattern, " "); ok {
					r.method, r.path = m, p
				}
				out = append(out, r)
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(out) < 10 {
		t.Fatalf("found only %d routes; the source scan is broken: %v", len(out), out)
	}
	return out
}

// wildcards folds every {name} of a path to {}: the code names a fleet
// {fleet} where the docs say {name}.
var wildcards = regexp.MustCompile(`\{[^}]*\}`)

func normPath(p string) string {
	return wildcards.ReplaceAllString(strings.TrimSuffix(p, "{$}"), "{}")
}

// documentedRoute finds "METHOD /path" in the docs; a query string or
// the end of a code span ends the path. routeRow finds the rows of
// api.md's route tables, which start with the method and path.
var (
	documentedRoute = regexp.MustCompile("(GET|POST|PUT|DELETE) (/[A-Za-z0-9_{}./$-]*)")
	routeRow        = regexp.MustCompile("(?m)^\\| `(GET|POST|PUT|DELETE) (/[A-Za-z0-9_{}./$-]*)")
)

// TestAPIReferenceCoversEveryRoute ties docs/api.md to the routes: every
// /v1/ route the daemon registers has a row in api.md's route tables, every
// other route (/healthz, /metrics, the dashboard, prefixes) is named in
// some page under docs/, and every "METHOD /v1/…" that api.md names is
// served, so neither can fall behind the other.
func TestAPIReferenceCoversEveryRoute(t *testing.T) {
	routes := sourceRoutes(t)
	var docs strings.Builder
	mds, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, md := range mds {
		b, err := os.ReadFile(md)
		if err != nil {
			t.Fatal(err)
		}
		docs.Write(b)
	}
	apiMD, err := os.ReadFile("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{} // "METHOD path", normalized: api.md's route rows
	for _, m := range routeRow.FindAllStringSubmatch(string(apiMD), -1) {
		documented[m[1]+" "+normPath(m[2])] = true
	}
	text := wildcards.ReplaceAllString(docs.String(), "{}")

	for _, r := range routes {
		p := normPath(r.path)
		switch {
		case r.pattern == "/":
			// The admin API's fallthrough to the daemon's extra routes,
			// not a route of its own.
		case strings.HasPrefix(p, "/v1/") && r.method != "":
			if !documented[r.method+" "+p] {
				t.Errorf("%s: %s %s is served but no row of docs/api.md's route tables names it", r.at, r.method, r.path)
			}
		default:
			// Prefix routes (/v1/rendezvous/, /ui/), /healthz, /metrics
			// and the dashboard's root: named without a method.
			if !strings.Contains(text, "`"+p) {
				t.Errorf("%s: %s is served but no page under docs/ names it", r.at, r.path)
			}
		}
	}

	// A prefix route hands its paths to a sub-mux whose own routes are
	// scanned too (/v1/rendezvous/ → package rendezvous), so a documented
	// path must match an exact pattern.
	served := func(method, path string) bool {
		return slices.ContainsFunc(routes, func(r route) bool {
			return (r.method == "" || r.method == method) && normPath(r.path) == path
		})
	}
	for _, m := range documentedRoute.FindAllStringSubmatch(string(apiMD), -1) {
		method, path := m[1], normPath(strings.TrimRight(m[2], "."))
		if !strings.HasPrefix(path, "/v1/") {
			continue
		}
		if !served(method, path) {
			t.Errorf("docs/api.md names %s %s, which the daemon does not serve", method, m[2])
		}
	}
}
