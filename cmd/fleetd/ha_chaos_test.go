package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
)

// TestHAChaos is the long version of TestHAThreeServers (make chaos):
// rounds of faults on a three-server cluster while a fleet changes size
// and its nodes get spot notices — SIGKILL of the leader (then restarted),
// SIGSTOP of the leader past the TTL, SIGKILL of a follower (its etcd
// member dies with it) and its restart. After every round: every live node
// has one instance and one node process, no instance is recorded twice,
// and no node process lacks a record. At the end the API history of three
// clients is checked for linearizability. FLEETD_HA_CHAOS_ROUNDS sets the
// rounds (default 8).
func TestHAChaos(t *testing.T) {
	if os.Getenv("FLEETD_CHAOS_LONG") != "1" {
		t.Skip("long: make chaos (FLEETD_CHAOS_LONG=1); TestHAThreeServers is the short version")
	}
	rounds := 8
	if v := os.Getenv("FLEETD_HA_CHAOS_ROUNDS"); v != "" {
		fmt.Sscan(v, &rounds)
	}
	bin := fleetdBinary(t)
	nodeDir := haNodeDir(t)
	servers := startHACluster(t, bin)
	var token string
	waitUntil(t, "the cluster up", 90*time.Second, func() bool {
		b, err := os.ReadFile(filepath.Join(servers[0].dataDir, "token"))
		token = string(bytes.TrimSpace(b))
		return err == nil && token != ""
	})
	waitServing(t, servers, token)
	info := func(s *haServer) (api.ClusterInfo, bool) {
		if !s.alive() {
			return api.ClusterInfo{}, false
		}
		i, err := clusterInfo(s, token)
		return i, err == nil
	}
	leader := func() *haServer {
		for _, s := range servers {
			if i, ok := info(s); ok && i.IsLeader {
				return s
			}
		}
		return nil
	}
	addrs := servers[0].url + "," + servers[1].url + "," + servers[2].url
	cli := func(args ...string) (string, int) {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "FLEETD_ADDR="+addrs, "FLEETD_TOKEN="+token)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); ok {
			return out.String(), ee.ExitCode()
		}
		return out.String(), 0
	}
	specFile := filepath.Join(t.TempDir(), "ha.hcl")
	writeSpec := func(desired int) {
		spec := fmt.Sprintf(`
fleet "ha" {
  min_nodes     = %d
  max_nodes     = 4
  desired_nodes = %d
  node { gpus = 1 }
  # Notices mark the spot offerings unavailable for a while; on-demand
  # takes over at once so every round can converge to its size.
  placement {
    colocate           = "region"
    on_demand_fallback = "after 1s below min_nodes"
  }
  provider "local" {
    zones       = ["local-a", "local-b"]
    state_dir   = %q
    notice_lead = "5s"
  }
  training {
    command     = ["sleep", "600"]
    drain_grace = "3s"
  }
  rendezvous {
    heartbeat  = "1s"
    dead_after = "20s"
  }
}
`, desired, desired, nodeDir)
		if err := os.WriteFile(specFile, []byte(spec), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeSpec(2)
	waitUntil(t, "first apply", 60*time.Second, func() bool { _, code := cli("apply", "-auto-approve", specFile); return code == 0 })

	hist := &apiHistory{start: time.Now()}
	stopClients := make(chan struct{})
	clients := runClients(t, addrs, token, 3, hist, stopClients)

	var lastDet api.FleetDetail
	defer func() {
		if t.Failed() {
			for _, n := range lastDet.Nodes {
				t.Logf("node %s %s instance %s %s", n.ID, n.State, n.InstanceID, n.Reason)
			}
			t.Logf("node processes: %d", len(procsMatching("local-node", nodeDir)))
			out, _ := cli("events")
			t.Logf("events:\n%s", tail(out, 40))
		}
	}()
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("FLEETD_HA_CHAOS_SEED"); v != "" {
		fmt.Sscan(v, &seed)
	}
	t.Logf("seed %d (FLEETD_HA_CHAOS_SEED reproduces the faults' order)", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	faults, leaderChanges := 0, 0
	lastLeader := ""
	for round := range rounds {
		// Change the fleet's size and warn a node, then strike.
		desired := 2 + rng.IntN(2)
		writeSpec(desired)
		_, _ = cli("apply", "-auto-approve", specFile)
		var det api.FleetDetail
		if out, code := cli("status", "-json", "ha"); code == 0 && json.Unmarshal([]byte(out), &det) == nil {
			for _, n := range det.Nodes {
				if n.State == "running" && rng.IntN(2) == 0 {
					_, _ = cli("debug", "interrupt", "-lead", "5s", "ha", n.ID)
					break
				}
			}
		}
		lead := leader()
		if lead == nil {
			waitUntil(t, "a leader", 30*time.Second, func() bool { lead = leader(); return lead != nil })
		}
		if lead.name != lastLeader {
			leaderChanges++
			lastLeader = lead.name
		}
		var victim *haServer
		kind := rng.IntN(3)
		switch kind {
		case 0: // SIGKILL the leader, restart it later
			victim = lead
			_ = victim.cmd.Process.Signal(syscall.SIGKILL)
		case 1: // SIGSTOP the leader past the TTL
			victim = lead
			_ = victim.cmd.Process.Signal(syscall.SIGSTOP)
			time.Sleep(4 * time.Second)
			_ = victim.cmd.Process.Signal(syscall.SIGCONT)
		case 2: // SIGKILL a follower (and its etcd member)
			for _, s := range servers {
				if s != lead {
					victim = s
				}
			}
			_ = victim.cmd.Process.Signal(syscall.SIGKILL)
		}
		faults++
		t.Logf("round %d: desired %d, fault %d on %s (leader was %s)", round+1, desired, kind, victim.name, lead.name)
		time.Sleep(3 * time.Second)
		if kind != 1 {
			<-victim.done
			victim.start(t, bin)
		}
		waitUntil(t, "all three servers answering", 90*time.Second, func() bool {
			for _, s := range servers {
				if _, ok := info(s); !ok {
					return false
				}
			}
			return true
		})
		// Converged: the fleet runs its target with one process per node.
		waitUntil(t, fmt.Sprintf("round %d: %d nodes running, one process each", round+1, desired), 120*time.Second, func() bool {
			out, code := cli("status", "-json", "ha")
			if code != 0 || json.Unmarshal([]byte(out), &det) != nil {
				return false
			}
			lastDet = det
			running, live := 0, 0
			seen := map[string]bool{}
			for _, n := range det.Nodes {
				if n.InstanceID != "" && seen[n.InstanceID] {
					t.Fatalf("round %d: instance %s recorded twice", round+1, n.InstanceID)
				}
				seen[n.InstanceID] = true
				switch n.State {
				case "running":
					running++
					live++
				case "booting", "joined", "draining", "provisioning":
					live++
				}
			}
			return running == desired && live == desired && len(procsMatching("local-node", nodeDir)) == desired
		})
	}
	close(stopClients)
	clients.Wait()
	ops, known := hist.check(t)
	t.Logf("HA chaos: %d rounds, %d faults injected, %d leader changes seen, %d API operations checked for linearizability (%d with a known outcome), 0 duplicates, 0 leaked node processes",
		rounds, faults, leaderChanges, ops, known)
}
