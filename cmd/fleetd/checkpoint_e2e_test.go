package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/chromedp/chromedp"
	"golang.org/x/sys/unix"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/api/schema"
	"github.com/fleetd/fleetd/providers/aws/motoserver"
)

func checkpointSpec(trainer, store, missing string) string {
	fleet := func(name string, nodes int, store string) string {
		return fmt.Sprintf(`
fleet %q {
  min_nodes = %d
  max_nodes = %d
  node {
    gpus = 1
  }
  placement {
    colocate = "region"
  }
  provider "local" {
    zones = ["local-a"]
  }
  training {
    command      = ["python3", %q, "--steps", "100000", "--step-time", "0.05", "--ckpt-every", "20"]
    max_restarts = 20
    drain_grace  = "5s"
    warm_start   = false
    checkpoint {
      dir   = "ckpt"
      store = %q
      keep  = 2
    }
  }
  rendezvous {
    last_call  = "1s"
    heartbeat  = "1s"
    dead_after = "3s"
  }
}
`, name, nodes, nodes, trainer, store)
	}
	return fleet("travel", 2, store) + fleet("nostore", 1, missing)
}

// trainerEvents returns the example trainer's JSON events of a fleet's
// workers shipped to the daemon, with the node that printed them.
func trainerEvents(t *testing.T, d *devDaemon, bin, fleet, event string) []map[string]any {
	t.Helper()
	out, _, code := d.cli(t, bin, "logs", "-json", "-n", "5000", fleet)
	if code != 0 {
		return nil
	}
	var evs []map[string]any
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var l api.LogLine
		if dec.Decode(&l) != nil {
			break
		}
		var m map[string]any
		if json.Unmarshal([]byte(l.Line), &m) != nil || m["event"] != event {
			continue
		}
		m["_node"] = l.Node
		evs = append(evs, m)
	}
	return evs
}

func fleetDetail(t *testing.T, d *devDaemon, bin, fleet string) api.FleetDetail {
	t.Helper()
	var det api.FleetDetail
	if out, _, code := d.cli(t, bin, "status", "-json", fleet); code == 0 {
		_ = json.Unmarshal([]byte(out), &det)
	}
	return det
}

