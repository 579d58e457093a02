package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleetd/internal/procstat"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/state"
)

// The chaos suite runs a local-provider fleet doing real training
// (examples/trainer/train.py) while a seeded random schedule SIGKILLs the
// daemon, the provider plugin, node agents and workers, and injects spot
// notices. Invariants are checked at every sample and after the run; see
// docs/reliability.md.
//
//	go test -run TestChaos ./cmd/fleetd/                  short run (part of make test)
//	FLEETD_CHAOS_LONG=1 go test -v -run TestChaos ...     long runs (make chaos)
//	-chaos.runs N -chaos.seed S -chaos.faults F           override either

var (
	chaosRuns   = flag.Int("chaos.runs", 0, "chaos runs, seeds seed, seed+1, …; 0: 1, or 3 with FLEETD_CHAOS_LONG=1")
	chaosSeed   = flag.Uint64("chaos.seed", 0, "seed of the first chaos run; 0: 1")
	chaosFaults = flag.Int("chaos.faults", 0, "faults per chaos run; 0: 5, or 14 with FLEETD_CHAOS_LONG=1")
)

// chaosLong reports whether the long versions of the chaos and partition
// suites were asked for (make chaos).
func chaosLong() bool { return os.Getenv("FLEETD_CHAOS_LONG") == "1" }

type faultKind string

const (
	faultDaemon faultKind = "daemon-kill" // SIGKILL fleetd serve, restart it on the same data dir
	faultPlugin faultKind = "plugin-kill" // SIGKILL fleetd plugin provider local
	faultAgent  faultKind = "agent-kill"  // SIGKILL a node's agent: the node is lost
	faultWorker faultKind = "worker-kill" // SIGKILL a node's training worker
	faultNotice faultKind = "notice"      // spot notice through fleetd debug interrupt
)

var allFaults = []faultKind{faultDaemon, faultPlugin, faultAgent, faultWorker, faultNotice}

// chaosConfig sizes one run. Faults are scheduled at seeded training steps
// (so a slow or fast machine gets the same schedule), at least minGap
// apart in time (so the system is mid-recovery, not piled on).
type chaosConfig struct {
	faults            int
	steps             int
	stepTime          float64
	minGap            time.Duration // between fault injections
	from, to          float64       // faults land between these fractions of the steps
	timeout           time.Duration // the whole run, job completion included
	survivalTimeout   time.Duration // a fault not recovered from within this fails the run
	orphanGrace       time.Duration
	maxNodes, desired int
	progressToSurvive int64 // checkpoint steps past the injection that count as training recovered
	ckptEvery         int64
}

func chaosConfigFor(long bool) chaosConfig {
	c := chaosConfig{
		faults: 5, steps: 240, stepTime: 0.05, minGap: 1500 * time.Millisecond, from: 0.05, to: 0.85,
		timeout: 3 * time.Minute, survivalTimeout: 60 * time.Second, orphanGrace: 10 * time.Second,
		maxNodes: 4, desired: 3, progressToSurvive: 3, ckptEvery: 1,
	}
	if long {
		c.faults, c.steps, c.timeout = 14, 900, 8*time.Minute
	}
	if *chaosFaults > 0 {
		c.faults = *chaosFaults
	}
	return c
}

// TestChaos is the chaos suite. Each run is seeded; a failure names its
// seed, and -chaos.seed reproduces its schedule (timing still varies).
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real daemons, nodes and training")
	}
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not found: the chaos suite trains with examples/trainer/train.py")
	}
	bin := fleetdBinary(t)
	runs := *chaosRuns
	if runs <= 0 {
		runs = 1
		if chaosLong() {
			runs = 3
		}
	}
	seed := *chaosSeed
	if seed == 0 {
		seed = 1
	}
	cfg := chaosConfigFor(chaosLong())
	var total chaosTotals
	for i := range runs {
		s := seed + uint64(i)
		t.Run(fmt.Sprintf("seed=%d", s), func(t *testing.T) {
			rep := runChaos(t, bin, cfg, s)
			total.add(rep)
			t.Logf("chaos seed=%d: %s", s, rep.summary())
		})
	}
	t.Logf("chaos total over %d run(s): %s", runs, total.summary())
}

type faultRecord struct {
	kind      faultKind
	at        time.Time
	step      int64  // checkpoint step at injection
	round     int    // rendezvous round at injection
	target    string // node or pid, for the report
	instance  string // the victim's instance (agent-kill, notice)
	node      string
	pid       int
	survived  bool
	recovered time.Duration
}

type chaosReport struct {
	seed      uint64
	planned   int
	faults    []faultRecord
	duration  time.Duration
	rounds    int
	restarts  int // daemon starts after the first
	samples   int
	maxLive   int
	events    int
	finalStep int64
}

func (r chaosReport) counts() (injected, survived int, perKind map[faultKind][2]int) {
	perKind = map[faultKind][2]int{}
	for _, f := range r.faults {
		c := perKind[f.kind]
		c[0]++
		injected++
		if f.survived {
			c[1]++
			survived++
		}
		perKind[f.kind] = c
	}
	return
}

