package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files under testdata/")

func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *updateGolden {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (run with -update after checking):\n--- got\n%s\n--- want\n%s", name, got, want)
	}
}

func renderFixture() (api.Status, api.FleetDetail, time.Time) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	hb := now.Add(-1200 * time.Millisecond)
	lost := int64(12)
	loss, reported, eta := 0.231, now.Add(-800*time.Millisecond), now.Add(59*time.Second)
	sum := api.FleetSummary{Name: "bert", Generation: 3, MinNodes: 2, MaxNodes: 4, TargetNodes: 3,
		NodesByState: map[string]int{"running": 2, "booting": 1, "draining": 1, "terminated": 2},
		CostPerHour:  4.2, SpendUSD: 12.5, OnDemandEquivalentUSD: 40, SavingsUSD: 27.5, OnDemandCostPerHour: 13.1,
		Interruptions: 2, AlertCount: 1, Providers: []string{"aws", "gcp"},
		PriceSources: []string{"DescribeSpotPriceHistory", "AWS Price List API"}, PricesAsOf: now.Add(-95 * time.Minute),
		Rendezvous: &api.RendezvousInfo{Round: 7, State: "closed", Nodes: 2, WorldSize: 16, Master: "10.0.0.4:29500"},
		CreatedAt:  now.Add(-3 * time.Hour), UpdatedAt: now.Add(-time.Hour),
		Scaling: &api.ScalingInfo{Policy: "goodput", Target: 3, Reason: "goodput",
			Explain: "3 nodes: 4.1k samples/s at $6.30/h; 4 would add 6% throughput for 33% more cost"},
		Training: &api.TrainingInfo{Source: "reports", Round: 7, Nodes: 2, WorldSize: 16, Step: 1200, Samples: 76800, Loss: &loss, TotalSteps: 5000,
			SamplesPerSecond: 4100, StepsPerSecond: 64.06, ReportedAt: &reported, ETA: &eta, ETASeconds: 59}}
	done := api.FleetSummary{Name: "tiny", Generation: 1, MinNodes: 1, MaxNodes: 1, NodesByState: map[string]int{"terminated": 1},
		Completed: true, Succeeded: true, Providers: []string{"local"}, CreatedAt: now.Add(-time.Hour), UpdatedAt: now,
		Training: &api.TrainingInfo{Source: "round-timing", WorkDoneSeconds: 600}}
	st := api.Status{APIVersion: "v1", Version: "1.2.3", DaemonID: "d-abc", StartedAt: now.Add(-26 * time.Hour), Time: now, Fleets: []api.FleetSummary{sum, done}}
	det := api.FleetDetail{FleetSummary: sum, Filename: "bert.hcl",
		Nodes: []api.NodeInfo{
			{ID: "bert-1-2", State: "running", Provider: "aws", Region: "us-east-1", Zone: "us-east-1a", InstanceType: "p4d.24xlarge", CapacityType: "spot", PricePerHour: 2.1, InstanceID: "i-2", Address: "10.0.0.5", Round: 7, AgeSeconds: 7200, LastHeartbeat: &hb, Reason: "member of a closed rendezvous round",
				Network: "efa ×4, placement group fleetd-bert-k3x9-us-east-1a", Workers: "running efa×4+pg"},
			{ID: "bert-1-1", State: "running", Provider: "aws", Region: "us-east-1", Zone: "us-east-1a", InstanceType: "p4d.24xlarge", CapacityType: "spot", PricePerHour: 2.1, InstanceID: "i-1", Address: "10.0.0.4", Round: 7, AgeSeconds: 10800, LastHeartbeat: &hb,
				Network: "efa ×4, placement group fleetd-bert-k3x9-us-east-1a", Workers: "running tcp!efa"},
			{ID: "bert-2-9", State: "running", Provider: "aws", Region: "us-east-1", Zone: "us-east-1a", InstanceType: "p4d.24xlarge", CapacityType: "spot", PricePerHour: 2.1, InstanceID: "i-9", Address: "10.0.0.9", AgeSeconds: 30, LastHeartbeat: &hb, RendezvousState: "standby"},
			{ID: "bert-3-1", State: "booting", Provider: "gcp", Region: "us-central1", Zone: "us-central1-a", InstanceType: "a2-highgpu-8g", CapacityType: "spot", PricePerHour: 3.9, InstanceID: "gce-9", AgeSeconds: 40, Reason: "instance gce-9 launched"},
		},
		Recoveries: []api.RecoveryInfo{
			{Kind: "round-reformed", DurationSeconds: 0.02, At: now.Add(-51 * time.Second)},
			{Kind: "training-resumed", DurationSeconds: 2.41, At: now.Add(-50 * time.Second), LostSteps: &lost},
			{Kind: "replacement-joined", Node: "bert-3-1", DurationSeconds: 95.2, At: now.Add(-10 * time.Second)},
		},
		Alerts: []api.AlertInfo{{Kind: "quota", Subject: "aws/us-west-2/us-west-2b/p5.48xlarge/spot", Message: "GPU quota exceeded; backing off 30m"}},
		RecentInterruptions: []api.InterruptionInfo{
			{Node: "bert-2-1", Kind: "spot-interruption", Source: "agent/imds", At: now.Add(-52 * time.Second), Seq: 88},
		},
	}
	return st, det, now
}

func TestStatusRendering(t *testing.T) {
	st, det, now := renderFixture()
	var b bytes.Buffer
	printStatus(&b, st)
	checkGolden(t, "status.golden", b.Bytes())
	b.Reset()
	printFleetDetail(&b, det, now)
	checkGolden(t, "status_fleet.golden", b.Bytes())
	b.Reset()
	for _, f := range st.Fleets {
		b.WriteString(progressLine(f) + "\n")
	}
	checkGolden(t, "apply_progress.golden", b.Bytes())
}
