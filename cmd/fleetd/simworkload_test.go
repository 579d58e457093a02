package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetd/fleetd/fleet/simulate/multijob"
)

// workloadJSON is the part of `fleetd sim -workload -json` the tests read.
type workloadJSON struct {
	Setting string `json:"setting"`
	Results []struct {
		Policy     string  `json:"policy"`
		AvgJCT     float64 `json:"avg_jct_seconds"`
		Cost       float64 `json:"cost"`
		Unfinished int     `json:"unfinished"`
	} `json:"results"`
}

// simWorkloadJSON runs the sim with args and -json, and decodes its report
// (returned with the output).
func simWorkloadJSON(t *testing.T, args []string) (workloadJSON, string) {
	t.Helper()
	out, errOut, code := runCmd(append(args, "-json")...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep workloadJSON
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v in %s", err, out)
	}
	return rep, out
}

// TestSimWorkload runs `fleetd sim -workload` on the hand-made
// applications of fleet/simulate/multijob and on a bad pool.
func TestSimWorkload(t *testing.T) {
	dir := filepath.Join("..", "..", "fleet", "simulate", "multijob", "testdata")
	args := []string{"sim", "-workload", filepath.Join(dir, "linflat.csv"), "-apps", filepath.Join(dir, "apps"), "-pool", "1x8"}
	rep, out := simWorkloadJSON(t, args)
	if len(rep.Results) != len(multijob.Policies) {
		t.Fatalf("%d policies, want %d: %s", len(rep.Results), len(multijob.Policies), out)
	}
	for _, r := range rep.Results {
		if r.Unfinished != 0 || r.AvgJCT <= 0 {
			t.Errorf("%s: %d unfinished, average JCT %v s", r.Policy, r.Unfinished, r.AvgJCT)
		}
	}
	charts := t.TempDir()
	out, _, code := runCmd(append(args, "-policies", "fifo", "-chart", charts)...)
	if code != exitOK || !strings.Contains(out, "fifo") || strings.Contains(out, "Pollux") {
		t.Fatalf("text report (exit %d):\n%s", code, out)
	}
	svg, err1 := os.ReadFile(filepath.Join(charts, "fifo.svg"))
	csv, err2 := os.ReadFile(filepath.Join(charts, "gpus.csv"))
	if err1 != nil || err2 != nil || !strings.Contains(string(svg), "<title>flat-0</title>") || !strings.Contains(string(csv), "fifo,linear-1,linear,") {
		t.Fatalf("-chart: %v %v\n%s\n%s", err1, err2, svg, csv)
	}
	if _, errOut, code := runCmd("sim", "-workload", filepath.Join(dir, "linflat.csv"), "-pool", "16"); code != exitUsage || !strings.Contains(errOut, "NODESxGPUS") {
		t.Fatalf("bad -pool: exit %d, %s", code, errOut)
	}
}

// TestSimWorkloadCloud runs the cloud setting on the hand-made trace:
// every policy and per-fleet report a cost; a bad setting is refused.
func TestSimWorkloadCloud(t *testing.T) {
	dir := filepath.Join("..", "..", "fleet", "simulate", "multijob", "testdata")
	args := []string{"sim", "-workload", filepath.Join(dir, "linflat.csv"), "-apps", filepath.Join(dir, "apps"), "-pool", "1x8",
		"-setting", "cloud", "-trace", filepath.Join(dir, "trace"), "-capacity-scale", "4", "-budget", "3"}
	rep, out := simWorkloadJSON(t, args)
	if rep.Setting != "cloud" || len(rep.Results) != len(multijob.CloudPolicies) || rep.Results[len(rep.Results)-1].Policy != "per-fleet" {
		t.Fatalf("setting %q, results %+v", rep.Setting, rep.Results)
	}
	for _, r := range rep.Results {
		if r.Unfinished != 0 || r.Cost <= 0 {
			t.Errorf("%s: %d unfinished, $%v", r.Policy, r.Unfinished, r.Cost)
		}
	}
	out, _, code := runCmd(append(args, "-policies", "per-fleet")...)
	if code != exitOK || !strings.Contains(out, "$/job") || !strings.Contains(out, "$3.00/h per project") {
		t.Fatalf("text report (exit %d):\n%s", code, out)
	}
	if _, errOut, code := runCmd("sim", "-workload", filepath.Join(dir, "linflat.csv"), "-apps", filepath.Join(dir, "apps"), "-setting", "moon"); code != exitUsage || !strings.Contains(errOut, "pool or cloud") {
		t.Fatalf("bad -setting: exit %d, %s", code, errOut)
	}
}