// faultCounts are the faults injected and survived, and per kind
// "KIND survived/injected" in allFaults' order.
func (r chaosReport) faultCounts() (inj, surv int, kinds string) {
	inj, surv, per := r.counts()
	var ks []string
	for _, k := range allFaults {
		if c, ok := per[k]; ok {
			ks = append(ks, fmt.Sprintf("%s %d/%d", k, c[1], c[0]))
		}
	}
	return inj, surv, strings.Join(ks, ", ")
}

func (r chaosReport) summary() string {
	inj, surv, kinds := r.faultCounts()
	return fmt.Sprintf("faults injected: %d of %d planned, survived: %d (%s); final step %d, %d rendezvous rounds, %d events, %d invariant samples, max %d live instances, %s",
		inj, r.planned, surv, kinds, r.finalStep, r.rounds, r.events, r.samples, r.maxLive, r.duration.Round(100*time.Millisecond))
}

type chaosTotals struct{ reports []chaosReport }

func (c *chaosTotals) add(r chaosReport) { c.reports = append(c.reports, r) }

func (c *chaosTotals) summary() string {
	var all chaosReport
	steps := 0
	for _, r := range c.reports {
		all.faults = append(all.faults, r.faults...)
		all.planned += r.planned
		all.duration += r.duration
		all.rounds += r.rounds
		all.events += r.events
		all.samples += r.samples
		all.maxLive = max(all.maxLive, r.maxLive)
		if r.finalStep > 0 {
			steps++
		}
	}
	inj, surv, kinds := all.faultCounts()
	return fmt.Sprintf("faults injected: %d of %d planned, survived: %d (%s); %d of %d jobs completed at their step count, %d rendezvous rounds, %d events, %d invariant samples, max %d live instances, %s",
		inj, all.planned, surv, kinds, steps, len(c.reports), all.rounds, all.events, all.samples, all.maxLive, all.duration.Round(100*time.Millisecond))
}

// chaosSpec is the fleet under test: 3 nodes of a 4-node maximum, many
// zones so that offerings marked interrupted by earlier faults leave
// replacements somewhere to go, and tight timings for one machine.
func chaosSpec(repo, ckpt, prefix string, c chaosConfig, masterPort int) string {
	var zones []string
	for i := range 16 {
		zones = append(zones, fmt.Sprintf("%q", fmt.Sprintf("chaos-%c", 'a'+i)))
	}
	return fmt.Sprintf(`
fleet "chaos" {
  min_nodes     = 2
  max_nodes     = %d
  desired_nodes = %d
  node {
    gpus      = 1
    gpu_types = ["sim-gpu"]
    spot      = true
  }
  placement {
    colocate           = "region"
    on_demand_fallback = "after 20s below min_nodes"
  }
  provider "local" {
    zones          = [%s]
    address_prefix = %q
    instance_types = {
      "sim-gpu-1" = { gpus = 1, gpu_type = "sim-gpu", vcpus = 2, memory_gib = 4, spot_price = 0.35, on_demand_price = 1.10 }
    }
    notice_lead = "5s"
  }
  training {
    command        = ["python3", "examples/trainer/train.py", "--steps", "%d", "--step-time", "%g", "--ckpt-every", "%d", "--op-timeout", "5", "--connect-timeout", "20"]
    workdir        = %q
    nproc_per_node = 1
    max_restarts   = 1000
    master_port    = %d
    drain_grace    = "4s"
    checkpoint_uri = "file://%s"
    env = {
      PYTHONUNBUFFERED = "1"
    }
  }
  rendezvous {
    last_call  = "1s"
    heartbeat  = "1s"
    dead_after = "5s"
  }
}
`, c.maxNodes, c.desired, strings.Join(zones, ", "), prefix, c.steps, c.stepTime, c.ckptEvery, repo, masterPort, ckpt)
}

