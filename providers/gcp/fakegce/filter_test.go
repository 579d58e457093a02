package fakegce

import "testing"

func TestFilter(t *testing.T) {
	doc := map[string]any{
		"name":   "vm-1",
		"status": "RUNNING",
		"id":     "4100000000000007919",
		"labels": map[string]any{"fleetd-fleet": "a", "team": "ml"},
		"scheduling": map[string]any{
			"automaticRestart": false,
		},
		"networkInterfaces": []any{map[string]any{"networkIP": "10.0.0.2"}},
		"insertTime":        "2026-10-01T10:00:00.000-07:00",
		"progress":          float64(100),
	}
	cases := []struct {
		filter string
		want   bool
	}{
		{``, true},
		{`name = "vm-1"`, true},
		{`name="vm-1"`, true},
		{`name = vm-1`, true},
		{`name = "vm-2"`, false},
		{`name != "vm-2"`, true},
		{`labels.fleetd-fleet = "a"`, true},
		{`(labels.fleetd-fleet = "a") (labels.team = "ml")`, true},
		{`(labels.fleetd-fleet = "a") (labels.team = "cv")`, false},
		{`labels.fleetd-fleet = "a" AND labels.team = "cv"`, false},
		{`labels.team = "cv" OR name = "vm-1"`, true},
		{`labels.team = "cv" OR name = "vm-2" AND status = RUNNING`, false},
		{`(labels.team = "cv" OR name = "vm-1") AND status = RUNNING`, true},
		{`NOT status = RUNNING`, false},
		{`labels.fleetd-fleet:*`, true},
		{`labels.other:*`, false},
		{`labels.other != "x"`, true},
		{`name:"vm"`, true},
		{`scheduling.automaticRestart = false`, true},
		{`scheduling.automaticRestart = FALSE`, true},
		{`networkInterfaces.networkIP = "10.0.0.2"`, true},
		{`insertTime > "2026-10-01T09:00:00.000-07:00"`, true},
		{`progress >= 100`, true},
		{`progress < 50`, false},
		{`id = "4100000000000007919"`, true},
	}
	for _, tc := range cases {
		f, err := parseFilter(tc.filter)
		if err != nil {
			t.Errorf("parseFilter(%q): %v", tc.filter, err)
			continue
		}
		if got := f.match(doc); got != tc.want {
			t.Errorf("%q matched %v, want %v", tc.filter, got, tc.want)
		}
	}
	for _, bad := range []string{`name =`, `name`, `(name = "a"`, `name ! "a"`, `= "a"`, `name = "unterminated`, `name = )`} {
		if _, err := parseFilter(bad); err == nil {
			t.Errorf("parseFilter(%q) succeeded, want an error", bad)
		}
	}
}
