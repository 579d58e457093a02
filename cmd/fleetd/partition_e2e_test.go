package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/state"
)

// faultProxy is a TCP proxy the test controls, standing between the node
// agents and the daemon (the daemon advertises the proxy's address to its
// nodes). Cut blackholes the link: bytes on existing and new connections
// are swallowed, nothing is answered and nothing is refused, as when a
// network partition drops packets. Heal restores forwarding for new
// connections and resets the ones that lived through the cut (their TCP
// state would have timed out on a real network).
type faultProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cond  *sync.Cond
	cut   bool
	epoch int // bumped by every Cut; connections from older epochs die at Heal
	conns map[*proxyConn]bool
	wg    sync.WaitGroup

	swallowed int64 // bytes dropped while cut
}

type proxyConn struct {
	client, server net.Conn
	epoch          int
	bornCut        bool
}

func startFaultProxy(t *testing.T, target string) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{ln: ln, target: target, conns: map[*proxyConn]bool{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *faultProxy) addr() string { return p.ln.Addr().String() }

func (p *faultProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			c.Close() // the daemon is down: the peer sees a reset, as it would
			continue
		}
		p.mu.Lock()
		pc := &proxyConn{client: c, server: s, epoch: p.epoch, bornCut: p.cut}
		p.conns[pc] = true
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(pc, c, s)
		go p.pipe(pc, s, c)
	}
}

