package spectest

import (
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/providertest"
)

// Every variant is a valid spec whose fields read back, and already in
// `fleetd fmt` layout (tests edit it by replacing exact lines).
func TestFleetHCL(t *testing.T) {
	tests := []struct {
		name string
		f    Fleet
	}{
		{"plain", Fleet{Name: "train", Min: 2, Max: 3}},
		{"everything", Fleet{Name: "a", Project: "p", Min: 1, Max: 4, Desired: 2, Spot: true, Command: []string{"sh", "-c", `echo "hi"`},
			DrainGrace: "1s", LastCall: "200ms", Heartbeat: "20s", DeadAfter: "60s"}},
		{"one timer", Fleet{Name: "b", Min: 1, Max: 1, DeadAfter: "90s"}},
	}
	opts := spec.Options{Schema: func(name string) (providers.ConfigSchema, bool) {
		return providertest.MemSchema, name == providertest.MemName
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := tt.f.HCL()
			if got := string(spec.Format([]byte(src))); got != src {
				t.Errorf("not in fmt layout:\n%s\nformatted:\n%s", src, got)
			}
			file, diags := spec.Parse(tt.name+".hcl", []byte(src), opts)
			if diags.HasErrors() || len(file.Fleets) != 1 {
				t.Fatalf("%v\n%s", diags, src)
			}
			fl := file.Fleets[0]
			if fl.Name != tt.f.Name || fl.Project != tt.f.Project || fl.MinNodes != tt.f.Min || fl.MaxNodes != tt.f.Max ||
				fl.DesiredNodes != tt.f.Desired || fl.Node.GPUs != 1 || !fl.Node.Spot {
				t.Errorf("fleet = %+v\n%s", fl, src)
			}
			cmd := tt.f.Command
			if cmd == nil {
				cmd = []string{"python3", "train.py"}
			}
			if len(fl.Training.Command) != len(cmd) || fl.Training.Command[len(cmd)-1] != cmd[len(cmd)-1] {
				t.Errorf("command = %q, want %q", fl.Training.Command, cmd)
			}
			if tt.f.DeadAfter != "" {
				if d, _ := time.ParseDuration(tt.f.DeadAfter); fl.Rendezvous.DeadAfter != d {
					t.Errorf("dead_after = %v, want %s", fl.Rendezvous.DeadAfter, tt.f.DeadAfter)
				}
			}
		})
	}
}
