package simulate

import (
	"context"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/spec"
)

// TestDataCostInSim runs the fleetd policy on the bundled V100 trace with
// a 1 TB dataset streamed from us-east-1 (one epoch a day) and without
// one: with data the runs pay for reading it from wherever they ran, and
// placement, pricing it, keeps the job nearer the data.
func TestDataCostInSim(t *testing.T) {
	run := func(data bool) []Result {
		block := v100Block(nil)
		block["checkpoint_gb"], block["checkpoint_region"] = 1, "us-east-1"
		pol, err := SelectPolicies([]string{"fleetd"})
		if err != nil {
			t.Fatal(err)
		}
		fl := testFleet(t, block)
		if data {
			fl.Training.Data = []spec.Data{{Source: "s3://corpus/tokens", MountPath: "/data", Mode: spec.DataStream, SizeGB: 1000,
				EpochTime: 24 * time.Hour, Region: "us-east-1"}}
		}
		s := &Setup{Trace: loadV100(t), Fleet: fl, Seed: 1, Windows: 20, Policies: pol, Job: Job{Work: 48 * time.Hour, Deadline: 60 * time.Hour}}
		if err := s.Prepare(); err != nil {
			t.Fatal(err)
		}
		res, err := s.Run(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	with, without := run(true), run(false)
	var cost, costNone, data float64
	for i := range with {
		if without[i].DataCost != 0 {
			t.Fatalf("window %d charged $%.2f of data without a dataset", i, without[i].DataCost)
		}
		cost, costNone, data = cost+with[i].Cost, costNone+without[i].Cost, data+with[i].DataCost
	}
	t.Logf("20 windows on the V100 trace: 1 TB streamed from us-east-1: $%.2f in all, of which $%.2f data; no dataset: $%.2f", cost, data, costNone)
	if data <= 0 || cost <= costNone-1e-9 {
		t.Fatalf("data cost $%.2f, total $%.2f vs $%.2f without data", data, cost, costNone)
	}
}
