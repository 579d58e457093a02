package spec

import (
	"fmt"
	"strings"
)

// suggest returns the option closest to given when it is close enough to be
// a plausible typo, or "".
func suggest(given string, options []string) string {
	best, bestDist := "", 3
	for _, o := range options {
		if d := editDistance(strings.ToLower(given), strings.ToLower(o)); d < bestDist {
			best, bestDist = o, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance over runes.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}

// quoteList renders options as `"a", "b" or "c"`.
func quoteList(options []string) string {
	q := make([]string, len(options))
	for i, o := range options {
		q[i] = fmt.Sprintf("%q", o)
	}
	if len(q) < 2 {
		return strings.Join(q, "")
	}
	return strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1]
}