// TestCheckpointsTravel is the acceptance test of training.checkpoint on
// local nodes under a real daemon, with an S3 store on moto reached only
// through URLs the daemon signs: every node of the job is killed
// (SIGKILL of each node's whole session), and the replacements restore the
// newest complete checkpoint from the store before their workers start
// and resume at exactly its step. A second fleet's store is a bucket that
// does not exist: an alert and events say so, and it trains on.
func TestCheckpointsTravel(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a daemon, local nodes and moto")
	}
	bin := fleetdBinary(t)
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	srv := motoserver.StartT(t)
	s3c := s3.NewFromConfig(srv.Config("us-east-1"), func(o *s3.Options) { o.UsePathStyle = true })
	if _, err := s3c.CreateBucket(t.Context(), &s3.CreateBucketInput{Bucket: aws.String("ckpt")}); err != nil {
		t.Fatal(err)
	}
	params := "?endpoint=" + srv.URL() + "&region=us-east-1&use_path_style=true"
	// The daemon's credentials: its environment, as on a real deployment.
	t.Setenv("AWS_ACCESS_KEY_ID", motoserver.AccessKeyID)
	t.Setenv("AWS_SECRET_ACCESS_KEY", motoserver.SecretAccessKey)
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	dataDir := t.TempDir()
	nodeDir := localNodeDir(dataDir)
	spec := checkpointSpec(filepath.Join(repo, "examples", "trainer", "train.py"), "s3://ckpt/runs/travel"+params, "s3://no-such-bucket/p"+params)
	d := startApplied(t, bin, dataDir, "travel", spec)
	defer d.stop(t)
	defer func() {
		if t.Failed() {
			out, _, _ := d.cli(t, bin, "events")
			t.Logf("events:\n%s", tail(out, 80))
		}
	}()

	var det api.FleetDetail
	waitUntil(t, "two checkpoints in the store", 60*time.Second, func() bool {
		det = fleetDetail(t, d, bin, "travel")
		return det.Checkpoint != nil && det.Checkpoint.LastStep >= 40
	})
	if c := det.Checkpoint; c.UploadMiBps <= 0 || c.Bytes <= 0 || c.Access != "signed" || c.Error != "" {
		t.Fatalf("checkpoint status %+v", c)
	}

	// Kill every node of the job, agents and workers at once.
	killed := map[string]bool{}
	for _, n := range det.Nodes {
		if n.State == "terminated" || n.State == "failed" || n.InstanceID == "" {
			continue
		}
		killed[n.ID] = true
		for _, pid := range procsMatching("agent", filepath.Join(nodeDir, "instances", n.InstanceID)) {
			if sid, err := unix.Getsid(pid); err == nil {
				_ = syscall.Kill(-sid, syscall.SIGKILL)
			}
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if len(killed) != 2 {
		t.Fatalf("killed %v, want the job's 2 nodes", killed)
	}
	// What the store holds as complete now is where the job must resume
	// (after a moment: a manifest PUT sent just before the kill may still
	// be in moto's hands).
	time.Sleep(500 * time.Millisecond)
	latest := newestManifest(t, s3c, "ckpt", "runs/travel/")
	if latest < 40 {
		t.Fatalf("newest manifest in the store: step %d", latest)
	}
	killedAt := time.Now()

	var resumes, all []map[string]any // rank 0's and every rank's, on the new nodes
	waitUntil(t, "a replacement node resuming from the store", 90*time.Second, func() bool {
		resumes, all = resumes[:0], all[:0]
		for _, ev := range trainerEvents(t, d, bin, "travel", "resume") {
			if !killed[ev["_node"].(string)] {
				all = append(all, ev)
				if ev["rank"] == 0.0 {
					resumes = append(resumes, ev)
				}
			}
		}
		return len(resumes) > 0
	})
	t.Logf("all nodes killed → new nodes resumed at step %v from the store in %.1fs", resumes[0]["step"], time.Since(killedAt).Seconds())
	if got := int64(resumes[0]["step"].(float64)); got != latest {
		t.Fatalf("the new nodes resumed at step %d, the store's newest complete checkpoint is step %d", got, latest)
	}
	// The first workers on a node that restored are told the restored
	// step (rank 0 takes the newest checkpoint any rank has, so it may sit
	// on a node whose own restore came later or failed).
	if !slices.ContainsFunc(all, func(ev map[string]any) bool {
		es, ok := ev["expected_step"].(float64)
		return ok && int64(es) == latest
	}) {
		t.Errorf("no worker on a new node got FLEETD_RESUME_STEP=%d: %v", latest, all)
	}
	waitUntil(t, "training beyond the restored step and a new upload", 60*time.Second, func() bool {
		det = fleetDetail(t, d, bin, "travel")
		return det.Checkpoint.LastStep > latest && det.Checkpoint.LastRestore != nil
	})
	if r := det.Checkpoint.LastRestore; r.Step != latest || killed[r.Node] || det.Checkpoint.RestoreMiBps <= 0 {
		t.Fatalf("last restore %+v (restore %.1f MiB/s)", r, det.Checkpoint.RestoreMiBps)
	}
	v, err := schema.Compile(schema.FleetDetail)
	if err != nil {
		t.Fatal(err)
	}
	if out, _, _ := d.cli(t, bin, "status", "-json", "travel"); v.Validate([]byte(out)) != nil {
		t.Fatalf("status -json travel does not match the API schema: %v\n%s", v.Validate([]byte(out)), out)
	}
	// The prune follows the upload and reaches the daemon with the node's
	// next checkpoint report: wait for it as for the store below.
	wantEvents := []string{"checkpoint.uploaded", "checkpoint.restored", fmt.Sprintf("restored checkpoint step %d before starting its workers", latest), "checkpoint.pruned"}
	var out string
	evDeadline := time.Now().Add(30 * time.Second)
	for {
		out, _, _ = d.cli(t, bin, "events")
		if !slices.ContainsFunc(wantEvents, func(w string) bool { return !strings.Contains(out, w) }) || time.Now().After(evDeadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	for _, want := range wantEvents {
		if !strings.Contains(out, want) {
			t.Errorf("events lack %q", want)
		}
	}
	// keep = 2: the store holds two complete checkpoints. The agent prunes
	// after it records a new upload as the latest, so a third may be seen
	// for a moment.
	var held int
	deadline := time.Now().Add(30 * time.Second)
	for held = len(manifests(t, s3c, "ckpt", "runs/travel/")); held != 2 && time.Now().Before(deadline); held = len(manifests(t, s3c, "ckpt", "runs/travel/")) {
		time.Sleep(200 * time.Millisecond)
	}
	if held != 2 {
		t.Errorf("the store holds %d checkpoints after 30s, keep = 2", held)
	}

	// The fleet whose bucket does not exist: alert, event, training on.
	var ns api.FleetDetail
	waitUntil(t, "the missing bucket reported", 30*time.Second, func() bool {
		ns = fleetDetail(t, d, bin, "nostore")
		return ns.Checkpoint != nil && ns.Checkpoint.Error != ""
	})
	if ns.Checkpoint.ErrorKind != "not-found" {
		t.Errorf("missing bucket reported as %q: %s", ns.Checkpoint.ErrorKind, ns.Checkpoint.Error)
	}
	alert := slices.IndexFunc(ns.Alerts, func(a api.AlertInfo) bool { return a.Kind == "checkpoint-store" })
	if alert < 0 || !strings.Contains(ns.Alerts[alert].Message, "Training goes on") {
		t.Errorf("alerts %+v", ns.Alerts)
	}
	if !strings.Contains(out+mustEvents(t, d, bin), "checkpoint.upload_failed") {
		t.Error("no checkpoint.upload_failed event")
	}
	// Training goes on there, checkpointing locally.
	waitUntil(t, "the fleet whose bucket is missing checkpointing on", 30*time.Second, func() bool {
		return len(trainerEvents(t, d, bin, "nostore", "checkpoint")) >= 3
	})
	out, _, _ = d.cli(t, bin, "status", "nostore")
	if !strings.Contains(out, "Checkpoints:") || !strings.Contains(out, "failing (not-found") {
		t.Errorf("status nostore:\n%s", out)
	}

	// The dashboard shows both.
	requireChromium(t)
	if text, _ := dashboardCheckpoint(t, d, "nostore", "failing (not-found"); !strings.Contains(text, "s3://no-such-bucket/p (signed)") {
		t.Errorf("dashboard, nostore: %q", text)
	}
	text, png := dashboardCheckpoint(t, d, "travel", "step ")
	if !strings.Contains(text, "s3://ckpt/runs/travel (signed)") || !strings.Contains(text, "restore ") {
		t.Errorf("dashboard, travel: %q", text)
	}
	if dir := os.Getenv("FLEETD_SCREENSHOT_DIR"); dir != "" {
		_ = os.WriteFile(filepath.Join(dir, "dashboard-checkpoints.png"), png, 0o644)
	}
}

func mustEvents(t *testing.T, d *devDaemon, bin string) string {
	out, _, _ := d.cli(t, bin, "events")
	return out
}

// manifests lists the complete checkpoints under prefix.
func manifests(t *testing.T, c *s3.Client, bucket, prefix string) []int64 {
	t.Helper()
	out, err := c.ListObjectsV2(t.Context(), &s3.ListObjectsV2Input{Bucket: aws.String(bucket), Prefix: aws.String(prefix + "manifests/")})
	if err != nil {
		t.Fatal(err)
	}
	var steps []int64
	for _, o := range out.Contents {
		name := strings.TrimSuffix(strings.TrimPrefix(*o.Key, prefix+"manifests/step-"), ".json")
		if n, err := strconv.ParseInt(name, 10, 64); err == nil {
			steps = append(steps, n)
		}
	}
	slices.Sort(steps)
	return steps
}

func newestManifest(t *testing.T, c *s3.Client, bucket, prefix string) int64 {
	m := manifests(t, c, bucket, prefix)
	if len(m) == 0 {
		return -1
	}
	return m[len(m)-1]
}

// dashboardCheckpoint opens the dashboard in headless chromium, selects
// fleet and returns its checkpoint line once it contains want (and a
// screenshot of the page).
func dashboardCheckpoint(t *testing.T, d *devDaemon, fleet, want string) (string, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	browser := openDashboard(t, ctx, d, 1300)
	pick := fmt.Sprintf(`(() => { const r = document.querySelector('#fleets tr[data-fleet=%q]'); if (r && !r.classList.contains("selected")) r.click(); return document.querySelector('#checkpoint-explain').textContent; })()`, fleet)
	var text string
	waitUntil(t, "the dashboard's checkpoint line of "+fleet, 30*time.Second, func() bool {
		s, err := chromedp.Run(browser, chromedp.Evaluate[string](pick))
		text = s
		return err == nil && strings.Contains(s, want)
	})
	png, err := chromedp.Run(browser, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	return text, png
}