// runChaos runs one seeded chaos run and fails t if an invariant breaks.
func runChaos(t *testing.T, bin string, c chaosConfig, seed uint64) chaosReport {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	dataDir := filepath.Join(work, "data")
	nodeDir := filepath.Join(dataDir, "local")
	ckpt := filepath.Join(work, "ckpt")
	sessions := map[int]bool{} // node sessions seen, for cleanup
	t.Cleanup(func() { killNodeSessions(nodeDir, sessions) })

	// A loopback block and master port of their own (not from the seed:
	// other runs, maybe of the same seed, may have nodes up too).
	env := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(os.Getpid())))
	prefix := fmt.Sprintf("127.%d.%d.", 100+env.IntN(100), 1+env.IntN(250))
	masterPort := 20000 + env.IntN(20000)
	specFile := filepath.Join(work, "chaos.hcl")
	chaosWriteFile(t, specFile, chaosSpec(repo, ckpt, prefix, c, masterPort))
	conf := filepath.Join(work, "daemon.hcl")
	chaosWriteFile(t, conf, fmt.Sprintf("orphan_grace = %q\n", c.orphanGrace))

	d := newChaosDaemon(t, bin, dataDir, freeAddr(t), "-config", conf)
	if err := d.start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("daemon log tail (%s):\n%s", d.logPath, chaosTail(d.logPath, 60))
		}
	}()
	if out, errOut, code := d.run("apply", "-auto-approve", specFile); code != 0 {
		t.Fatalf("apply: exit %d\n%s\n%s", code, out, errOut)
	}

	start := time.Now()
	rep := chaosReport{seed: seed, planned: c.faults}
	evs := newEventChecker()
	ck := &ckptWatch{path: filepath.Join(ckpt, "checkpoint.json"), every: c.ckptEvery}
	var (
		last      api.FleetDetail // last status seen while the daemon was up
		haveLast  bool
		lastFault time.Time
		lastEvCk  time.Time
		plan      = faultPlan(rng, c)
		victims   = map[string]bool{} // instance ids on their way out because of a fault
		failures  []string
	)
	fail := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		failures = append(failures, msg)
		t.Errorf("seed %d: %s", seed, msg)
		if len(failures) >= 10 {
			t.Fatalf("seed %d: stopping after %d invariant violations", seed, len(failures))
		}
	}

	for {
		if time.Since(start) > c.timeout {
			t.Fatalf("seed %d: the job did not complete within %s (step %d, faults %d); status: %s", seed, c.timeout, ck.step, len(rep.faults), briefStatus(last))
		}
		time.Sleep(200 * time.Millisecond)
		rep.samples++
		step, err := ck.sample()
		if err != nil {
			fail("%v", err)
		}
		procs := scanProcs()
		nodes := localNodes(procs, nodeDir)
		for _, n := range nodes {
			sessions[n.pid] = true
		}

		if det, err := d.client.Fleet(context.Background(), "chaos"); err == nil {
			last, haveLast = det, true
		}
		// Invariant: instances not on their way out never exceed max_nodes.
		leaving := leavingInstances(last, victims)
		live := 0
		for id := range nodes {
			if !leaving[id] {
				live++
			}
		}
		rep.maxLive = max(rep.maxLive, live)
		if live > c.maxNodes {
			fail("%d live instances (%d node processes, %d leaving) > max_nodes %d", live, len(nodes), len(nodes)-live, c.maxNodes)
		}
		// Invariant: after the orphan grace, every instance has a node record.
		// A restarted daemon adopts what exists on its first passes.
		if haveLast && d.upFor() > 6*time.Second {
			recorded := map[string]bool{}
			for _, n := range last.Nodes {
				recorded[n.InstanceID] = true
			}
			for id, n := range nodes {
				if !recorded[id] && n.age > c.orphanGrace+10*time.Second {
					fail("instance %s (pid %d, up %s) has no node record after the orphan grace %s", id, n.pid, n.age.Round(time.Second), c.orphanGrace)
				}
			}
		}
		// Invariant: the event log only grows, without gaps or rewrites.
		if time.Since(lastEvCk) > 2*time.Second {
			if err := evs.poll(d.client); err == nil {
				lastEvCk = time.Now()
			} else if !errors.Is(err, errDaemonDown) {
				fail("%v", err)
			}
		}

		// Recoveries.
		for i := range rep.faults {
			f := &rep.faults[i]
			if f.survived {
				continue
			}
			if faultRecovered(*f, c.progressToSurvive, step, ck.done(), last, nodes, procs, bin, dataDir) {
				f.survived, f.recovered = true, time.Since(f.at)
			} else if time.Since(f.at) > c.survivalTimeout {
				t.Fatalf("seed %d: no recovery %s after %s on %s (step %d then, %d now); status: %s",
					seed, c.survivalTimeout, f.kind, f.target, f.step, step, briefStatus(last))
			}
		}

		if last.Completed {
			break
		}
		// The next fault, once training reached its step.
		if len(plan) > 0 && step >= plan[0].step && time.Since(lastFault) >= c.minGap {
			kind := plan[0].kind
			if kind == faultDaemon {
				// What the log holds right before the crash must all be there after it.
				if err := evs.poll(d.client); err != nil {
					fail("events before the daemon crash: %v", err)
				}
			}
			f, ok, err := injectFault(t, rng, d, kind, bin, dataDir, nodes, procs, last)
			if err != nil {
				fail("inject %s: %v", kind, err)
			}
			if ok {
				f.step, f.at = step, time.Now()
				if last.Rendezvous != nil {
					f.round = last.Rendezvous.Round
				}
				if f.instance != "" {
					victims[f.instance] = true
				}
				rep.faults = append(rep.faults, f)
				plan = plan[1:]
				t.Logf("seed %d t=%5.1fs step %3d: %s %s", seed, time.Since(start).Seconds(), step, kind, f.target)
				if kind == faultDaemon {
					rep.restarts++
					if err := evs.poll(d.client); err != nil {
						fail("events after the daemon restart: %v", err)
					}
				}
			}
			lastFault = time.Now()
		}
	}
	rep.duration = time.Since(start)
	// The loop samples the checkpoint before it reads the status: the
	// last step's checkpoint and the completion can land between the two.
	if _, err := ck.sample(); err != nil {
		fail("%v", err)
	}
	if !last.Succeeded {
		t.Fatalf("seed %d: job completed without success: %s", seed, briefStatus(last))
	}
	for i := range rep.faults {
		f := &rep.faults[i]
		if !f.survived && ck.done() && faultRecovered(*f, c.progressToSurvive, ck.step, true, last, nil, nil, bin, dataDir) {
			f.survived, f.recovered = true, time.Since(f.at)
		}
		if !f.survived {
			fail("fault %s on %s at step %d not recovered from", f.kind, f.target, f.step)
		}
	}
	if last.Rendezvous != nil {
		rep.rounds = last.Rendezvous.Round
	}

	// Invariant: the job's step count is consistent.
	if !ck.done() {
		fail("no DONE marker in %s after completion", ckpt)
	}
	if ck.step != int64(c.steps) {
		fail("final checkpoint step %d, want %d", ck.step, c.steps)
	}
	rep.finalStep = ck.step
	if err := checkStepLogs(nodeDir, c.steps, c.ckptEvery); err != nil {
		fail("worker logs: %v", err)
	}

	// A completed fleet scales to zero: no node may be left behind.
	deadline := time.Now().Add(45 * time.Second)
	for len(localNodes(scanProcs(), nodeDir)) > 0 {
		if time.Now().After(deadline) {
			fail("node processes left %s after completion: %v", 45*time.Second, chaosKeys(localNodes(scanProcs(), nodeDir)))
			break
		}
		time.Sleep(250 * time.Millisecond)
	}

	// The event log through the CLI, as users read it, against all seen.
	if err := evs.poll(d.client); err != nil {
		fail("%v", err)
	}
	cliEvents, err := d.eventsCLI()
	if err != nil {
		t.Fatal(err)
	}
	if err := evs.check(cliEvents); err != nil {
		fail("fleetd events -json: %v", err)
	}
	rep.events = len(cliEvents)

	// Crash the daemon one last time: the state file must open clean.
	d.kill()
	if err := checkStateFile(filepath.Join(dataDir, "state.db"), "chaos", evs); err != nil {
		fail("state file after the last crash: %v", err)
	}
	if len(failures) > 0 {
		for _, f := range rep.faults {
			t.Logf("fault %-11s %-24s step %3d survived=%v after %s", f.kind, f.target, f.step, f.survived, f.recovered.Round(100*time.Millisecond))
		}
	}
	return rep
}

