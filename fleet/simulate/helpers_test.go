package simulate

import (
	"encoding/json"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/providers/sim"
)

// traceDir is the bundled V100 trace (configs/traces, Apache-2.0).
var traceDir = filepath.Join("..", "..", "configs", "traces", "aws-v100-2023-02-15")

var (
	traceOnce sync.Once
	v100      *sim.Trace
	traceErr  error
)

func loadV100(t testing.TB) *sim.Trace {
	t.Helper()
	traceOnce.Do(func() { v100, traceErr = sim.Load(traceDir) })
	if traceErr != nil {
		t.Fatalf("load %s: %v", traceDir, traceErr)
	}
	return v100
}

// testFleet is the 1×V100 job of configs/examples/sim-v100.hcl.
func testFleet(t testing.TB, block map[string]any) *spec.Fleet {
	t.Helper()
	raw, err := json.Marshal(block)
	if err != nil {
		t.Fatal(err)
	}
	return &spec.Fleet{
		Name: "v100-job", MinNodes: 1, MaxNodes: 1,
		Node:       spec.Node{GPUs: 1, GPUTypes: []string{"V100"}, Spot: true},
		Placement:  spec.Placement{Strategy: spec.StrategyPriceCapacity, Colocate: spec.ColocateZone, Fallback: spec.FallbackDeadline},
		Providers:  []spec.Provider{{Name: sim.Name, Config: raw}},
		Training:   spec.Training{Command: []string{"train"}, NprocPerNode: 1, MasterPort: 29500, DrainGrace: 30 * time.Second},
		Rendezvous: spec.Rendezvous{LastCall: 5 * time.Second, Heartbeat: 2 * time.Second, DeadAfter: 10 * time.Second},
	}
}

func v100Block(zones []string) map[string]any {
	b := map[string]any{"trace": traceDir, "cloud": "aws", "instance_type": "p3.2xlarge", "gpu_type": "V100", "on_demand_price": 3.06}
	if zones != nil {
		b["zones"] = zones
	}
	return b
}

// v100Setup is the benchmark setting: 48 h of work, deadline in hours.
func v100Setup(t testing.TB, zones []string, deadlineH int) *Setup {
	t.Helper()
	s := &Setup{Trace: loadV100(t), Fleet: testFleet(t, v100Block(zones)), Seed: 1,
		Job: Job{Work: 48 * time.Hour, Deadline: time.Duration(deadlineH) * time.Hour}}
	if err := s.Prepare(); err != nil {
		t.Fatal(err)
	}
	return s
}
