package agentapi

import (
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
)

// A block's report is written to the store when it starts, finishes,
// fails or changes where it copies from, and otherwise at most every
// stagingPersistEvery.
func TestStagingPersistDue(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 23, 0, 0, 0, time.UTC)
	copying := api.StagingReport{Source: "s3://b/p", MountPath: "/data", From: "bucket", Bytes: 10, Total: 100}
	prev := stagingEntry{r: copying, at: t0, persisted: t0}
	with := func(f func(*api.StagingReport)) api.StagingReport { r := copying; f(&r); return r }
	cases := []struct {
		name string
		prev stagingEntry
		ok   bool
		r    api.StagingReport
		at   time.Time
		want bool
	}{
		{"first report", stagingEntry{}, false, copying, t0, true},
		{"progress soon after", prev, true, with(func(r *api.StagingReport) { r.Bytes = 20 }), t0.Add(time.Second), false},
		{"progress after the interval", prev, true, with(func(r *api.StagingReport) { r.Bytes = 90 }), t0.Add(stagingPersistEvery), true},
		{"done", prev, true, with(func(r *api.StagingReport) { r.Done = true }), t0.Add(time.Second), true},
		{"failed", prev, true, with(func(r *api.StagingReport) { r.Done, r.Error = true, "403" }), t0.Add(time.Second), true},
		{"from a peer now", prev, true, with(func(r *api.StagingReport) { r.From = "n2" }), t0.Add(time.Second), true},
		{"last write failed", stagingEntry{r: copying, at: t0}, true, copying, t0.Add(time.Second), true},
	}
	for _, tc := range cases {
		if got := persistDue(tc.prev, tc.ok, tc.r, tc.at); got != tc.want {
			t.Errorf("%s: persistDue = %v, want %v", tc.name, got, tc.want)
		}
	}
}