type plannedFault struct {
	kind faultKind
	step int64
}

// faultPlan is the seeded schedule: every kind once (in a seeded order) so
// even the short run covers all of them, then random kinds; each at a
// random training step in [from, to] of the run, in step order.
func faultPlan(rng *rand.Rand, c chaosConfig) []plannedFault {
	var kinds []faultKind
	for _, i := range rng.Perm(len(allFaults)) {
		kinds = append(kinds, allFaults[i])
	}
	for len(kinds) < c.faults {
		kinds = append(kinds, allFaults[rng.IntN(len(allFaults))])
	}
	kinds = kinds[:c.faults]
	lo, hi := int64(c.from*float64(c.steps)), int64(c.to*float64(c.steps))
	steps := make([]int64, len(kinds))
	for i := range steps {
		steps[i] = max(1, lo+rng.Int64N(max(1, hi-lo)))
	}
	slices.Sort(steps)
	out := make([]plannedFault, len(kinds))
	for i := range kinds {
		out[i] = plannedFault{kind: kinds[i], step: steps[i]}
	}
	return out
}

func randDur(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(rng.Int64N(int64(hi-lo)))
}

// injectFault performs one fault. ok is false when there is no target yet
// (e.g. no running worker); the fault is then tried again later.
func injectFault(t *testing.T, rng *rand.Rand, d *chaosDaemon, kind faultKind, bin, dataDir string, nodes map[string]nodeProc, procs []procInfo, last api.FleetDetail) (faultRecord, bool, error) {
	f := faultRecord{kind: kind}
	running := runningNodes(last, nodes)
	switch kind {
	case faultDaemon:
		down := randDur(rng, 200*time.Millisecond, 2*time.Second)
		d.kill()
		time.Sleep(down)
		if err := d.start(); err != nil {
			return f, false, fmt.Errorf("restart: %w", err)
		}
		f.target = fmt.Sprintf("down %s", down.Round(10*time.Millisecond))
		return f, true, nil
	case faultPlugin:
		pids := pluginPids(procs, bin, dataDir)
		if len(pids) == 0 {
			return f, false, nil
		}
		f.pid = pids[0]
		f.target = fmt.Sprintf("pid %d", f.pid)
		return f, true, syscall.Kill(f.pid, syscall.SIGKILL)
	case faultAgent, faultWorker, faultNotice:
		if len(running) == 0 {
			return f, false, nil
		}
		n := running[rng.IntN(len(running))]
		f.node, f.instance = n.ID, n.InstanceID
		np := nodes[n.InstanceID]
		agent := childWith(procs, np.pid, " agent ")
		switch kind {
		case faultAgent:
			if agent == 0 {
				return f, false, nil
			}
			f.pid, f.target = agent, fmt.Sprintf("%s (agent pid %d)", n.ID, agent)
			return f, true, syscall.Kill(agent, syscall.SIGKILL)
		case faultWorker:
			w := childWith(procs, agent, "train.py")
			if agent == 0 || w == 0 {
				return f, false, nil
			}
			f.instance = "" // the node stays
			f.pid, f.target = w, fmt.Sprintf("%s (worker pid %d)", n.ID, w)
			if err := syscall.Kill(w, syscall.SIGKILL); errors.Is(err, syscall.ESRCH) {
				// It ended between the scan and the kill (a round change
				// restarts workers): nothing injected, try again later.
				return f, false, nil
			} else if err != nil {
				return f, false, err
			}
			return f, true, nil
		default:
			lead := randDur(rng, 3*time.Second, 8*time.Second)
			f.target = fmt.Sprintf("%s (lead %s)", n.ID, lead.Round(100*time.Millisecond))
			out, errOut, code := d.run("debug", "interrupt", "-lead", lead.String(), "chaos", n.ID)
			if code != 0 {
				return f, false, fmt.Errorf("debug interrupt: exit %d: %s%s", code, out, errOut)
			}
			return f, true, nil
		}
	}
	return f, false, fmt.Errorf("unknown fault %q", kind)
}

