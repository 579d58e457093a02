package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetd/fleetd/fleet/simulate/multijob"
)

// TestSimWorkload runs `fleetd sim -workload` on the hand-made
// applications of fleet/simulate/multijob and on a bad pool.
func TestSimWorkload(t *testing.T) {
	dir := filepath.Join("..", "..", "fleet", "simulate", "multijob", "testdata")
	args := []string{"sim", "-workload", filepath.Join(dir, "linflat.csv"), "-apps", filepath.Join(dir, "apps"), "-pool", "1x8"}
	out, errOut, code := runCmd(append(args, "-json")...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep struct {
		Results []struct {
			Policy     string  `json:"policy"`
			AvgJCT     float64 `json:"avg_jct_seconds"`
			Unfinished int     `json:"unfinished"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v in %s", err, out)
	}
	if len(rep.Results) != len(multijob.Policies) {
		t.Fatalf("%d policies, want %d: %s", len(rep.Results), len(multijob.Policies), out)
	}
	for _, r := range rep.Results {
		if r.Unfinished != 0 || r.AvgJCT <= 0 {
			t.Errorf("%s: %d unfinished, average JCT %v s", r.Policy, r.Unfinished, r.AvgJCT)
		}
	}
	out, _, code = runCmd(append(args, "-policies", "fifo")...)
	if code != exitOK || !strings.Contains(out, "fifo") || strings.Contains(out, "Pollux") {
		t.Fatalf("text report (exit %d):\n%s", code, out)
	}
	if _, errOut, code := runCmd("sim", "-workload", filepath.Join(dir, "linflat.csv"), "-pool", "16"); code != exitUsage || !strings.Contains(errOut, "NODESxGPUS") {
		t.Fatalf("bad -pool: exit %d, %s", code, errOut)
	}
}
