package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/bench/internal/driver"
	"github.com/fleetd/fleetd/bench/internal/report"
)

func TestFigures(t *testing.T) {
	cfg := config{Config: driver.Config{ScenarioTimeout: 3 * time.Minute}}
	ok := func(s float64) result {
		return result{rec: Recovery{Duration: time.Duration(s * float64(time.Second))}, extra: map[string]float64{}}
	}
	shifted := ok(2)
	shifted.fromEarlier(6*time.Second, "from_rendezvous_join")
	for _, tc := range []struct {
		name     string
		sc       string
		runs     map[string]map[string]result
		wantMiss int
		want     []string
	}{
		{"the headline ratio is over torchrun at fleetd's timeouts", driver.ScenKill, map[string]map[string]result{
			sysTorchrun: {driver.ScenKill: ok(12)}, sysTorchrunDefaults: {driver.ScenKill: ok(40)}, sysFleetd: {driver.ScenKill: ok(2)}}, 0, []string{
			"FIGURE recovery.kill.torchrun = 12 s (target <= 180 s) PASS",
			"FIGURE recovery.kill.torchrun_defaults = 40 s (target <= 180 s) PASS",
			"FIGURE recovery.kill.fleetd = 2 s (target <= 10 s) PASS",
			"FIGURE recovery.kill.ratio_torchrun_over_fleetd = 6 x (target >= 4 x) PASS",
			"FIGURE recovery.kill.ratio_torchrun_defaults_over_fleetd = 20 x (info)"}},
		{"a fair ratio under 4 misses", driver.ScenKill, map[string]map[string]result{
			sysTorchrun: {driver.ScenKill: ok(6)}, sysFleetd: {driver.ScenKill: ok(2)}}, 1, []string{
			"FIGURE recovery.kill.ratio_torchrun_over_fleetd = 3 x (target >= 4 x) FAIL"}},
		{"torchrun that never recovers is a miss, not a missing row", driver.ScenKillSilent, map[string]map[string]result{
			sysTorchrun: {driver.ScenKillSilent: {missing: "[A C] not training again within 3m0s"}}, sysFleetd: {driver.ScenKillSilent: ok(12)}}, 2, []string{
			"FIGURE recovery.kill_silent.torchrun = n/a s (target <= 180 s) FAIL MISSING: [A C] not training again within 3m0s",
			"FIGURE recovery.kill_silent.fleetd = 12 s (target <= 180 s) PASS",
			"FIGURE recovery.kill_silent.ratio_torchrun_over_fleetd = n/a x (info) FAIL MISSING: a side has no figure"}},
		{"node added: timed from the agent's start", driver.ScenAdd, map[string]map[string]result{sysFleetd: {driver.ScenAdd: shifted}}, 1, []string{
			"FIGURE recovery.add.fleetd = 8 s (target <= 5 s) FAIL", // the earlier event counts against fleetd
			"FIGURE recovery.add.fleetd_from_rendezvous_join = 2 s (info)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(report.ForceMissEnv, "")
			var buf bytes.Buffer
			r := report.New(&buf)
			figures(r, cfg, tc.sc, tc.runs)
			miss := r.Summary("recovery")
			if miss != tc.wantMiss {
				t.Errorf("%d misses, want %d", miss, tc.wantMiss)
			}
			for _, w := range tc.want {
				if !strings.Contains(buf.String(), w) {
					t.Errorf("lacks %q:\n%s", w, buf.String())
				}
			}
		})
	}
}
