// Command methodcount prints, for the Go packages under the given
// directories, each type's method count and the files its methods are in
// (the measure issue 26's restructuring is checked by):
//
//	go run ./scripts/methodcount [-min N] DIR...
package main

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"sort"
	"strings"

	"github.com/fleetd/fleetd/scripts/methodcount/methods"
)

func main() {
	minCount := flag.Int("min", 10, "print only types with at least this many methods")
	flag.Parse()
	counts := map[methods.Type]map[string]int{}
	for _, root := range flag.Args() {
		c, err := methods.Count(root)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		maps.Copy(counts, c)
	}
	keys := make([]methods.Type, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if a, b := methods.Total(counts[keys[i]]), methods.Total(counts[keys[j]]); a != b {
			return a > b
		}
		return keys[i].Pkg+keys[i].Name < keys[j].Pkg+keys[j].Name
	})
	for _, k := range keys {
		n := methods.Total(counts[k])
		if n < *minCount {
			continue
		}
		files := make([]string, 0, len(counts[k]))
		for f, c := range counts[k] {
			files = append(files, fmt.Sprintf("%s %d", f, c))
		}
		sort.Slice(files, func(i, j int) bool { return files[i] < files[j] })
		fmt.Printf("%-28s %-18s %3d  (%s)\n", k.Pkg, k.Name, n, strings.Join(files, ", "))
	}
}
