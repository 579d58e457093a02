package main

import (
	"strings"
	"testing"
)

func TestParseReconcileStats(t *testing.T) {
	const exposition = `# HELP fleetd_reconcile_duration_seconds Duration of one reconcile pass.
# TYPE fleetd_reconcile_duration_seconds histogram
fleetd_reconcile_duration_seconds_bucket{fleet="big",le="0.025"} 1
fleetd_reconcile_duration_seconds_bucket{fleet="big",le="0.05"} 3
fleetd_reconcile_duration_seconds_bucket{fleet="big",le="+Inf"} 7
fleetd_reconcile_duration_seconds_sum{fleet="big"} 1.75
fleetd_reconcile_duration_seconds_count{fleet="big"} 7
fleetd_reconcile_duration_seconds_bucket{fleet="other",le="0.05"} 99
fleetd_reconcile_duration_seconds_count{fleet="other"} 100
fleetd_provider_calls_total{op="list",provider="mem"} 12
`
	tests := []struct {
		fleet   string
		want    reconcileStats
		wantErr bool
	}{
		{"big", reconcileStats{Count: 7, UnderLE: 3, Sum: 1.75}, false},
		{"other", reconcileStats{Count: 100, UnderLE: 99}, false},
		{"missing", reconcileStats{}, true},
	}
	for _, tt := range tests {
		got, err := parseReconcileStats(strings.NewReader(exposition), tt.fleet, "0.05")
		if (err != nil) != tt.wantErr || (!tt.wantErr && got != tt.want) {
			t.Errorf("fleet %s: got %+v, %v; want %+v, err %v", tt.fleet, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestAgentAddrDistinct(t *testing.T) {
	seen := map[string]int{}
	for i := range 20000 {
		a := agentAddr(i)
		if j, dup := seen[a]; dup {
			t.Fatalf("agentAddr(%d) = agentAddr(%d) = %s", i, j, a)
		}
		seen[a] = i
	}
}
