package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet"
	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/fleettest/clusterprobe"
	"github.com/fleetd/fleetd/internal/devcluster"
	"github.com/fleetd/fleetd/internal/testutil"
)

// haServer is one `fleetd serve` of a three-server cluster on loopback,
// each with its own embedded etcd member.
type haServer struct {
	name, url, dataDir, config string
	cmd                        *exec.Cmd
	done                       chan error
	logs                       *testutil.SyncBuffer
}

func (s *haServer) start(t *testing.T, bin string) {
	t.Helper()
	s.cmd = exec.Command(bin, "serve", "-config", s.config)
	s.logs = &testutil.SyncBuffer{}
	s.cmd.Stdout, s.cmd.Stderr = s.logs, s.logs
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.done = make(chan error, 1)
	go func() { s.done <- s.cmd.Wait() }()
}

func (s *haServer) alive() bool {
	select {
	case err := <-s.done:
		s.done <- err
		return false
	default:
		return true
	}
}

// newHAServer is server name with a data directory of its own and a free
// API address on loopback.
func newHAServer(t *testing.T, name string) *haServer {
	return &haServer{name: name, url: "http://" + freeAddr(t), dataDir: t.TempDir()}
}

// writeConfig writes s's daemon.hcl: its address and data directory, then
// body.
func (s *haServer) writeConfig(t *testing.T, body string) {
	t.Helper()
	s.config = filepath.Join(s.dataDir, "daemon.hcl")
	if err := os.WriteFile(s.config, []byte(devcluster.DaemonConfig(s.url, s.dataDir, body)), 0o600); err != nil {
		t.Fatal(err)
	}
}

// stopOnCleanup stops servers when t ends, logging the tail of each one's
// log (tailLines) when t failed.
func stopOnCleanup(t *testing.T, servers []*haServer, tailLines int) {
	t.Cleanup(func() {
		for _, s := range servers {
			stopServer(s)
			if t.Failed() {
				t.Logf("server %s log (tail):\n%s", s.name, tail(s.logs.String(), tailLines))
			}
		}
	})
}

// haNodeDir is the local provider's state dir for an HA test's nodes. Take
// it before starting the servers: its cleanup, which kills the nodes, then
// runs after theirs (a server still up would replace the killed nodes).
func haNodeDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	t.Cleanup(func() { killAll("local-node", dir) })
	return dir
}

// startHACluster writes three daemon configs (servers a, b, c with
// embedded etcd, the default session TTL 3s) and starts them.
func startHACluster(t *testing.T, bin string) []*haServer {
	t.Helper()
	names := []string{"a", "b", "c"}
	servers := make([]*haServer, len(names))
	for i, n := range names {
		servers[i] = newHAServer(t, n)
	}
	clusters := devcluster.EmbeddedEtcd(names, func() string { return freeAddr(t) }, 3*time.Second)
	for _, s := range servers {
		s.writeConfig(t, "log_level     = \"debug\"\n"+clusters[s.name])
		s.start(t, bin)
	}
	stopOnCleanup(t, servers, 40)
	return servers
}

// TestHAClusterConfigs: the three configs startHACluster (and bench/ha)
// writes are valid daemon.hcl files that name the same etcd members.
func TestHAClusterConfigs(t *testing.T) {
	names := []string{"a", "b", "c"}
	clusters := devcluster.EmbeddedEtcd(names, func() string { return freeAddr(t) }, 3*time.Second)
	var first map[string]string
	for _, n := range names {
		s := newHAServer(t, n)
		cfg, _, diags := fleet.ParseConfig("daemon.hcl", []byte(devcluster.DaemonConfig(s.url, s.dataDir, clusters[n])))
		if diags.HasErrors() {
			t.Fatalf("server %s: %v", n, diags)
		}
		e := cfg.Cluster.Embedded
		if cfg.Listen != strings.TrimPrefix(s.url, "http://") || cfg.AdvertiseURL != s.url || cfg.DataDir != s.dataDir || cfg.Cluster.SessionTTL != "3s" || e.Name != n ||
			e.InitialCluster[n] != e.ListenPeer || len(e.ClientEndpoints) != 3 || !slices.Contains(e.ClientEndpoints, e.ListenClient) {
			t.Errorf("server %s: %+v, cluster %+v", n, cfg, e)
		}
		if first == nil {
			first = e.InitialCluster
		} else if !maps.Equal(first, e.InitialCluster) {
			t.Errorf("server %s: initial_cluster %v, server a's %v", n, e.InitialCluster, first)
		}
	}
}

// waitServing waits until every server answers its API. A server writes
// its token file before it listens, so a CLI call right after the token
// appears may meet a closed port.
func waitServing(t *testing.T, servers []*haServer, token string) {
	t.Helper()
	waitUntil(t, "every server answering", 30*time.Second, func() bool {
		return haProbe.AllAnswer(context.Background(), token, haURLs(servers)...)
	})
}