// pipe copies src to dst while the link is up. Bytes read during a cut
// are dropped; a connection that saw a cut is closed when it heals.
func (p *faultProxy) pipe(pc *proxyConn, src, dst net.Conn) {
	defer p.wg.Done()
	defer p.drop(pc)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			if p.cut {
				p.swallowed += int64(n)
			}
			stale := pc.bornCut || pc.epoch != p.epoch
			blackholed := p.cut
			p.mu.Unlock()
			if stale && !blackholed {
				return
			}
			if !blackholed {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *faultProxy) drop(pc *proxyConn) {
	pc.client.Close()
	pc.server.Close()
	p.mu.Lock()
	delete(p.conns, pc)
	p.mu.Unlock()
}

// Cut starts the partition.
func (p *faultProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	p.epoch++
}

// Heal ends it: connections that saw the cut are reset.
func (p *faultProxy) Heal() {
	p.mu.Lock()
	p.cut = false
	var stale []*proxyConn
	for pc := range p.conns {
		if pc.bornCut || pc.epoch != p.epoch {
			stale = append(stale, pc)
		}
	}
	p.mu.Unlock()
	for _, pc := range stale {
		pc.client.Close()
		pc.server.Close()
	}
}

func (p *faultProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for pc := range p.conns {
		pc.client.Close()
		pc.server.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func partitionSpec(repo, ckpt, prefix string, steps, masterPort int, deadAfter time.Duration) string {
	return localFleet{name: "part", sizes: `
  min_nodes     = 2
  max_nodes     = 3
  desired_nodes = 3`, provider: fmt.Sprintf(`
    zones          = ["part-a", "part-b"]
    address_prefix = %q`, prefix), training: fmt.Sprintf(`
    command        = ["python3", "examples/trainer/train.py", "--steps", "%d", "--step-time", "0.05", "--op-timeout", "5", "--ckpt-every", "1"]
    workdir        = %q
    nproc_per_node = 1
    max_restarts   = 100
    master_port    = %d
    drain_grace    = "4s"
    checkpoint_uri = "file://%s"`, steps, repo, masterPort, ckpt), rendezvous: fmt.Sprintf(`
    last_call  = "1s"
    heartbeat  = "1s"
    dead_after = %q`, deadAfter)}.hcl()
}

// TestPartitionAgentsFromDaemon cuts the link between the nodes' agents
// and the daemon (a blackholing proxy; the daemon advertises the proxy to
// its nodes) for less than dead_after: training goes on through the cut,
// no node is replaced or dropped from its round, and after the heal every
// agent is back in touch with the daemon. The long version (make chaos)
// repeats the cut and adds one longer than dead_after: the members are
// dropped and re-join, and still no node is replaced.
func TestPartitionAgentsFromDaemon(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a real daemon, nodes and training")
	}
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not found")
	}
	bin := fleetdBinary(t)
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	const deadAfter = 12 * time.Second
	// The agent retries at most 5 s apart: a cut of 4 s leaves it silent
	// for at most about 4 + 5 + 1 (heartbeat) = 10 s < dead_after.
	cuts := []time.Duration{4 * time.Second}
	steps := 300
	if chaosLong() {
		cuts = []time.Duration{4 * time.Second, 2 * time.Second, 4 * time.Second, deadAfter + 6*time.Second}
		// The job must outlast every cut (56 s at up to 20 steps a second,
		// the spans before them included): a job that finishes during the
		// long cut would leave nothing to drop and re-join.
		steps = 1500
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	work := t.TempDir()
	dataDir := filepath.Join(work, "data")
	nodeDir := filepath.Join(dataDir, "local")
	ckpt := filepath.Join(work, "ckpt")
	sessions := map[int]bool{}
	t.Cleanup(func() { killNodeSessions(nodeDir, sessions) })

	listen := freeAddr(t)
	proxy := startFaultProxy(t, listen)
	conf := filepath.Join(work, "daemon.hcl")
	chaosWriteFile(t, conf, fmt.Sprintf("advertise_url = %q\n", "http://"+proxy.addr()))
	specFile := filepath.Join(work, "part.hcl")
	prefix := fmt.Sprintf("127.%d.%d.", 100+rng.IntN(100), 1+rng.IntN(250))
	chaosWriteFile(t, specFile, partitionSpec(repo, ckpt, prefix, steps, 20000+rng.IntN(20000), deadAfter))

	d := newChaosDaemon(t, bin, dataDir, listen, "-config", conf)
	if err := d.start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("daemon log tail:\n%s", chaosTail(d.logPath, 60))
			// The daemon logs little at info; its events say why a node came or went.
			out, errOut, _ := d.run("events", "-fleet", "part")
			t.Logf("events:\n%s%s", out, errOut)
		}
	}()
	if out, errOut, code := d.run("apply", "-auto-approve", specFile); code != 0 {
		t.Fatalf("apply: exit %d\n%s\n%s", code, out, errOut)
	}
	ck := &ckptWatch{path: filepath.Join(ckpt, "checkpoint.json"), every: 1}
	fleetNow := func() api.FleetDetail {
		det, err := d.client.Fleet(context.Background(), "part")
		if err != nil {
			t.Fatalf("status: %v", err)
		}
		for _, n := range localNodes(scanProcs(), nodeDir) {
			sessions[n.pid] = true
		}
		return det
	}
	var det api.FleetDetail
	waitUntil(t, "3 running nodes training at world size 3", 90*time.Second, func() bool {
		det = fleetNow()
		step, _ := ck.sample()
		r := det.Rendezvous
		return det.NodesByState["running"] == 3 && r != nil && r.State == "closed" && r.WorldSize == 3 && step >= 5
	})
	type nodeKey struct{ id, instance string }
	before := map[nodeKey]bool{}
	for _, n := range det.Nodes {
		before[nodeKey{n.ID, n.InstanceID}] = true
	}

	for i, cut := range cuts {
		short := cut < deadAfter
		round := det.Rendezvous.Round
		// The same span before the cut, as the baseline of training speed.
		base0, _ := ck.sample()
		time.Sleep(cut)
		step0, _ := ck.sample()
		cutAt := time.Now()
		proxy.Cut()
		// Training needs nothing from the daemon: workers talk to each
		// other directly. Sample the checkpoint through the cut.
		for time.Since(cutAt) < cut {
			time.Sleep(200 * time.Millisecond)
			if _, err := ck.sample(); err != nil {
				t.Fatal(err)
			}
		}
		step1, _ := ck.sample()
		proxy.Heal()
		healAt := time.Now()
		t.Logf("cut %d: %s; %d steps in the %s before it, %d during it", i+1, cut, step0-base0, cut, step1-step0)
		if short && !ck.done() && step1 <= step0 {
			t.Fatalf("cut %d (%s): training made no progress during the cut (step %d)", i+1, cut, step1)
		}
		// Converged: every node re-registered after the heal, all running.
		waitUntil(t, "every agent back in touch after the heal", 45*time.Second, func() bool {
			det = fleetNow()
			if det.Completed {
				return true
			}
			back := 0
			for _, n := range det.Nodes {
				if n.State == state.NodeRunning && n.LastHeartbeat != nil && n.LastHeartbeat.After(healAt) {
					back++
				}
			}
			r := det.Rendezvous
			return back == 3 && r != nil && r.State == "closed" && r.WorldSize == 3
		})
		t.Logf("cut %d: converged %.1fs after the heal (round %d → %d)", i+1, time.Since(healAt).Seconds(), round, det.Rendezvous.Round)
		if !short && (det.Completed || det.Rendezvous.Round == round) {
			t.Fatalf("cut %d (%s > dead_after %s): job finished %v, round %d → %d; want the members dropped and re-joined while the job trains",
				i+1, cut, deadAfter, det.Completed, round, det.Rendezvous.Round)
		}
		// No node replaced: the same node records with the same instances.
		after := map[nodeKey]bool{}
		for _, n := range det.Nodes {
			after[nodeKey{n.ID, n.InstanceID}] = true
		}
		if len(after) != len(before) {
			var states []string
			for _, n := range det.Nodes {
				states = append(states, fmt.Sprintf("%s %s %s (%s)", n.ID, n.InstanceID, n.State, n.Reason))
			}
			t.Fatalf("cut %d: node records changed: before %v, after %v; now %v", i+1, before, after, states)
		}
		for k := range before {
			if !after[k] {
				t.Fatalf("cut %d: node %s (instance %s) was replaced", i+1, k.id, k.instance)
			}
		}
		if short && !det.Completed && det.Rendezvous.Round != round {
			t.Fatalf("cut %d (%s < dead_after %s): rendezvous round changed %d → %d", i+1, cut, deadAfter, round, det.Rendezvous.Round)
		}
		// A loaded machine may let the job finish meanwhile: then the nodes
		// are gone by design.
		if n := len(localNodes(scanProcs(), nodeDir)); n != 3 && !det.Completed {
			t.Fatalf("cut %d: %d node processes, want 3", i+1, n)
		}
	}
	t.Logf("proxy swallowed %d bytes during the cuts", proxy.swallowed)

	waitUntil(t, "the job to complete", 3*time.Minute, func() bool {
		det = fleetNow()
		_, _ = ck.sample()
		return det.Completed
	})
	if !det.Succeeded || !ck.done() || ck.step != int64(steps) {
		t.Fatalf("job: succeeded=%v DONE=%v final step %d (want %d)", det.Succeeded, ck.done(), ck.step, steps)
	}
	if err := checkStepLogs(nodeDir, steps, 1); err != nil {
		t.Fatalf("worker logs: %v", err)
	}
	d.kill()
}
