package schema_test

import (
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/allocator"
	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/api/schema"
	"github.com/fleetd/fleetd/fleet/budget"
)

// TestProjectTypesValidate: what an allocator decision and a ledger
// become in the API validates against the documented schema.
func TestProjectTypesValidate(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	in := allocator.Input{Now: t0, PoolGPUs: 4,
		Projects: []allocator.Project{{Name: "a", QuotaGPUs: 2, MaxGPUs: 4, Priority: 10}, {Name: "b", QuotaGPUs: 2, MaxGPUs: 2}},
		Fleets: []allocator.Fleet{
			{Name: "elastic", Project: "a", GPUsPerNode: 1, MinNodes: 1, MaxNodes: 4, Current: 4, Running: true},
			{Name: "first", Project: "b", GPUsPerNode: 1, MinNodes: 2, MaxNodes: 2, Current: 2, Running: true},
			{Name: "second", Project: "b", GPUsPerNode: 1, MinNodes: 2, MaxNodes: 2, Arrival: t0.Add(-time.Minute)},
		}}
	d := allocator.Decide(in)
	var l budget.Ledger
	l.Run(t0.Add(-time.Hour), "elastic", "a", 4, 1)
	l.Charge(t0, "elastic", "a", budget.Spend{Egress: 0.5})
	projects := api.ProjectsFrom(d, nil, map[string]int{"a": 10}, func(p string) (budget.Status, bool) {
		if p != "a" {
			return budget.Status{}, false
		}
		return l.ProjectStatus(p, budget.Limits{PerHour: 10, Total: 100}, t0), true
	})
	queue := api.QueueFrom(d)
	if len(queue.Queue) != 1 || queue.Queue[0].Fleet != "second" || !queue.Queue[0].Since.Equal(t0.Add(-time.Minute)) {
		t.Errorf("queue %+v", queue)
	}
	if a := projects.Projects[0]; a.Name != "a" || a.BorrowedGPUs != 0 || a.Budget == nil || a.Budget.SpentUSD != 5.5 || a.Budget.State != "ok" {
		t.Errorf("project a %+v %+v", a, a.Budget)
	}
	check := func(def string, v any) {
		t.Helper()
		val, err := schema.Compile(def)
		if err != nil {
			t.Fatal(err)
		}
		if err := val.ValidateValue(v); err != nil {
			t.Errorf("%s: %v", def, err)
		}
	}
	for _, p := range projects.Projects {
		check("Project", p)
	}
	for _, e := range queue.Queue {
		check("QueueEntry", e)
	}
	for _, a := range d.Fleets {
		pos := 0
		for _, e := range d.Queue {
			if e.Fleet == a.Fleet {
				pos = e.Position
			}
		}
		check("AllocationInfo", api.AllocationFrom(a, pos))
	}
	check("FleetSummary", api.FleetSummary{Name: "x", Generation: 1, MinNodes: 1, MaxNodes: 4, NodesByState: map[string]int{}, Providers: []string{}, CreatedAt: t0, UpdatedAt: t0,
		Allocation: api.AllocationFrom(d.Fleets[0], 0)})
}
