package providers_test

import (
	"testing"

	"github.com/fleetd/fleetd/providers"
)

func TestHasTags(t *testing.T) {
	have := map[string]string{"fleetd-fleet": "a", "fleetd-node": "n1", "empty": ""}
	cases := []struct {
		name string
		want map[string]string
		ok   bool
	}{
		{"no tags asked", nil, true},
		{"one of them", map[string]string{"fleetd-fleet": "a"}, true},
		{"all of them", map[string]string{"fleetd-fleet": "a", "fleetd-node": "n1", "empty": ""}, true},
		{"another value", map[string]string{"fleetd-fleet": "b"}, false},
		{"a tag it lacks", map[string]string{"fleetd-fleet": "a", "owner": "x"}, false},
		{"an empty value it lacks", map[string]string{"missing": ""}, false},
	}
	for _, tc := range cases {
		if got := providers.HasTags(have, tc.want); got != tc.ok {
			t.Errorf("%s: HasTags = %v, want %v", tc.name, got, tc.ok)
		}
	}
}
