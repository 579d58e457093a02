package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
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

// startHACluster writes three daemon configs (servers a, b, c with
// embedded etcd, the default session TTL 3s) and starts them.
func startHACluster(t *testing.T, bin string) []*haServer {
	t.Helper()
	names := []string{"a", "b", "c"}
	peers, clients := map[string]string{}, []string{}
	servers := make([]*haServer, len(names))
	for i, n := range names {
		peers[n] = "http://" + freeAddr(t)
		clients = append(clients, "http://"+freeAddr(t))
		servers[i] = &haServer{name: n, url: "http://" + freeAddr(t), dataDir: t.TempDir()}
	}
	var initial []string
	for _, n := range names {
		initial = append(initial, fmt.Sprintf("%s = %q", n, peers[n]))
	}
	for i, s := range servers {
		cfg := fmt.Sprintf(`
listen        = %q
advertise_url = %q
data_dir      = %q
log_level     = "debug"
cluster {
  session_ttl = "3s"
  embedded_etcd {
    name             = %q
    listen_peer      = %q
    listen_client    = %q
    initial_cluster  = { %s }
    client_endpoints = [%q, %q, %q]
  }
}
`, strings.TrimPrefix(s.url, "http://"), s.url, s.dataDir, s.name, peers[s.name], clients[i], strings.Join(initial, ", "), clients[0], clients[1], clients[2])
		s.config = filepath.Join(s.dataDir, "daemon.hcl")
		if err := os.WriteFile(s.config, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		s.start(t, bin)
	}
	t.Cleanup(func() {
		for _, s := range servers {
			if s.alive() {
				_ = s.cmd.Process.Signal(syscall.SIGTERM)
				select {
				case <-s.done:
				case <-time.After(20 * time.Second):
					_ = s.cmd.Process.Kill()
				}
			}
			if t.Failed() {
				t.Logf("server %s log (tail):\n%s", s.name, tail(s.logs.String(), 40))
			}
		}
	})
	return servers
}

// waitServing waits until every server answers its API. A server writes
// its token file before it listens, so a CLI call right after the token
// appears may meet a closed port.
func waitServing(t *testing.T, servers []*haServer, token string) {
	t.Helper()
	waitUntil(t, "every server answering", 30*time.Second, func() bool {
		for _, s := range servers {
			if _, err := clusterInfo(s, token); err != nil {
				return false
			}
		}
		return true
	})
}

// clusterInfo asks one server who leads.
func clusterInfo(s *haServer, token string) (api.ClusterInfo, error) {
	key := s.url + " " + token
	c, ok := clusterClients.Load(key)
	if !ok {
		cl, err := api.NewClient(s.url, api.ClientOptions{Token: token, Timeout: 2 * time.Second})
		if err != nil {
			return api.ClusterInfo{}, err
		}
		c, _ = clusterClients.LoadOrStore(key, cl)
	}
	return c.(*api.Client).Cluster(context.Background())
}

// clusterClients are clusterInfo's clients by server URL and token: one
// connection pool per server, not one per question.
var clusterClients sync.Map

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
	leaderOf := func(among []*haServer) string {
		for _, s := range among {
			if info, err := clusterInfo(s, token); err == nil && info.Leader != "" {
				return info.Leader
			}
		}
		return ""
	}
	var leader string
	waitUntil(t, "a leader", 30*time.Second, func() bool { leader = leaderOf(servers); return leader != "" })
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
	nodeDir := t.TempDir()
	t.Cleanup(func() { killAll("local-node", nodeDir) })
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
		next = leaderOf(followers)
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
		third = leaderOf(others)
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
