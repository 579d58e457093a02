package simulate

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestCheckpointEgressChangesDecisions runs the fleetd policy on the V100
// trace with a 200 GB checkpoint kept in us-west-2, once with the egress
// priced by placement and once hidden from it (charged all the same):
// pricing it changes where the job restarts — fewer restores from
// another region — and the runs cost less in all.
func TestCheckpointEgressChangesDecisions(t *testing.T) {
	run := func(noEgress bool) ([]Result, Report) {
		block := v100Block(nil)
		block["checkpoint_gb"], block["checkpoint_region"] = 200, "us-west-2"
		pol, err := SelectPolicies([]string{"fleetd"})
		if err != nil {
			t.Fatal(err)
		}
		s := &Setup{Trace: loadV100(t), Fleet: testFleet(t, block), Seed: 1, Windows: 40, Policies: pol, NoEgress: noEgress,
			Job: Job{Work: 48 * time.Hour, Deadline: 60 * time.Hour}}
		if err := s.Prepare(); err != nil {
			t.Fatal(err)
		}
		if s.Job.CheckpointBytes != 200e9 || s.Job.restoreTime() != 953674316406*time.Nanosecond {
			t.Fatalf("job %+v, restore %s", s.Job, s.Job.restoreTime())
		}
		res, err := s.Run(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		rep := Report{Job: s.Job, NoEgress: noEgress, Policies: Summarize(s.Policies, 9, res)}
		return res, rep
	}
	priced, pr := run(false)
	blind, br := run(true)
	changed := 0
	var cost, costBlind, egress, egressBlind float64
	var cross, crossBlind int
	for i := range priced {
		p, b := priced[i], blind[i]
		if p.Window != b.Window {
			t.Fatalf("windows out of order")
		}
		if p.CrossRegionRestores != b.CrossRegionRestores || p.Migrations != b.Migrations {
			changed++
		}
		cost, costBlind = cost+p.Cost, costBlind+b.Cost
		egress, egressBlind = egress+p.EgressCost, egressBlind+b.EgressCost
		cross, crossBlind = cross+p.CrossRegionRestores, crossBlind+b.CrossRegionRestores
		// Every cross-region restore is charged 200 GB × $0.02.
		if want := float64(p.CrossRegionRestores) * 200 * 0.02; p.EgressCost < want-1e-9 || p.EgressCost > want+1e-9 {
			t.Fatalf("window %d: egress $%.2f for %d cross-region restores", p.Window, p.EgressCost, p.CrossRegionRestores)
		}
	}
	t.Logf("40 windows: egress priced: $%.2f (egress $%.2f, %d cross-region restores); hidden: $%.2f (egress $%.2f, %d); %d windows decided differently",
		cost, egress, cross, costBlind, egressBlind, crossBlind, changed)
	if changed == 0 || cross >= crossBlind || egress >= egressBlind || cost >= costBlind {
		t.Fatalf("pricing the egress changed nothing useful: %d windows differ, %d vs %d cross-region restores, $%.2f vs $%.2f", changed, cross, crossBlind, cost, costBlind)
	}
	var b bytes.Buffer
	if err := pr.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if err := br.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"checkpoint 200 GB in us-west-2", "priced by placement", "hidden from placement (-no-egress) but charged", "cross-region restores"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
}
