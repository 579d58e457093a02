package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetd/fleetd/fleet/simulate"
)

var (
	simSpec  = filepath.Join("..", "..", "configs", "examples", "sim-v100.hcl")
	simTrace = filepath.Join("..", "..", "configs", "traces", "aws-v100-2023-02-15")
)

func TestSimJSON(t *testing.T) {
	out, errOut, code := runCmd("sim", "-spec", simSpec, "-trace", simTrace, "-windows", "4", "-seed", "3",
		"-policies", "optimum,fleetd,on-demand", "-deadline", "52h", "-json")
	if code != exitOK {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
	var rep simulate.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(rep.Zones) != 9 || rep.Windows != 4 || rep.Job.Deadline.Hours() != 52 || rep.Job.Work.Hours() != 48 || rep.Job.Changeover.Minutes() != 12 {
		t.Fatalf("report header %+v", rep)
	}
	if len(rep.Policies) != 3 {
		t.Fatalf("%d policies", len(rep.Policies))
	}
	opt, fl, od := rep.Policies[0], rep.Policies[1], rep.Policies[2]
	if opt.Ratio != 1 || fl.Ratio < 1 || od.Ratio <= fl.Ratio || fl.Misses != 0 || fl.Windows != 4 {
		t.Errorf("summaries %+v", rep.Policies)
	}
	// On-demand only: 48 h of work and one changeover at $3.06/h.
	if od.MeanCost < 147.48 || od.MeanCost > 147.50 {
		t.Errorf("on-demand mean $%.4f, want $147.49", od.MeanCost)
	}
}

func TestSimText(t *testing.T) {
	out, errOut, code := runCmd("sim", "-spec", simSpec, "-trace", simTrace, "-start", "72h", "-policies", "optimum,fleetd",
		"-zones", "us-east-1c,us-east-2b,us-west-2a")
	if code != exitOK {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
	for _, want := range []string{"3 zones (us-east-1c, us-east-2b, us-west-2a)", "work 48h, deadline 60h", "1 windows", "optimum", "fleetd", "× optimum"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestSimWarm: -warm starts each window's fleet from the trace's own
// market history before the window, and the report says so.
func TestSimWarm(t *testing.T) {
	out, errOut, code := runCmd("sim", "-spec", simSpec, "-trace", simTrace, "-start", "300h", "-policies", "fleetd", "-warm")
	if code != exitOK {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
	if !strings.Contains(out, "market history warm from the trace before each window") {
		t.Errorf("output does not say the history was warm:\n%s", out)
	}
}

func TestSimUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"sim"}, "Usage: fleetd sim"},
		{[]string{"sim", "-spec", simSpec, "-trace", simTrace, "-policies", "clairvoyant"}, "unknown policy"},
		{[]string{"sim", "-spec", simSpec, "-trace", simTrace, "-deadline", "40h"}, "no policy can make it"},
		{[]string{"sim", "-spec", simSpec, "-trace", simTrace, "-zones", "mars-1a"}, "not in trace"},
		{[]string{"sim", "-spec", simSpec, "-trace", simTrace, "-start", "yesterday"}, "-start"},
	} {
		_, errOut, code := runCmd(tc.args...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 mentioning %q", tc.args, code, errOut, tc.want)
		}
	}
}
