package simulate

import (
	"context"
	"math"
	"testing"
	"time"
)

// The shapes reproduce the measurements they cite.
func TestShapesMatchTheirSources(t *testing.T) {
	near, _ := ShapeByName("near-linear")
	comm, _ := ShapeByName("comm-bound")
	knee, _ := ShapeByName("knee-4")
	for _, c := range []struct {
		what      string
		got, want float64
	}{
		{"near-linear: MosaicML's 3.9× on 4 nodes", near.Speedup(4), 3.9},
		{"near-linear: MosaicML's 14.4× on 16 nodes", near.Speedup(16), 14.4},
		{"comm-bound: Zhang et al.'s 60% on 8 servers", comm.Efficiency(8), 0.60},
		{"knee-4: nothing past 4 nodes", knee.Speedup(8), knee.Speedup(4)},
		{"linear (zero shape)", Shape{}.Speedup(8), 8},
	} {
		if math.Abs(c.got-c.want)/c.want > 0.01 {
			t.Errorf("%s: %.3f, want %.3f", c.what, c.got, c.want)
		}
	}
	if _, err := ShapeByName("nope"); err == nil {
		t.Error("an unknown shape was found")
	}
	// The zero shape keeps the simulator's old job model: n / max_nodes.
	if r := (Shape{}).rate(3, 4); r != 0.75 {
		t.Errorf("linear rate at 3 of 4 nodes: %g", r)
	}
}

// gangSetup is an 8-node fleet on the V100 trace, each zone's probe a pool
// of 8 (capacity_scale): 48 h of work, deadline 96 h.
func gangSetup(t testing.TB, shape Shape, windows int) *Setup {
	t.Helper()
	b := v100Block(nil)
	b["capacity_scale"] = 8
	fl := testFleet(t, b)
	fl.Name, fl.MinNodes, fl.MaxNodes = "v100-gang", 1, 8
	pols, err := SelectPolicies([]string{"fleetd", "goodput"})
	if err != nil {
		t.Fatal(err)
	}
	s := &Setup{Trace: loadV100(t), Fleet: fl, Seed: 1, Windows: windows, Shape: shape, Policies: pols,
		Job: Job{Work: 48 * time.Hour, Deadline: 96 * time.Hour}}
	if err := s.Prepare(); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestGoodputAgainstMaxNodes: on a job whose throughput stops growing
// past 4 nodes the autoscaler roughly halves the cost per unit of
// progress and still meets every deadline; on a near-linear job it stays
// close to max_nodes (exploration costs little).
func TestGoodputAgainstMaxNodes(t *testing.T) {
	knee, _ := ShapeByName("knee-4")
	near, _ := ShapeByName("near-linear")
	rows, err := CompareShapes(context.Background(), gangSetup(t, knee, 8), []Shape{knee, near})
	if err != nil {
		t.Fatal(err)
	}
	by := map[[2]string]ScalingRow{}
	for _, r := range rows {
		by[[2]string{r.Shape, r.Policy}] = r
	}
	kg, km := by[[2]string{"knee-4", "goodput"}], by[[2]string{"knee-4", "fleetd"}]
	if kg.Windows != 8 || km.Windows != 8 {
		t.Fatalf("rows %+v", rows)
	}
	if kg.Misses != 0 || kg.CostPerWorkHour > 0.6*km.CostPerWorkHour || kg.MeanNodes > 5 || kg.MeanHours > 1.1*km.MeanHours {
		t.Errorf("knee-4: goodput %+v vs max_nodes %+v: want ≤ 60%% of the cost per unit of progress at ~4 nodes, as fast, no miss", kg, km)
	}
	ng, nm := by[[2]string{"near-linear", "goodput"}], by[[2]string{"near-linear", "fleetd"}]
	if ng.Misses != 0 || ng.CostPerWorkHour > 1.05*nm.CostPerWorkHour || ng.MeanNodes < 7 || ng.SizeChanges > 4 {
		t.Errorf("near-linear: goodput %+v vs max_nodes %+v: want about max_nodes' cost and size, few changes", ng, nm)
	}
	if km.SizeChanges != 0 {
		t.Errorf("the fixed policy changed size: %+v", km)
	}
}