// haProbe asks the HA tests' servers who leads.
var haProbe = clusterprobe.Probe{Timeout: 2 * time.Second}

// clusterInfo asks one server who leads.
func clusterInfo(s *haServer, token string) (api.ClusterInfo, error) {
	return haProbe.Info(context.Background(), s.url, token)
}

// leaderOf is the leader the first of servers that knows one names, ""
// while none does.
func leaderOf(servers []*haServer, token string) string {
	return haProbe.Leader(context.Background(), token, haURLs(servers)...)
}

func haURLs(servers []*haServer) []string {
	var out []string
	for _, s := range servers {
		out = append(out, s.url)
	}
	return out
}

// TestHAThreeServers runs three `fleetd serve` with embedded etcd: they
// share one admin token and one state; one leads; the CLI talks to a
// follower and sees the leader named; the leader is SIGKILLed while a
// fleet trains; another server leads within seconds, the fleet's nodes
// keep their records (their agents fail over to the other servers), and
// no instance is launched twice.
func TestHAThreeServers(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three daemons with embedded etcd")
	}
	bin := fleetdBinary(t)
	nodeDir := haNodeDir(t)
	servers := startHACluster(t, bin)
	var token string
	waitUntil(t, "the three servers up with one shared token", 60*time.Second, func() bool {
		var toks []string
		for _, s := range servers {
			b, err := os.ReadFile(filepath.Join(s.dataDir, "token"))
			if err != nil {
				return false
			}
			toks = append(toks, strings.TrimSpace(string(b)))
		}
		token = toks[0]
		return toks[0] != "" && toks[0] == toks[1] && toks[1] == toks[2]
	})
	waitServing(t, servers, token)
	var leader string
	waitUntil(t, "a leader", 30*time.Second, func() bool { leader = leaderOf(servers, token); return leader != "" })
	var lead *haServer
	var followers []*haServer
	for _, s := range servers {
		if s.name == leader {
			lead = s
		} else {
			followers = append(followers, s)
		}
	}
	cli := func(addrs string, args ...string) (string, string, int) {
		return runFleetd(t, bin, addrs, token, args...)
	}
	specFile := writeHASpec(t, "ha", nodeDir)
	// Applied through a follower: it forwards to the leader.
	if out, errOut, code := cli(followers[0].url, "apply", "-auto-approve", specFile); code != 0 {
		t.Fatalf("apply through follower %s: exit %d\n%s\n%s", followers[0].name, code, out, errOut)
	}
	var det api.FleetDetail
	running := func(addrs string) bool {
		out, _, code := cli(addrs, "status", "-json", "ha")
		return nodesRunning(out, code, &det, 2)
	}
	waitUntil(t, "2 nodes running", 90*time.Second, func() bool { return running(followers[1].url) })
	before := map[string]string{}
	for _, x := range det.Nodes {
		before[x.ID] = x.InstanceID
	}
	out, _, code := cli(followers[1].url, "status", "-json")
	var st api.Status
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.Leader != leader || st.Server != followers[1].name || len(st.Fleets) != 1 {
		t.Fatalf("status through follower %s: leader %q server %q fleets %d, want leader %s (exit %d)\n%s", followers[1].name, st.Leader, st.Server, len(st.Fleets), leader, code, out)
	}

	// API clients run through everything below; their history is checked
	// for linearizability at the end.
	hist := &apiHistory{start: time.Now()}
	stopClients := make(chan struct{})
	clients := runClients(t, servers[0].url+","+servers[1].url+","+servers[2].url, token, 3, hist, stopClients)

	// SIGKILL the leader, once a follower's probe has reached its API (a
	// follower deposes a leader whose port then refuses connections; one
	// it never reached, it leaves to its lease).
	waitUntil(t, "a follower reaching the leader's API", 15*time.Second, func() bool {
		for _, f := range followers {
			if strings.Contains(f.logs.String(), `msg="leader probe" leader=`+leader) {
				return true
			}
		}
		return false
	})
	killed := time.Now()
	if err := lead.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-lead.done
	lead.done <- nil
	var next string
	waitUntil(t, "a new leader", 30*time.Second, func() bool {
		next = leaderOf(followers, token)
		return next != "" && next != leader
	})
	how := "its lease ran out"
	for _, f := range followers {
		if strings.Contains(f.logs.String(), "the leader's API refuses connections") {
			how = f.name + " deposed it when its port refused connections"
		}
	}
	t.Logf("leader %s SIGKILLed; %s leads %.2fs later (session TTL 3s; %s)", leader, next, time.Since(killed).Seconds(), how)
	rest := followers[0].url + "," + followers[1].url
	// The agents fail over to the remaining servers and keep heartbeating:
	// past dead_after, the same two nodes still run and nothing was
	// launched in their place.
	time.Sleep(25 * time.Second)
	sameNodes := func(when string) {
		t.Helper()
		if !running(rest) {
			t.Fatalf("%s: nodes %+v, want the same 2 running", when, det.Nodes)
		}
		for _, x := range det.Nodes {
			if inst, ok := before[x.ID]; !ok || inst != x.InstanceID {
				t.Errorf("%s: node %s (instance %s) is new or changed; before: %v", when, x.ID, x.InstanceID, before)
			}
		}
		if n := len(procsMatching("local-node", nodeDir)); n != 2 {
			t.Errorf("%s: %d node processes, want 2 (none launched twice)", when, n)
		}
	}
	sameNodes("after the leader was killed")

	// The killed server comes back (its etcd member rejoins) as a follower.
	lead.start(t, bin)
	waitUntil(t, "the restarted server answering as a follower", 60*time.Second, func() bool {
		info, err := clusterInfo(lead, token)
		return err == nil && !info.IsLeader && info.Leader == next
	})

	// SIGSTOP the leader past its session TTL, then SIGCONT: another server
	// leads meanwhile, and the paused one must find itself deposed and act
	// no more (its writes are fenced in any case).
	var paused *haServer
	for _, s := range servers {
		if s.name == next {
			paused = s
		}
	}
	var others []*haServer
	for _, s := range servers {
		if s != paused {
			others = append(others, s)
		}
	}
	if err := paused.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	var third string
	waitUntil(t, "a leader while the old one is paused", 30*time.Second, func() bool {
		third = leaderOf(others, token)
		return third != "" && third != next
	})
	t.Logf("leader %s SIGSTOPped; %s leads %.2fs later", next, third, time.Since(stopped).Seconds())
	time.Sleep(time.Until(stopped.Add(6 * time.Second)))
	if err := paused.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// The resumed server must notice that its term ended (that term's
	// writes are fenced in any case). Leadership may move once more after
	// that — on a loaded machine another server's session can lapse as
	// well, and the resumed server may even win a new term — but every
	// server must then name the same leader.
	waitUntil(t, "the resumed server to know its term ended, and one leader agreed", 30*time.Second, func() bool {
		if !strings.Contains(paused.logs.String(), "leadership lost") {
			return false
		}
		agreed := ""
		for _, s := range servers {
			info, err := clusterInfo(s, token)
			if err != nil || info.Leader == "" || (agreed != "" && info.Leader != agreed) {
				return false
			}
			agreed = info.Leader
		}
		if agreed != third {
			t.Logf("after the resume, %s leads (it was %s during the pause)", agreed, third)
		}
		third = agreed
		return true
	})
	time.Sleep(3 * time.Second)
	rest = others[0].url + "," + others[1].url + "," + paused.url
	sameNodes("after the leader was paused and resumed")
	next = third

	close(stopClients)
	clients.Wait()
	ops, known := hist.check(t)
	t.Logf("linearizability: %d API operations checked (%d with a known outcome) across 2 leader changes", ops, known)

	out, _, _ = cli(rest, "status")
	if !strings.Contains(out, next) {
		t.Errorf("status does not name the new leader %s:\n%s", next, out)
	}
	if out, errOut, code := cli(rest, "destroy", "-auto-approve", "ha"); code != 0 {
		t.Errorf("destroy: exit %d\n%s\n%s", code, out, errOut)
	}
	defer func() {
		if t.Failed() {
			out, errOut, _ := cli(rest, "events")
			t.Logf("events:\n%s\n%s", tail(out, 60), errOut)
		}
	}()
	waitUntil(t, "nodes terminated", 60*time.Second, func() bool { return len(procsMatching("local-node", nodeDir)) == 0 })
}

// nodesRunning decodes the output of `fleetd status -json FLEET` into det
// and reports whether want of its nodes are running.
func nodesRunning(out string, code int, det *api.FleetDetail, want int) bool {
	if code != 0 || json.Unmarshal([]byte(out), det) != nil {
		return false
	}
	n := 0
	for _, x := range det.Nodes {
		if x.State == "running" {
			n++
		}
	}
	return n == want
}

// writeHASpec writes the fleet the HA tests run: two local nodes sleeping
// (the workers' fate is not under test), heartbeats every second, and a
// dead_after long enough that a failover must not cost a node.
func writeHASpec(t *testing.T, name, nodeDir string) string {
	t.Helper()
	spec := fmt.Sprintf(`
fleet %q {
  min_nodes = 2
  max_nodes = 2
  node { gpus = 1 }
  placement { colocate = "region" }
  provider "local" {
    zones     = ["local-a", "local-b"]
    state_dir = %q
  }
  training {
    command     = ["sleep", "600"]
    drain_grace = "5s"
  }
  rendezvous {
    heartbeat  = "1s"
    dead_after = "20s"
  }
}
`, name, nodeDir)
	file := filepath.Join(t.TempDir(), name+".hcl")
	if err := os.WriteFile(file, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}
