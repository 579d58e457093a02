package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/bench/internal/driver"
	"github.com/fleetd/fleetd/bench/internal/report"
)

// TestFiguresMissWhatDidNotRecover: a scenario that did not recover, or
// recovered only past its bound, is a miss for every system, so the
// program exits non-zero and `make bench` fails.
func TestFiguresMissWhatDidNotRecover(t *testing.T) {
	cfg := config{Config: driver.Config{Lead: 30 * time.Second, ScenarioTimeout: 4 * time.Minute}}
	ok := func(s float64) result { return result{Outcome: Outcome{TrainAgain: s}} }
	noticed := result{Outcome: Outcome{TrainAgain: 75}, fromDeath: 45} // a node that died 30 s after the notice
	for _, tc := range []struct {
		name     string
		sysName  string
		res      map[string]result
		wantMiss int
		want     string
	}{
		{"torchrun's notice is timed from the node's death", "torchrun", map[string]result{driver.ScenKill: ok(40), driver.ScenAdd: ok(20), driver.ScenNotice: noticed, driver.ScenKillSilent: ok(50)}, 0,
			"FIGURE elastic.100MiB.notice.torchrun.train_again = 45 s (target <= 270 s) PASS\nFIGURE elastic.100MiB.notice.torchrun.train_again_from_notice = 75 s (info)"},
		{"so is torchrun's at its defaults", "torchrun-defaults", map[string]result{driver.ScenKill: ok(40), driver.ScenAdd: ok(20), driver.ScenNotice: noticed, driver.ScenKillSilent: ok(50)}, 0,
			"FIGURE elastic.100MiB.notice.torchrun_defaults.train_again = 45 s (target <= 270 s) PASS"},
		{"torchrun never recovers from a kill", "torchrun", map[string]result{driver.ScenKill: {missing: "[a b] not training again within 4m0s"}, driver.ScenAdd: ok(20), driver.ScenNotice: noticed, driver.ScenKillSilent: ok(50)}, 1,
			"FIGURE elastic.100MiB.kill.torchrun.train_again = n/a s (target <= 240 s) FAIL MISSING: [a b] not training again within 4m0s"},
		{"a scenario never reached", "restart", map[string]result{driver.ScenNotice: ok(2)}, 3,
			"FIGURE elastic.100MiB.kill.restart.train_again = n/a s (target <= 240 s) FAIL MISSING: scenario not reached"},
		{"recovered past the bound", "restart", map[string]result{driver.ScenKill: ok(241), driver.ScenAdd: ok(3), driver.ScenNotice: ok(2), driver.ScenKillSilent: ok(20)}, 1,
			"FIGURE elastic.100MiB.kill.restart.train_again = 241 s (target <= 240 s) FAIL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(report.ForceMissEnv, "")
			var buf bytes.Buffer
			r := report.New(&buf)
			figures(r, cfg, "100MiB", map[string]map[string]result{tc.sysName: tc.res})
			if n := r.Summary("elastic"); n != tc.wantMiss {
				t.Errorf("%d misses, want %d", n, tc.wantMiss)
			}
			if !strings.Contains(buf.String(), tc.want) {
				t.Errorf("lacks %q:\n%s", tc.want, buf.String())
			}
		})
	}
}
