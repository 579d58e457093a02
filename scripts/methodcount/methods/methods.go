// Package methods counts the methods of the Go types under a directory, per
// file: the measure `go run ./scripts/methodcount` prints and fleet's
// layout test checks.
package methods

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
)

// Type names a type by its package directory and name.
type Type struct{ Pkg, Name string }

// Count returns, for every type with methods in the non-test Go files under
// root (testdata skipped), how many of them each file declares.
func Count(root string) (map[Type]map[string]int, error) {
	counts := map[Type]map[string]int{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Recv == nil || len(fd.Recv.List) == 0 {
				continue
			}
			t := fd.Recv.List[0].Type
			if s, ok := t.(*ast.StarExpr); ok {
				t = s.X
			}
			if ix, ok := t.(*ast.IndexExpr); ok { // a generic type's receiver
				t = ix.X
			}
			id, ok := t.(*ast.Ident)
			if !ok {
				continue
			}
			k := Type{filepath.Dir(path), id.Name}
			if counts[k] == nil {
				counts[k] = map[string]int{}
			}
			counts[k][filepath.Base(path)]++
		}
		return nil
	})
	return counts, err
}

// Total is a type's method count over its files.
func Total(files map[string]int) int {
	n := 0
	for _, c := range files {
		n += c
	}
	return n
}
