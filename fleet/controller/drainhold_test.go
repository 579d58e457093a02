package controller

import (
	"strings"
	"testing"

	"github.com/fleetd/fleetd/fleet/allocator"
)

func TestDrainHolds(t *testing.T) {
	projects := []allocator.Project{{Name: "a", QuotaGPUs: 2, MaxGPUs: 4}, {Name: "b", QuotaGPUs: 2, MaxGPUs: 3}, {Name: "default", Unlimited: true}}
	run := func(fleet, project string, from, to int) allocator.Allocation {
		return allocator.Allocation{Fleet: fleet, Project: project, Action: allocator.Run, From: from, To: to}
	}
	for _, tc := range []struct {
		name  string
		pool  int
		dec   []allocator.Allocation
		occ   map[string]occupancy
		want  map[string]int // fleet → held at nodes
		inWhy map[string]string
	}{{
		name: "nothing draining: no hold",
		pool: 4,
		dec:  []allocator.Allocation{run("alpha", "a", 2, 2), run("bravo", "b", 0, 2)},
		occ:  map[string]occupancy{"alpha": {project: "a", gpusPerNode: 1, live: 2}, "bravo": {project: "b", gpusPerNode: 1}},
		want: map[string]int{},
	}, {
		name:  "a reclaimed borrower still drains two: the newcomer waits",
		pool:  4,
		dec:   []allocator.Allocation{run("alpha", "a", 2, 2), run("bravo", "b", 0, 2)},
		occ:   map[string]occupancy{"alpha": {project: "a", gpusPerNode: 1, live: 2, draining: 2}, "bravo": {project: "b", gpusPerNode: 1}},
		want:  map[string]int{"bravo": 0},
		inWhy: map[string]string{"bravo": "draining nodes of alpha are gone"},
	}, {
		name: "one of two drained: one node may start",
		pool: 4,
		dec:  []allocator.Allocation{run("alpha", "a", 2, 2), run("bravo", "b", 0, 2)},
		occ:  map[string]occupancy{"alpha": {project: "a", gpusPerNode: 1, live: 2, draining: 1}, "bravo": {project: "b", gpusPerNode: 1}},
		want: map[string]int{"bravo": 1},
	}, {
		name: "the shrinking fleet's nodes are still live: wait for its drain",
		pool: 4,
		dec:  []allocator.Allocation{run("alpha", "a", 4, 2), run("bravo", "b", 0, 2)},
		occ:  map[string]occupancy{"alpha": {project: "a", gpusPerNode: 1, live: 4}, "bravo": {project: "b", gpusPerNode: 1}},
		want: map[string]int{"bravo": 0},
	}, {
		name:  "the project's max_gpus binds before the pool's",
		pool:  16,
		dec:   []allocator.Allocation{run("b1", "b", 1, 1), run("b2", "b", 0, 2)},
		occ:   map[string]occupancy{"b1": {project: "b", gpusPerNode: 1, live: 1, draining: 1}, "b2": {project: "b", gpusPerNode: 1}},
		want:  map[string]int{"b2": 1},
		inWhy: map[string]string{"b2": "project b's max_gpus"},
	}, {
		name: "higher priority claims the freed GPUs first",
		pool: 4,
		dec:  []allocator.Allocation{run("low", "a", 1, 2), run("high", "b", 1, 2)},
		occ: map[string]occupancy{"low": {project: "a", gpusPerNode: 1, live: 1, draining: 1},
			"high": {project: "b", gpusPerNode: 1, live: 1, priority: 5}},
		want: map[string]int{"low": 1},
	}, {
		name: "an unlimited project is outside the pool",
		pool: 2,
		dec:  []allocator.Allocation{run("d", "default", 0, 4), run("alpha", "a", 2, 2)},
		occ:  map[string]occupancy{"d": {project: "default", gpusPerNode: 1}, "alpha": {project: "a", gpusPerNode: 1, live: 2, draining: 2}},
		want: map[string]int{},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := drainHolds(allocator.Decision{Fleets: tc.dec}, allocator.Input{PoolGPUs: tc.pool, Projects: projects}, tc.occ)
			if len(got) != len(tc.want) {
				t.Fatalf("holds %+v, want %v", got, tc.want)
			}
			for f, n := range tc.want {
				h, ok := got[f]
				if !ok || h.Nodes != n {
					t.Errorf("%s held at %+v, want %d nodes", f, h, n)
				}
				if w := tc.inWhy[f]; w != "" && !strings.Contains(h.Why, w) {
					t.Errorf("%s's hold says %q, want it to mention %q", f, h.Why, w)
				}
			}
		})
	}
}
