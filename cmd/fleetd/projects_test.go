package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
)

// TestProjectsRender: fleetd projects, queue and the status allocation
// line show what the daemon decided and why.
func TestProjectsRender(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		render func(*bytes.Buffer)
		want   []string
	}{
		{"projects", func(b *bytes.Buffer) {
			printProjects(b, api.ProjectsResponse{PoolGPUs: 4, UsedGPUs: 4, Projects: []api.Project{
				{Name: "a", QuotaGPUs: 2, MaxGPUs: 4, UsedGPUs: 2, Fleets: []string{"alpha"}},
				{Name: "b", QuotaGPUs: 2, MaxGPUs: 2, UsedGPUs: 2, Queued: 1, Fleets: []string{"bravo", "charlie"},
					Budget: &api.BudgetInfo{State: "warn", SpentUSD: 41.5, TotalLimit: 50, PerHourLimit: 6}},
				{Name: "default", Unlimited: true},
			}})
		}, []string{"Pool: 4 of 4 GPUs allocated", "bravo,charlie", "$41.50", "$50.00 $6.00/h", "warn", "default  -      -"}},
		{"queue", func(b *bytes.Buffer) {
			printQueue(b, api.QueueResponse{Queue: []api.QueueEntry{{Fleet: "charlie", Project: "b", Position: 1, Since: now.Add(-90 * time.Second), Reason: "project b's quota is in use"}}}, now)
		}, []string{"charlie", "1m30s", "project b's quota is in use"}},
		{"empty queue", func(b *bytes.Buffer) { printQueue(b, api.QueueResponse{}, now) }, []string{"No fleet is waiting."}},
		{"status", func(b *bytes.Buffer) {
			printFleets(b, []api.FleetSummary{
				{Name: "alpha", Allocation: &api.AllocationInfo{Action: "run", Target: 2, Kind: "reclaim", Reason: "a/alpha 4→2: b needs its quota"}},
				{Name: "charlie", Allocation: &api.AllocationInfo{Action: "queue", Kind: "queued", QueuePosition: 1, Reason: "waits for b's quota"}},
			})
		}, []string{"alpha: run 2 nodes (reclaim): a/alpha 4→2: b needs its quota", "charlie: queued #1 (queued): waits for b's quota"}},
		{"stopped", func(b *bytes.Buffer) {
			printFleets(b, []api.FleetSummary{{Name: "echo", Completed: true, CompletedDetail: "stopped: default/echo stops (on_exhausted = \"stop\")"}})
			printFleetDetail(b, api.FleetDetail{FleetSummary: api.FleetSummary{Name: "echo", Completed: true, CompletedDetail: "stopped: its budget is spent"}}, now)
		}, []string{"echo (stopped)", "Fleet:          echo (generation 0, stopped;", "Outcome:        stopped: its budget is spent\n"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			tt.render(&b)
			for _, w := range tt.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, b.String())
				}
			}
		})
	}
}
