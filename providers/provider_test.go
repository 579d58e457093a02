package providers_test

import (
	"slices"
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

func TestConfigDecodeStrict(t *testing.T) {
	type block struct {
		Zones []string `json:"zones"`
	}
	cases := []struct {
		name, raw string
		want      []string
		wantErr   bool
	}{
		{"empty block", "", nil, false},
		{"blank block", " \n", nil, false},
		{"known attribute", `{"zones":["a"]}`, []string{"a"}, false},
		{"unknown attribute", `{"zones":["a"],"zone":"b"}`, nil, true},
		{"not an object", `["a"]`, nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var b block
			err := providers.Config{Raw: []byte(tc.raw)}.DecodeStrict(&b)
			if (err != nil) != tc.wantErr || (!tc.wantErr && !slices.Equal(b.Zones, tc.want)) {
				t.Errorf("DecodeStrict(%q) = %+v, %v; want zones %v, error %v", tc.raw, b, err, tc.want, tc.wantErr)
			}
		})
	}
}
