// Command methodcount prints, for the Go packages under the given
// directories, each type's method count and the files its methods are in
// (the measure issue 26's restructuring is checked by):
//
//	go run ./scripts/methodcount [-min N] DIR...
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	minCount := flag.Int("min", 10, "print only types with at least this many methods")
	flag.Parse()
	type key struct{ pkg, typ string }
	counts := map[key]map[string]int{}
	for _, root := range flag.Args() {
		err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
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
				if ix, ok := t.(*ast.IndexExpr); ok {
					t = ix.X
				}
				id, ok := t.(*ast.Ident)
				if !ok {
					continue
				}
				k := key{filepath.Dir(path), id.Name}
				if counts[k] == nil {
					counts[k] = map[string]int{}
				}
				counts[k][filepath.Base(path)]++
			}
			return nil
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	keys := make([]key, 0, len(counts))
	total := func(k key) int {
		n := 0
		for _, c := range counts[k] {
			n += c
		}
		return n
	}
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if a, b := total(keys[i]), total(keys[j]); a != b {
			return a > b
		}
		return keys[i].pkg+keys[i].typ < keys[j].pkg+keys[j].typ
	})
	for _, k := range keys {
		n := total(k)
		if n < *minCount {
			continue
		}
		files := make([]string, 0, len(counts[k]))
		for f, c := range counts[k] {
			files = append(files, fmt.Sprintf("%s %d", f, c))
		}
		sort.Slice(files, func(i, j int) bool { return files[i] < files[j] })
		fmt.Printf("%-28s %-18s %3d  (%s)\n", k.pkg, k.typ, n, strings.Join(files, ", "))
	}
}
