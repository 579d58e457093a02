package fleet

import (
	"context"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/budget"
)

// TestCheckpointRestoreEgressCharged: a node's report of a checkpoint
// restore charges its egress (bytes × the store's cloud → the node's
// price) to the fleet's and its project's budget, once even when the
// report is resent, and the charge survives a restart.
func TestCheckpointRestoreEgressCharged(t *testing.T) {
	cfg, _, diags := ParseConfig("daemon.hcl", []byte(`
project "a" {
  quota_gpus = 4
  budget {
    total = 100
  }
}
`))
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	dir := t.TempDir()
	td := projectsDaemonAt(t, dir, cfg)
	ctx := context.Background()
	src := strings.Replace(projectSpec("e", "a", 1, 1), `command     = ["python3", "train.py"]`, `command     = ["python3", "train.py"]
    checkpoint {
      dir   = "ckpt"
      store = "s3://ckpt/runs/e?region=us-east-1"
    }`, 1)
	if !strings.Contains(src, "checkpoint {") {
		t.Fatal("projectSpec changed: no training command to add the checkpoint block after")
	}
	if _, err := td.client.Apply(ctx, api.ApplyRequest{Filename: "e.hcl", Source: src, SkipCheck: true}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a node", 10*time.Second, func() bool { return len(td.nodes(t, "e")) > 0 })
	node := td.nodes(t, "e")[0].ID

	// 2 GB from S3 in us-east-1 to the mem provider's node: internet
	// egress out of AWS, $0.09/GB in the default table.
	const want = 2 * 0.09
	at := time.Now().UTC()
	report := api.CheckpointReport{Status: api.CheckpointNodeStatus{Dir: "/r/ckpt", RestoredStep: 7, LocalStep: 7},
		Events: []api.CheckpointEvent{{Kind: "restored", Step: 7, Bytes: 2e9, MiBps: 200, Seconds: 9.5, At: at}}}
	for range 2 { // the second is the same report resent
		if code := td.nodePost(t, "e", node, "checkpoint/report", report, nil); code != http.StatusOK {
			t.Fatalf("report: HTTP %d", code)
		}
	}
	egress := func(kind, name string) float64 {
		return td.ctrl.BudgetStatus(kind, name, budget.Limits{Total: 100}).Spent.Egress
	}
	if got := egress("fleet", "e"); math.Abs(got-want) > 1e-9 {
		t.Errorf("fleet egress $%g, want $%g", got, want)
	}
	if got := egress("project", "a"); math.Abs(got-want) > 1e-9 {
		t.Errorf("project egress $%g, want $%g", got, want)
	}
	evs, err := td.client.Events(ctx, 0, 1000, 0)
	if err != nil {
		t.Fatal(err)
	}
	charged := 0
	for _, e := range evs.Events {
		if e.Type == "checkpoint.egress" {
			charged++
			if !strings.Contains(e.Message, "aws:us-east-1") || !strings.Contains(e.Message, "$0.1800") {
				t.Errorf("egress event %q", e.Message)
			}
		}
	}
	if charged != 1 {
		t.Errorf("%d checkpoint.egress events, want 1 (the resent report is not charged again)", charged)
	}

	// Spend survives a restart: the ledger was saved with the charge.
	td.stop()
	td = projectsDaemonAt(t, dir, cfg)
	var pr api.ProjectsResponse
	waitFor(t, "project a's budget with the egress", 10*time.Second, func() bool {
		if err := td.client.Do(ctx, http.MethodGet, "/v1/projects", nil, nil, &pr); err != nil {
			t.Fatal(err)
		}
		for _, p := range pr.Projects {
			if p.Name == "a" && p.Budget != nil && math.Abs(p.Budget.EgressUSD-want) < 1e-9 {
				return true
			}
		}
		return false
	})
}
