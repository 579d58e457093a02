package main

import (
	"strings"
	"testing"
)

// TestEmptyOfferingsNote: an empty `fleetd offerings` table says why —
// no offerings at all, or every one excluded, by reason, most common
// first.
func TestEmptyOfferingsNote(t *testing.T) {
	tests := []struct {
		name     string
		n        int
		excluded map[string]int
		want     []string
	}{
		{"market empty", 0, nil, []string{"no offerings from the fleet's providers"}},
		{"all excluded", 18, map[string]int{`GPU type V100 not in ["A100"]`: 9, "spot: on_demand_fallback never": 9},
			[]string{"all 18 are excluded (-all lists them)", `9 × GPU type V100 not in ["A100"]; 9 × spot`}},
		{"many reasons", 5, map[string]int{"a": 2, "b": 1, "c": 1, "d": 1}, []string{"2 × a; 1 × b; 1 × c; 1 more reasons"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := emptyOfferingsNote(tt.n, tt.excluded)
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("note %q lacks %q", got, w)
				}
			}
		})
	}
}
