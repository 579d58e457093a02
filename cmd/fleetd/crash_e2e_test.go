package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleetd/internal/procstat"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/internal/testutil"
)

// procsMatching returns the pids of the live processes whose command line
// contains every needle.
func procsMatching(needles ...string) []int {
	var out []int
	for _, p := range scanProcs() {
		ok := true
		for _, n := range needles {
			if !strings.Contains(p.cmd, n) {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, p.pid)
		}
	}
	return out
}

func isZombie(pid int) bool {
	st, err := procstat.Read(pid)
	return err != nil || st.State == 'Z'
}

// killAll kills the matching processes and everything else in their
// sessions: a node supervisor leads its node's session, and its agent and
// workers must not outlive a test that failed half-way.
func killAll(needles ...string) {
	procs := scanProcs()
	sidOf := make(map[int]int, len(procs))
	for _, p := range procs {
		sidOf[p.pid] = p.sid
	}
	own, sids := sidOf[os.Getpid()], map[int]bool{}
	for _, pid := range procsMatching(needles...) {
		if sid := sidOf[pid]; sid > 0 && sid != own {
			sids[sid] = true
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for _, p := range procs {
		if sids[p.sid] {
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
	}
}

var crashSpec = localFleet{name: "crash", sizes: `
  min_nodes     = 2
  max_nodes     = 4
  desired_nodes = 3`, provider: `
    zones = ["local-a", "local-b"]`, training: `
    command = ["sleep", "600"]`}.hcl()

// TestCrashDuringScaleUp SIGKILLs the daemon at several points of a
// scale-up and restarts it: every run must end with exactly the target
// number of instances, each accounted for by a node record, and no
// provider plugin process left from the killed daemon.
func TestCrashDuringScaleUp(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real daemons and nodes")
	}
	bin := fleetdBinary(t)
	for _, killAfter := range []time.Duration{0, 150 * time.Millisecond, 400 * time.Millisecond, 1200 * time.Millisecond} {
		t.Run(killAfter.String(), func(t *testing.T) {
			dataDir := t.TempDir()
			nodeDir := localNodeDir(dataDir)
			specFile := filepath.Join(t.TempDir(), "crash.hcl")
			if err := os.WriteFile(specFile, []byte(crashSpec), 0o644); err != nil {
				t.Fatal(err)
			}
			addr := freeAddr(t)
			d := startDaemon(t, bin, dataDir, addr)
			if out, errOut, code := d.cli(t, bin, "apply", "-auto-approve", specFile); code != 0 {
				t.Fatalf("apply: %d\n%s\n%s", code, out, errOut)
			}
			time.Sleep(killAfter)
			// Only this daemon's own plugins: children of its process.
			var plugins []int
			for _, p := range scanProcs() {
				if p.ppid == d.cmd.Process.Pid && strings.Contains(p.cmd, bin) && strings.Contains(p.cmd, "plugin provider local") {
					plugins = append(plugins, p.pid)
				}
			}
			if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			<-d.done
			// Pdeathsig takes the plugin down with the daemon. The bound is
			// generous: a SIGKILLed process still finishes an fsync in
			// progress, which takes seconds when CI's test packages all
			// write at once.
			var survivors []string
			gone := func() bool {
				survivors = survivors[:0]
				for _, pid := range plugins {
					if !isZombie(pid) && syscall.Kill(pid, 0) == nil {
						st, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
						survivors = append(survivors, strings.TrimSpace(string(st)))
					}
				}
				return len(survivors) == 0
			}
			deadline := time.Now().Add(30 * time.Second)
			for !gone() && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
			}
			if !gone() {
				t.Fatalf("plugin processes outlived the SIGKILLed daemon by 30 s: %q", survivors)
			}

			d2 := startDaemon(t, bin, dataDir, addr)
			var det api.FleetDetail
			// A node killed mid-Create is relaunched only after the 30 s
			// relaunch delay (its instance may still appear), so the
			// bound is well above that: with the two cores oversubscribed
			// four times over, the whole wait took up to 69 s.
			// What the wait saw last, for a timeout to report.
			var last string
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("last seen: %s", last)
				}
			})
			waitUntil(t, "3 nodes with instances and exactly 3 node processes", 180*time.Second, func() bool {
				out, errOut, code := d2.cli(t, bin, "status", "-json", "crash")
				if code != 0 || json.Unmarshal([]byte(out), &det) != nil {
					last = fmt.Sprintf("status: exit %d: %s", code, strings.TrimSpace(errOut))
					return false
				}
				withInstance := 0
				var nodes []string
				for _, n := range det.Nodes {
					if n.InstanceID != "" && (n.State == "booting" || n.State == "joined" || n.State == "running") {
						withInstance++
					}
					nodes = append(nodes, fmt.Sprintf("%s=%s/%s(%s)", n.ID, n.State, n.InstanceID, n.Reason))
				}
				procs := procsMatching("local-node", nodeDir)
				last = fmt.Sprintf("nodes %v; %d node processes %v", nodes, len(procs), procs)
				return withInstance == 3 && len(procs) == 3
			})
			// Stable: nothing more is launched over a few reconcile passes.
			time.Sleep(2 * time.Second)
			if n := len(procsMatching("local-node", nodeDir)); n != 3 {
				t.Fatalf("%d node processes after settling, want 3", n)
			}
			ids := map[string]bool{}
			for _, n := range det.Nodes {
				if n.InstanceID != "" {
					if ids[n.InstanceID] {
						t.Fatalf("instance %s recorded twice", n.InstanceID)
					}
					ids[n.InstanceID] = true
				}
			}
			// Every running node process belongs to a recorded instance.
			for _, pid := range procsMatching("local-node", nodeDir) {
				b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
				found := false
				for id := range ids {
					if strings.Contains(string(b), id) {
						found = true
					}
				}
				if !found {
					t.Fatalf("node process %d (%s) has no node record", pid, strings.ReplaceAll(string(b), "\x00", " "))
				}
			}
			d2.stop(t) // dev mode: terminates the nodes
			// Dev-mode stop waits out the plugin's grace (10 s) too; 45 s leaves room on a loaded 2-core runner.
			waitUntil(t, "nodes terminated", 45*time.Second, func() bool { return len(procsMatching("local-node", nodeDir)) == 0 })
			if left := procsMatching(bin, "plugin provider"); len(left) > 0 {
				for _, pid := range left {
					// This daemon's plugins carry its data dir in their environment.
					b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
					if strings.Contains(string(b), dataDir) {
						t.Fatalf("plugin process %d left after the daemon stopped", pid)
					}
				}
			}
		})
	}
}

func waitUntil(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, timeout, 100*time.Millisecond, what, cond)
}