// faultRecovered reports whether the fleet recovered from f: training got
// past the step at injection (or finished), and for node losses a
// replacement launched after the fault is running; a killed plugin has
// been restarted.
func faultRecovered(f faultRecord, progress, step int64, done bool, det api.FleetDetail, nodes map[string]nodeProc, procs []procInfo, bin, dataDir string) bool {
	progressed := done || step >= f.step+progress
	if !progressed {
		return false
	}
	switch f.kind {
	case faultPlugin:
		if done {
			return true
		}
		for _, pid := range pluginPids(procs, bin, dataDir) {
			if pid != f.pid {
				return true
			}
		}
		return false
	case faultAgent, faultNotice:
		if done {
			return true
		}
		if _, alive := nodes[f.instance]; alive {
			return false
		}
		for _, n := range det.Nodes {
			if n.State == state.NodeRunning && n.CreatedAt.After(f.at) {
				return true
			}
		}
		return false
	}
	return true
}

func runningNodes(det api.FleetDetail, nodes map[string]nodeProc) []api.NodeInfo {
	var out []api.NodeInfo
	for _, n := range det.Nodes {
		if _, ok := nodes[n.InstanceID]; ok && n.State == state.NodeRunning {
			out = append(out, n)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// leavingInstances are instances on their way out: fault victims and
// nodes the daemon is draining or terminating (replacements in flight).
func leavingInstances(det api.FleetDetail, victims map[string]bool) map[string]bool {
	out := map[string]bool{}
	for id := range victims {
		out[id] = true
	}
	for _, n := range det.Nodes {
		switch n.State {
		case state.NodeDraining, state.NodeTerminating, state.NodeTerminated, state.NodeFailed:
			out[n.InstanceID] = true
		}
	}
	return out
}

func briefStatus(det api.FleetDetail) string {
	var b strings.Builder
	fmt.Fprintf(&b, "completed=%v succeeded=%v nodes=%v", det.Completed, det.Succeeded, det.NodesByState)
	if r := det.Rendezvous; r != nil {
		fmt.Fprintf(&b, " round=%d %s world=%d", r.Round, r.State, r.WorldSize)
	}
	for _, a := range det.Alerts {
		fmt.Fprintf(&b, " alert[%s: %s]", a.Kind, a.Message)
	}
	return b.String()
}

// --- the daemon process -----------------------------------------------------

// chaosDaemon is `fleetd serve -dev` on a fixed data dir and address that
// can be SIGKILLed and started again any number of times.
type chaosDaemon struct {
	t                    *testing.T
	bin, dataDir, listen string
	extra                []string
	logPath              string
	cmd                  *exec.Cmd
	done                 chan error
	base, token          string
	client               *api.Client
	startedAt            time.Time
	starts               int
}

func newChaosDaemon(t *testing.T, bin, dataDir, listen string, extra ...string) *chaosDaemon {
	d := &chaosDaemon{t: t, bin: bin, dataDir: dataDir, listen: listen, extra: extra,
		logPath: filepath.Join(filepath.Dir(dataDir), "daemon.log")}
	t.Cleanup(d.kill)
	return d
}

var errDaemonDown = errors.New("daemon down")

func (d *chaosDaemon) start() error {
	logf, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "===== start %d at %s\n", d.starts+1, time.Now().Format(time.RFC3339Nano))
	cmd, done, base, token, err := serveDev(d.bin, "", d.listen, d.dataDir, logf, d.extra...)
	if cmd != nil {
		d.cmd, d.done = cmd, done
	}
	if err != nil {
		return fmt.Errorf("%w\n%s", err, chaosTail(d.logPath, 30))
	}
	d.base, d.token = base, token
	d.client, err = api.NewClient(d.base, api.ClientOptions{Token: d.token, Timeout: 5 * time.Second})
	if err != nil {
		return err
	}
	for range 200 {
		if healthy(d.base) {
			d.startedAt = time.Now()
			d.starts++
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("daemon not healthy\n%s", chaosTail(d.logPath, 30))
}

// kill SIGKILLs the daemon (a crash, not a shutdown: a -dev daemon that
// stops gracefully would terminate its nodes).
func (d *chaosDaemon) kill() {
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	select {
	case <-d.done:
	default:
		_ = d.cmd.Process.Signal(syscall.SIGKILL)
		<-d.done
	}
	d.cmd = nil
	d.startedAt = time.Time{}
}

// upFor is how long the current daemon process has been serving.
func (d *chaosDaemon) upFor() time.Duration {
	if d.startedAt.IsZero() {
		return 0
	}
	return time.Since(d.startedAt)
}

// run runs a CLI command against the daemon.
func (d *chaosDaemon) run(args ...string) (string, string, int) {
	cmd := exec.Command(d.bin, args...)
	cmd.Env = append(os.Environ(), "FLEETD_ADDR="+d.base, "FLEETD_TOKEN="+d.token)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return out.String(), errb.String(), ee.ExitCode()
	case err != nil:
		return out.String(), err.Error(), -1
	}
	return out.String(), errb.String(), 0
}

// eventsCLI reads the whole event log with `fleetd events -json`.
func (d *chaosDaemon) eventsCLI() ([]state.Event, error) {
	out, errOut, code := d.run("events", "-json")
	if code != 0 {
		return nil, fmt.Errorf("fleetd events -json: exit %d: %s", code, errOut)
	}
	var evs []state.Event
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var e state.Event
		if err := dec.Decode(&e); err != nil {
			return nil, fmt.Errorf("fleetd events -json: %w", err)
		}
		evs = append(evs, e)
	}
	return evs, nil
}

// --- invariants ---------------------------------------------------------------

// eventChecker remembers every event seen and checks that later reads of
// the log (across daemon crashes) keep them all, unchanged, in order, with
// sequence numbers that have no gaps.
type eventChecker struct {
	seen map[uint64]string // seq → canonical JSON
	max  uint64
}

func newEventChecker() *eventChecker { return &eventChecker{seen: map[uint64]string{}} }

// poll reads the whole log through the API and checks it.
func (c *eventChecker) poll(cl *api.Client) error {
	if cl == nil {
		return errDaemonDown
	}
	var all []state.Event
	var since uint64
	for range 1000 {
		r, err := cl.Events(context.Background(), since, 1000, 0)
		if err != nil {
			return fmt.Errorf("%w: %v", errDaemonDown, err)
		}
		all = append(all, r.Events...)
		if len(r.Events) < 1000 {
			break
		}
		since = r.Next
	}
	return c.check(all)
}

func (c *eventChecker) check(all []state.Event) error {
	for i, e := range all {
		if i > 0 && e.Seq != all[i-1].Seq+1 {
			return fmt.Errorf("event log: seq %d follows %d (gap or reorder)", e.Seq, all[i-1].Seq)
		}
		if i == 0 && e.Seq != 1 {
			return fmt.Errorf("event log starts at seq %d, want 1", e.Seq)
		}
		b, _ := json.Marshal(e)
		if prev, ok := c.seen[e.Seq]; ok && prev != string(b) {
			return fmt.Errorf("event %d changed:\nbefore %s\nnow    %s", e.Seq, prev, b)
		}
		c.seen[e.Seq] = string(b)
	}
	var n uint64
	if len(all) > 0 {
		n = all[len(all)-1].Seq
	}
	if n < c.max {
		return fmt.Errorf("event log lost events: last seq %d, but %d was seen before", n, c.max)
	}
	c.max = n
	return nil
}

// ckptWatch samples the trainer's checkpoint: its step may only go back by
// less than the checkpoint interval (a rank 0 killed between a step and
// its save), never more.
type ckptWatch struct {
	path  string
	every int64
	step  int64
}

func (w *ckptWatch) sample() (int64, error) {
	b, err := os.ReadFile(w.path)
	if err != nil {
		return w.step, nil // not written yet
	}
	var ck struct {
		Step int64 `json:"step"`
	}
	if err := json.Unmarshal(b, &ck); err != nil {
		return w.step, fmt.Errorf("checkpoint %s: %v (writes must be atomic)", w.path, err)
	}
	if ck.Step < w.step-w.every {
		return w.step, fmt.Errorf("checkpoint went back from step %d to %d", w.step, ck.Step)
	}
	w.step = max(w.step, ck.Step)
	return w.step, nil
}

func (w *ckptWatch) done() bool {
	_, err := os.Stat(filepath.Join(filepath.Dir(w.path), "DONE"))
	return err == nil
}

// checkStepLogs reads every round's rank-0 worker log from the node
// directories: within a round steps go up by one; a round resumes at most
// the checkpoint interval behind the furthest step of the rounds before it
// (from the checkpoint, not from 0); and the last step is the configured one.
func checkStepLogs(nodeDir string, steps int, every int64) error {
	type roundLog struct {
		round          int
		resume, maxStp int64
		stepped        bool
	}
	rounds := map[int]*roundLog{}
	err := filepath.WalkDir(nodeDir, func(path string, de fs.DirEntry, err error) error {
		if err != nil || de.IsDir() || de.Name() != "rank-0.log" {
			return nil
		}
		rn, ok := strings.CutPrefix(filepath.Base(filepath.Dir(path)), "round-")
		if !ok {
			return nil
		}
		r, err := strconv.Atoi(rn)
		if err != nil {
			return nil
		}
		if rounds[r] != nil {
			return fmt.Errorf("round %d has two rank-0 logs", r)
		}
		rl := &roundLog{round: r}
		rounds[r] = rl
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		var prev int64 = -1
		for sc.Scan() {
			var ev struct {
				Event string `json:"event"`
				Step  int64  `json:"step"`
			}
			if json.Unmarshal(sc.Bytes(), &ev) != nil {
				continue // tracebacks and other text
			}
			switch ev.Event {
			case "resume":
				rl.resume, prev = ev.Step, ev.Step
			case "step":
				if prev >= 0 && ev.Step != prev+1 {
					return fmt.Errorf("round %d: step %d after %d", r, ev.Step, prev)
				}
				if prev < 0 && ev.Step != rl.resume+1 {
					return fmt.Errorf("round %d: first step %d without resuming from %d", r, ev.Step, ev.Step-1)
				}
				prev, rl.stepped = ev.Step, true
				rl.maxStp = max(rl.maxStp, ev.Step)
			}
		}
		return sc.Err()
	})
	if err != nil {
		return err
	}
	if len(rounds) == 0 {
		return errors.New("no rank-0 worker logs found")
	}
	var order []int
	for r := range rounds {
		order = append(order, r)
	}
	slices.Sort(order)
	var best int64
	for _, r := range order {
		rl := rounds[r]
		if !rl.stepped && rl.resume == 0 {
			continue // the round broke before training
		}
		if rl.resume < best-every {
			return fmt.Errorf("round %d resumed at step %d, but step %d was reached before (checkpoint every %d)", r, rl.resume, best, every)
		}
		best = max(best, rl.maxStp, rl.resume)
	}
	if best != int64(steps) {
		return fmt.Errorf("workers reached step %d, want %d", best, steps)
	}
	return nil
}

// checkStateFile opens the state file the way the daemon does (every page
// verified), reads everything, and compares its event log with what the
// API showed.
func checkStateFile(path, fleetName string, evs *eventChecker) error {
	st, err := state.Open(path, state.Options{LockTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer st.Close()
	ctx := context.Background()
	err = st.View(ctx, func(tx state.Tx) error {
		fleets, err := tx.Fleets()
		if err != nil {
			return err
		}
		for _, f := range fleets {
			if _, err := tx.Nodes(f.Name); err != nil {
				return err
			}
			if f.Name == fleetName && !(f.Completed && f.Succeeded) {
				return fmt.Errorf("fleet %s: completed=%v succeeded=%v in the state file", f.Name, f.Completed, f.Succeeded)
			}
		}
		if _, err := tx.Offerings(); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	all, err := st.Events(ctx, 0, 0)
	if err != nil {
		return err
	}
	if uint64(len(all)) < evs.max {
		return fmt.Errorf("state file holds %d events, the API showed %d", len(all), evs.max)
	}
	return evs.check(all)
}

// --- processes ----------------------------------------------------------------

type procInfo struct {
	pid, ppid, sid int
	start          uint64 // clock ticks after boot
	cmd            string
}

// scanProcs reads every live (non-zombie) process from /proc.
func scanProcs() []procInfo {
	var out []procInfo
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := procstat.Read(pid)
		if err != nil || st.State == 'Z' {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		out = append(out, procInfo{pid: pid, ppid: st.PPid, sid: st.Session, start: st.Start, cmd: strings.ReplaceAll(string(cmdline), "\x00", " ")})
	}
	return out
}

type nodeProc struct {
	pid int
	age time.Duration
}

// localNodes maps instance id → the node supervisor (`fleetd local-node
// -dir <nodeDir>/instances/<id>`) of this data dir.
func localNodes(procs []procInfo, nodeDir string) map[string]nodeProc {
	out := map[string]nodeProc{}
	marker := filepath.Join(nodeDir, "instances") + string(filepath.Separator)
	up := uptime()
	for _, p := range procs {
		if !strings.Contains(p.cmd, " local-node ") {
			continue
		}
		_, rest, ok := strings.Cut(p.cmd, marker)
		if !ok {
			continue
		}
		id, _, _ := strings.Cut(rest, " ")
		id = strings.TrimRight(id, "/")
		out[id] = nodeProc{pid: p.pid, age: up - time.Duration(p.start)*time.Second/100}
	}
	return out
}

func uptime() time.Duration {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	s, _ := strconv.ParseFloat(f[0], 64)
	return time.Duration(s * float64(time.Second))
}

// childWith returns a child of parent whose command line contains needle.
func childWith(procs []procInfo, parent int, needle string) int {
	if parent == 0 {
		return 0
	}
	for _, p := range procs {
		if p.ppid == parent && strings.Contains(p.cmd, needle) {
			return p.pid
		}
	}
	return 0
}

// pluginPids returns the local provider plugin processes of the daemon
// owning dataDir (they carry it in their environment).
func pluginPids(procs []procInfo, bin, dataDir string) []int {
	var out []int
	for _, p := range procs {
		if !strings.Contains(p.cmd, bin) || !strings.Contains(p.cmd, "plugin provider local") {
			continue
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p.pid))
		if err == nil && bytes.Contains(env, []byte(dataDir)) {
			out = append(out, p.pid)
		}
	}
	return out
}

// killNodeSessions SIGKILLs every process of every node session seen, and
// any process still naming nodeDir: node supervisors, agents, workers.
func killNodeSessions(nodeDir string, sessions map[int]bool) {
	for _, p := range scanProcs() {
		if sessions[p.sid] || (strings.Contains(p.cmd, nodeDir) && p.pid != os.Getpid()) {
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
	}
}

func chaosKeys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func chaosWriteFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func chaosTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestChaosInvariantCheckers shows the chaos suite's checks fail on what
// they are meant to catch (they run on the real processes' output above).
func TestChaosInvariantCheckers(t *testing.T) {
	stepLines := func(resume int64, from, to int64) string {
		var b strings.Builder
		if resume >= 0 {
			fmt.Fprintf(&b, `{"event":"resume","rank":0,"step":%d}`+"\n", resume)
		}
		for s := from; s <= to; s++ {
			fmt.Fprintf(&b, `{"event":"step","step":%d,"rank":0}`+"\n", s)
		}
		return b.String()
	}
	type round struct {
		node, log string
		n         int
	}
	for _, tc := range []struct {
		name   string
		rounds []round
		want   string // error substring; "" for none
	}{
		{"resumes from the checkpoint", []round{{"i-1", stepLines(-1, 1, 40), 1}, {"i-2", stepLines(40, 41, 100), 2}}, ""},
		{"resume one step behind (rank 0 killed before its save)", []round{{"i-1", stepLines(-1, 1, 40), 1}, {"i-2", stepLines(39, 40, 100), 3}}, ""},
		{"a round broken before training is skipped", []round{{"i-1", stepLines(-1, 1, 40), 1}, {"i-2", `{"event":"start"}`, 2}, {"i-1", stepLines(40, 41, 100), 3}}, ""},
		{"restarted from scratch", []round{{"i-1", stepLines(-1, 1, 40), 1}, {"i-2", stepLines(-1, 1, 100), 2}}, "round 2 resumed at step 0"},
		{"resumed too far back", []round{{"i-1", stepLines(-1, 1, 40), 1}, {"i-2", stepLines(30, 31, 100), 2}}, "resumed at step 30"},
		{"a step skipped", []round{{"i-1", stepLines(-1, 1, 40) + stepLines(-1, 42, 100), 1}}, "step 42 after 40"},
		{"short of the target", []round{{"i-1", stepLines(-1, 1, 99), 1}}, "reached step 99, want 100"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, r := range tc.rounds {
				p := filepath.Join(dir, "instances", r.node, "root", "var", "log", "fleetd", fmt.Sprintf("round-%d", r.n), "rank-0.log")
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				chaosWriteFile(t, p, r.log)
			}
			err := checkStepLogs(dir, 100, 1)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}

	ev := func(seq uint64, msg string) state.Event {
		return state.Event{Seq: seq, Time: time.Unix(int64(seq), 0).UTC(), Type: "test", Message: msg}
	}
	for _, tc := range []struct {
		name  string
		reads [][]state.Event
		want  string
	}{
		{"growing log", [][]state.Event{{ev(1, "a"), ev(2, "b")}, {ev(1, "a"), ev(2, "b"), ev(3, "c")}}, ""},
		{"gap", [][]state.Event{{ev(1, "a"), ev(3, "c")}}, "seq 3 follows 1"},
		{"reordered", [][]state.Event{{ev(2, "b"), ev(1, "a")}}, "starts at seq 2"},
		{"lost after a restart", [][]state.Event{{ev(1, "a"), ev(2, "b"), ev(3, "c")}, {ev(1, "a"), ev(2, "b")}}, "lost events"},
		{"rewritten", [][]state.Event{{ev(1, "a"), ev(2, "b")}, {ev(1, "a"), ev(2, "B")}}, "event 2 changed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newEventChecker()
			var err error
			for _, r := range tc.reads {
				if err = c.check(r); err != nil {
					break
				}
			}
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
