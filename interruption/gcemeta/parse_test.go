package gcemeta

import (
	"strings"
	"testing"
)

func TestParsePreempted(t *testing.T) {
	cases := []struct {
		body    string
		want    bool
		wantErr bool
	}{
		{"TRUE", true, false},
		{"FALSE", false, false},
		{"TRUE\n", true, false},
		{"true", false, true},
		{"", false, true},
		{"YES", false, true},
		{"TRUE FALSE", false, true},
		{strings.Repeat("T", 2000), false, true},
	}
	for _, c := range cases {
		got, err := ParsePreempted([]byte(c.body))
		if got != c.want || (err != nil) != c.wantErr {
			t.Errorf("ParsePreempted(%q) = %v, %v", c.body, got, err)
		}
	}
}

func TestParseMaintenanceEvent(t *testing.T) {
	cases := []struct {
		body    string
		want    MaintenanceEvent
		pending bool
		wantErr bool
	}{
		{"NONE", MaintenanceNone, false, false},
		{"MIGRATE_ON_HOST_MAINTENANCE", MigrateOnHostMaintenance, true, false},
		{"TERMINATE_ON_HOST_MAINTENANCE\n", TerminateOnHostMaintenance, true, false},
		{"SOME_FUTURE_EVENT", "SOME_FUTURE_EVENT", true, false},
		{"none", "", false, true},
		{"", "", false, true},
		{"TERMINATE ON HOST", "", false, true},
		{`{"event":"x"}`, "", false, true},
	}
	for _, c := range cases {
		got, err := ParseMaintenanceEvent([]byte(c.body))
		if got != c.want || (err != nil) != c.wantErr || (err == nil && got.Pending() != c.pending) {
			t.Errorf("ParseMaintenanceEvent(%q) = %q, %v", c.body, got, err)
		}
	}
}

func TestParseZoneAndName(t *testing.T) {
	for body, want := range map[string]string{
		"projects/123456789012/zones/us-central1-a": "us-central1-a",
		"projects/1/zones/europe-west4-b\n":         "europe-west4-b",
		"us-central1-a":                             "",
		"projects//zones/us-central1-a":             "",
		"projects/1/zones/us-central1":              "",
		"projects/1/regions/us-central1/zones/x":    "",
	} {
		got, err := ParseZone([]byte(body))
		if got != want || (err != nil) != (want == "") {
			t.Errorf("ParseZone(%q) = %q, %v", body, got, err)
		}
	}
	for body, ok := range map[string]bool{"node-1": true, "Node": false, "1node": false, "": false, "a-": false} {
		if _, err := ParseName([]byte(body)); (err == nil) != ok {
			t.Errorf("ParseName(%q): %v", body, err)
		}
	}
}

// The fuzz targets check the parsers never panic and that whatever they
// accept is canonical: re-rendering the result parses to the same value.
// Seeds live in testdata/fuzz/.

func FuzzParsePreempted(f *testing.F) {
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := ParsePreempted(body)
		if err != nil {
			return
		}
		want := "FALSE"
		if got {
			want = "TRUE"
		}
		if strings.TrimSpace(string(body)) != want {
			t.Errorf("accepted %q as %v", body, got)
		}
	})
}

func FuzzParseMaintenanceEvent(f *testing.F) {
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := ParseMaintenanceEvent(body)
		if err != nil {
			return
		}
		again, err := ParseMaintenanceEvent([]byte(got))
		if err != nil || again != got || got == "" {
			t.Errorf("accepted %q as %q, which re-parses to %q, %v", body, got, again, err)
		}
		if got.Pending() == (got == MaintenanceNone) {
			t.Errorf("%q: Pending() = %v", got, got.Pending())
		}
	})
}

func FuzzParseZone(f *testing.F) {
	f.Fuzz(func(t *testing.T, body []byte) {
		zone, err := ParseZone(body)
		if err != nil {
			return
		}
		again, err := ParseZone([]byte("projects/1/zones/" + zone))
		if err != nil || again != zone || !strings.HasSuffix(strings.TrimSpace(string(body)), "/zones/"+zone) {
			t.Errorf("accepted %q as %q", body, zone)
		}
	})
}
