package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/state/etcdtest"
)

// TestHAExternalEtcdMemberLoss: two `fleetd serve` on an etcd cluster they
// do not run (etcd { endpoints }, three real members in this test
// process). etcd's raft leader is stopped, then restarted; then a
// follower member likewise. Throughout, a fleet of two local nodes keeps
// its nodes (nothing relaunched), one fleetd server leads, API writes go
// on, and the API history of three clients is linearizable.
func TestHAExternalEtcdMemberLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two daemons on a three-member etcd")
	}
	bin := fleetdBinary(t)
	etcd := etcdtest.StartCluster(t, 3)
	eps := etcd.Endpoints()
	quoted := make([]string, len(eps))
	for i, e := range eps {
		quoted[i] = fmt.Sprintf("%q", e)
	}
	nodeDir := haNodeDir(t)
	servers := []*haServer{}
	for _, n := range []string{"a", "b"} {
		s := newHAServer(t, n)
		s.writeConfig(t, fmt.Sprintf(`cluster {
  name        = %q
  session_ttl = "2s"
  etcd { endpoints = [%s] }
}
`, n, strings.Join(quoted, ", ")))
		s.start(t, bin)
		servers = append(servers, s)
	}
	stopOnCleanup(t, servers, 30)
	var token string
	waitUntil(t, "both servers up with one token", 60*time.Second, func() bool {
		a, errA := os.ReadFile(filepath.Join(servers[0].dataDir, "token"))
		b, errB := os.ReadFile(filepath.Join(servers[1].dataDir, "token"))
		token = strings.TrimSpace(string(a))
		return errA == nil && errB == nil && token != "" && token == strings.TrimSpace(string(b))
	})
	waitServing(t, servers, token)
	addrs := servers[0].url + "," + servers[1].url
	leader := func() string { return leaderOf(servers, token) }
	waitUntil(t, "a fleetd leader", 30*time.Second, func() bool { return leader() != "" })

	specFile := writeHASpec(t, "ext", nodeDir)
	if out, errOut, code := runFleetd(t, bin, addrs, token, "apply", "-auto-approve", specFile); code != 0 {
		t.Fatalf("apply: exit %d\n%s\n%s", code, out, errOut)
	}
	var det api.FleetDetail
	running := func() bool {
		out, _, code := runFleetd(t, bin, addrs, token, "status", "-json", "ext")
		return nodesRunning(out, code, &det, 2)
	}
	waitUntil(t, "2 nodes running", 90*time.Second, running)
	before := map[string]string{}
	for _, x := range det.Nodes {
		before[x.ID] = x.InstanceID
	}
	hist := &apiHistory{start: time.Now()}
	stop := make(chan struct{})
	clients := runClients(t, addrs, token, 3, hist, stop)

	same := func(when string) {
		t.Helper()
		waitUntil(t, when+": a fleetd leader and 2 nodes running", 30*time.Second, func() bool { return leader() != "" && running() })
		for _, x := range det.Nodes {
			if inst, ok := before[x.ID]; !ok || inst != x.InstanceID {
				t.Errorf("%s: node %s (instance %s) is new or changed; before: %v", when, x.ID, x.InstanceID, before)
			}
		}
		if n := len(procsMatching("local-node", nodeDir)); n != 2 {
			t.Errorf("%s: %d node processes, want 2", when, n)
		}
	}
	for _, which := range []string{"raft leader", "follower"} {
		var m *etcdtest.Member
		if l := etcd.Leader(); which == "raft leader" {
			m = l
		} else {
			for _, x := range etcd.Members {
				if x != l {
					m = x
				}
			}
		}
		if m == nil {
			t.Fatalf("no etcd %s to stop", which)
		}
		m.Stop()
		lost := time.Now()
		time.Sleep(4 * time.Second) // past the session TTL
		same("etcd " + which + " " + m.Name + " stopped")
		t.Logf("etcd %s %s stopped: fleetd leader %s, fleet intact %.1fs later", which, m.Name, leader(), time.Since(lost).Seconds())
		if err := m.Restart(); err != nil {
			t.Fatalf("restart etcd member %s: %v", m.Name, err)
		}
		same("etcd member " + m.Name + " restarted")
	}
	close(stop)
	clients.Wait()
	ops, known := hist.check(t)
	t.Logf("linearizability: %d API operations checked (%d with a known outcome) across two etcd member losses", ops, known)
	if out, errOut, code := runFleetd(t, bin, addrs, token, "destroy", "-auto-approve", "ext"); code != 0 {
		t.Errorf("destroy: exit %d\n%s\n%s", code, out, errOut)
	}
}

// stopServer stops a server as its service manager would (SIGTERM, then
// SIGKILL after 20 s).
func stopServer(s *haServer) {
	if !s.alive() {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(20 * time.Second):
		_ = s.cmd.Process.Kill()
	}
}
