package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fleetd/fleetd/fleet/api"
)

// torchPython is Debian's python3-torch interpreter; the python3 first on
// PATH may be another one.
const torchPython = "/usr/bin/python3"

func haveTorch() bool {
	return exec.Command(torchPython, "-c", "import torch, torch.distributed").Run() == nil
}

// pytorchSpec: max_nodes 4, so the replacement (3 < 4) waits last_call
// and the world-size-2 phase stays observable.
func pytorchSpec(repo, ckpt string, steps int) string {
	return localFleet{name: "ddp", sizes: `
  min_nodes     = 2
  max_nodes     = 4
  desired_nodes = 3`, provider: `
    zones       = ["local-a", "local-b"]
    notice_lead = "20s"`, training: fmt.Sprintf(`
    command        = [%q, "examples/pytorch/ddp_train.py", "--steps", "%d", "--step-time", "0.05", "--timeout", "20"]
    workdir        = %q
    nproc_per_node = 1
    max_restarts   = 20
    drain_grace    = "10s"
    checkpoint_uri = "file://%s"`, torchPython, steps, repo, ckpt), rendezvous: `
    # Replacements join at the next round boundary after last_call: long
    # enough here that the world-size-2 phase is observable.
    last_call  = "20s"
    heartbeat  = "1s"
    dead_after = "4s"`}.hcl()
}

type ddpProgress struct {
	maxStep int64
	lastWS  int
	sizes   map[int]bool
	maxAt   map[int]int64 // world size → highest step trained at it
}

// readProgress parses the workers' JSON step lines shipped to the daemon.
func readProgress(t *testing.T, d *devDaemon, bin string) (ddpProgress, api.FleetDetail) {
	t.Helper()
	p := ddpProgress{sizes: map[int]bool{}, maxAt: map[int]int64{}}
	out, _, code := d.cli(t, bin, "logs", "-json", "-n", "2000", "ddp")
	if code == 0 {
		dec := json.NewDecoder(strings.NewReader(out))
		for dec.More() {
			var l api.LogLine
			if dec.Decode(&l) != nil {
				break
			}
			var s struct {
				Event     string `json:"event"`
				Step      int64  `json:"step"`
				WorldSize int    `json:"world_size"`
			}
			if json.Unmarshal([]byte(l.Line), &s) != nil || s.Event != "step" {
				continue
			}
			if s.Step > p.maxStep {
				p.maxStep = s.Step
			}
			p.lastWS = s.WorldSize
			p.sizes[s.WorldSize] = true
			if s.Step > p.maxAt[s.WorldSize] {
				p.maxAt[s.WorldSize] = s.Step
			}
		}
	}
	var det api.FleetDetail
	out, _, code = d.cli(t, bin, "status", "-json", "ddp")
	if code == 0 {
		_ = json.Unmarshal([]byte(out), &det)
	}
	return p, det
}

// TestPyTorchFleetSurvivesInterruptions is the worker-contract acceptance
// test: real PyTorch DDP (gloo) on 3 local nodes under a real daemon.
// Scenario 1: a spot notice on one node → the survivors continue at world
// size 2 from the checkpoint, the replacement brings it back to 3.
// Scenario 2: a node is killed without notice (SIGKILL of its agent and
// workers) → training continues. The job completes at the configured step.
func TestPyTorchFleetSurvivesInterruptions(t *testing.T) {
	if testing.Short() {
		t.Skip("real PyTorch training")
	}
	if !haveTorch() {
		t.Skip("python3-torch not installed for /usr/bin/python3 (apt-get install python3-torch; .ci/run installs it)")
	}
	bin := fleetdBinary(t)
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	ckpt := filepath.Join(t.TempDir(), "ckpt")
	nodeDir := localNodeDir(dataDir)
	const steps = 500
	d := startApplied(t, bin, dataDir, "ddp", pytorchSpec(repo, ckpt, steps))
	defer d.stop(t)
	defer func() {
		if t.Failed() || os.Getenv("FLEETD_TEST_VERBOSE") != "" {
			out, _, _ := d.cli(t, bin, "events")
			t.Logf("events:\n%s", out)
			out, _, _ = d.cli(t, bin, "logs", "-n", "60", "ddp")
			t.Logf("logs:\n%s", out)
		}
	}()
	var p ddpProgress
	var det api.FleetDetail
	waitUntil(t, "training at world size 3", 120*time.Second, func() bool {
		p, det = readProgress(t, d, bin)
		return p.lastWS == 3 && p.maxStep >= 20
	})

	// Scenario 1: spot notice.
	victim := ""
	for _, n := range det.Nodes {
		if n.State == "running" {
			victim = n.ID
		}
	}
	if out, errOut, code := d.cli(t, bin, "debug", "interrupt", "ddp", victim); code != 0 {
		t.Fatalf("debug interrupt: %d %s %s", code, out, errOut)
	}
	stepAtNotice := p.maxStep
	noticeAt := time.Now()
	waitUntil(t, "survivors training at world size 2", 60*time.Second, func() bool {
		p, det = readProgress(t, d, bin)
		return p.maxAt[2] > stepAtNotice
	})
	t.Logf("notice → survivors training at world size 2: %.1fs (resumed at step ≤ %d)", time.Since(noticeAt).Seconds(), p.maxStep)
	waitUntil(t, "replacement: back at world size 3", 90*time.Second, func() bool {
		p, det = readProgress(t, d, bin)
		return p.lastWS == 3 && p.maxAt[3] > p.maxAt[2]
	})

	// Scenario 2: a node lost without notice — SIGKILL its agent's whole
	// session (agent + workers) as a VM dying would.
	var lost string
	for _, n := range det.Nodes {
		if n.State == "running" {
			lost = n.InstanceID
		}
	}
	pids := procsMatching("agent", filepath.Join(nodeDir, "instances", lost))
	if len(pids) == 0 {
		t.Fatalf("no agent process for instance %s", lost)
	}
	for _, pid := range pids {
		if sid, err := unix.Getsid(pid); err == nil {
			_ = syscall.Kill(-sid, syscall.SIGKILL)
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	stepAtLoss := p.maxStep
	lossAt := time.Now()
	waitUntil(t, "training continues after the unannounced loss", 90*time.Second, func() bool {
		p, det = readProgress(t, d, bin)
		return p.maxStep > stepAtLoss+5
	})
	t.Logf("unannounced loss → training again: %.1fs (world size %d)", time.Since(lossAt).Seconds(), p.lastWS)

	waitUntil(t, "job completed", 240*time.Second, func() bool {
		_, det = readProgress(t, d, bin)
		return det.Completed
	})
	if !det.Succeeded {
		t.Fatal("job reported failure")
	}
	b, err := os.ReadFile(filepath.Join(ckpt, "DONE"))
	if err != nil {
		t.Fatalf("no DONE marker: %v", err)
	}
	var done struct {
		Step int64 `json:"step"`
	}
	if err := json.Unmarshal(b, &done); err != nil || done.Step != steps {
		t.Fatalf("final step %d (%v), want %d; DONE=%s", done.Step, err, steps, b)
	}
	if !p.sizes[2] || !p.sizes[3] {
		t.Fatalf("world sizes seen %v, want 2 and 3", p.sizes)
	}
}
