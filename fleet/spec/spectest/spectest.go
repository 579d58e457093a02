// Package spectest writes the fleet specs that tests and benchmarks apply:
// one 1-GPU (T4) fleet on the in-memory provider, with the few settings they
// vary; and, decoded, the 8-GPU fleet and offerings the placement and
// reconcile tests decide over. A leaf for test code anywhere (it imports only
// fleet/spec and providers), so the controller's tests, the daemon's and the
// benchmarks share one text.
package spectest

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/fleetd/fleetd/fleet/spec"
)

// Fleet is one fleet block; the zero value of an optional field leaves its
// line out.
type Fleet struct {
	Name     string
	Project  string
	Min, Max int
	Desired  int
	// Spot writes spot = true, the default, out.
	Spot bool
	// Command defaults to python3 train.py.
	Command    []string
	DrainGrace string
	// The rendezvous block holds the timers set here, and is left out when
	// none is.
	LastCall, Heartbeat, DeadAfter string
}

// HCL renders f in the layout `fleetd fmt` writes, starting with a blank
// line and ending with a newline, so that specs concatenate.
func (f Fleet) HCL() string {
	var b strings.Builder
	line := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	line("\nfleet %q {", f.Name)
	if f.Project != "" {
		line("project = %q", f.Project)
	}
	line("min_nodes = %d", f.Min)
	line("max_nodes = %d", f.Max)
	if f.Desired != 0 {
		line("desired_nodes = %d", f.Desired)
	}
	line("node {")
	line("gpus = 1")
	line(`gpu_types = ["T4"]`)
	if f.Spot {
		line("spot = true")
	}
	line("}")
	line("placement {")
	line(`colocate = "region"`)
	line("}")
	line(`provider "mem" {}`)
	line("training {")
	command := f.Command
	if command == nil {
		command = []string{"python3", "train.py"}
	}
	quoted := make([]string, len(command))
	for i, c := range command {
		quoted[i] = strconv.Quote(c)
	}
	line("command = [%s]", strings.Join(quoted, ", "))
	if f.DrainGrace != "" {
		line("drain_grace = %q", f.DrainGrace)
	}
	line("}")
	if f.LastCall != "" || f.Heartbeat != "" || f.DeadAfter != "" {
		line("rendezvous {")
		for _, kv := range [][2]string{{"last_call", f.LastCall}, {"heartbeat", f.Heartbeat}, {"dead_after", f.DeadAfter}} {
			if kv[1] != "" {
				line("%s = %q", kv[0], kv[1])
			}
		}
		line("}")
	}
	line("}")
	return string(spec.Format([]byte(b.String())))
}
