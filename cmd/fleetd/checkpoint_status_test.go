package main

import (
	"bytes"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
)

func TestCheckpointStatusRendering(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	c := &api.CheckpointStatus{Dir: "/mnt/ckpt", Store: "s3://bucket/runs/bert", Keep: 3, Access: "signed",
		LastStep: 1200, LastAt: now.Add(-95 * time.Second), Bytes: 2 << 30, UploadMiBps: 412.3, RestoreMiBps: 388.1,
		Uploading:   &api.CheckpointTransfer{Node: "bert-1-1", Step: 1250, DoneBytes: 1 << 30, TotalBytes: 2 << 30},
		LastRestore: &api.CheckpointRestore{Node: "bert-3-1", Step: 1200, MiBps: 388.1, At: now.Add(-40 * time.Second)},
		Error:       "write s3://bucket/runs/bert data/step-1250/model.pt: access denied: HTTP 403 AccessDenied", ErrorKind: "denied",
		ErrorNode: "bert-1-2", ErrorAt: now.Add(-5 * time.Second)}
	render := func(c *api.CheckpointStatus) string {
		var b bytes.Buffer
		tw := tabwriter.NewWriter(&b, 0, 2, 2, ' ', 0)
		printCheckpoint(tw, c, now)
		tw.Flush()
		return b.String()
	}
	checkGolden(t, "status_checkpoint.golden", []byte(render(c)))
	if got := render(&api.CheckpointStatus{Dir: "ckpt", Keep: 2, LastStep: -1}); !strings.Contains(got, "ckpt, keep 2: kept on the nodes only") {
		t.Errorf("local-only checkpoints rendered as:\n%s", got)
	}
	if got := render(&api.CheckpointStatus{Dir: "ckpt", Store: "gs://b/p", Access: "signed", Keep: 2, LastStep: -1}); !strings.Contains(got, "none in the store yet") {
		t.Errorf("no checkpoint yet rendered as:\n%s", got)
	}
	if render(nil) != "" {
		t.Error("a fleet without a checkpoint block rendered a line")
	}
	// In the fleet view, under the summary block.
	_, det, _ := renderFixture()
	det.Checkpoint = c
	var b bytes.Buffer
	printFleetDetail(&b, det, now)
	if !strings.Contains(b.String(), "Checkpoints:") || !strings.Contains(b.String(), "failing (denied on bert-1-2, 5s ago)") {
		t.Errorf("fleetd status FLEET lacks the checkpoint:\n%s", b.String())
	}
}
