package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
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

	"github.com/fleetd/fleetd/internal/freeport"
	"github.com/fleetd/fleetd/rendezvous"
)

func TestWorkerOutputReattach(t *testing.T) {
	dir := t.TempDir()
	s := &supervisor{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	open := func(name string) *os.File {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	w := &worker{rank: 1}
	o := s.newOutput()
	o.attach(open("round-1.log"), 1, w)
	o.write([]byte("one\n" + elasticLinePrefix + `,"what":"hello"}` + "\ntw"))
	if !w.elastic.Load() {
		t.Error("the hello line did not mark the worker")
	}
	o.reattach(open("round-2.log"), 2, 4) // mid-line: switches after it
	o.write([]byte("o\nthree\nfo"))
	o.write([]byte("ur\n"))
	o.reattach(open("round-3.log"), 3, 5) // at a line boundary: at once
	o.write([]byte("five\n"))
	o.close()
	for name, want := range map[string]string{
		"round-1.log": "one\n" + elasticLinePrefix + `,"what":"hello"}` + "\ntwo\n",
		"round-2.log": "three\nfour\n",
		"round-3.log": "five\n",
	} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(b) != want {
			t.Errorf("%s: %q, %v; want %q", name, b, err, want)
		}
	}
	if o.round != 3 || o.rank != 5 {
		t.Errorf("output attributed to round %d rank %d, want 3 and 5", o.round, o.rank)
	}
}

func TestInProcessEnvironment(t *testing.T) {
	t.Setenv("FLEETD_TEST_AGENT_ONLY", "not for the channel")
	t.Setenv(EnvElastic, "leaked")
	t.Setenv(EnvElasticFile, "/leaked")
	s := &supervisor{logDir: "/logs", fleet: "f", node: "n", drainFile: "/w/drain.json", requestFile: "/w/req.json",
		elasticFile: "/w/elastic.json", helperDir: "/w/python"}
	tc := TrainingConfig{Command: []string{"python3", "t.py"}, NprocPerNode: 2, MaxRestarts: 3, Elastic: ElasticInProcess,
		Env: map[string]string{"PYTHONPATH": "/spec/lib"}}
	a := rendezvous.Assignment{Round: 4, RunID: "run", GroupRank: 1, GroupWorldSize: 2, RankOffset: 2, LocalWorldSize: 2,
		WorldSize: 4, MasterAddr: "10.0.0.1", MasterPort: 29503}
	env := s.roundEnv(a, tc, 0, 1)
	for k, want := range map[string]string{
		"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "GROUP_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29503",
		EnvRound: "4", EnvElastic: ElasticInProcess, EnvElasticFile: "/w/elastic.json", "TORCHELASTIC_RUN_ID": "run",
		"TORCHELASTIC_ERROR_FILE": "/logs/round-4/rank-3.error.json", EnvCheckpointDone: "/logs/round-4/rank-3.checkpoint",
	} {
		if env[k] != want {
			t.Errorf("round env %s=%q, want %q", k, env[k], want)
		}
	}
	for _, k := range []string{"FLEETD_TEST_AGENT_ONLY", "PYTHONPATH", "PATH", EnvResumeStep} {
		if v, ok := env[k]; ok {
			t.Errorf("round env has %s=%q: only the round's and fleetd's variables belong there", k, v)
		}
	}
	full := envMap(workerEnv(s.envParams(a, tc, 0, "/logs/round-4"), 1))
	if full["PYTHONPATH"] != "/w/python:/spec/lib" || full[EnvElastic] != ElasticInProcess || full[EnvElasticFile] != "/w/elastic.json" {
		t.Errorf("in-process worker env: PYTHONPATH=%q %s=%q %s=%q", full["PYTHONPATH"], EnvElastic, full[EnvElastic], EnvElasticFile, full[EnvElasticFile])
	}
	tc.Elastic = ""
	full = envMap(workerEnv(s.envParams(a, tc, 0, "/logs/round-4"), 1))
	if _, ok := full[EnvElastic]; ok || full[EnvElasticFile] != "" || full["PYTHONPATH"] != "/spec/lib" {
		t.Errorf("restart-mode worker env: %s=%q %s=%q PYTHONPATH=%q", EnvElastic, full[EnvElastic], EnvElasticFile, full[EnvElasticFile], full["PYTHONPATH"])
	}
}

// ipEvent is one JSON line of examples/pytorch/elastic_train.py or of
// fleetd_elastic.
type ipEvent struct {
	Event     string  `json:"event"`
	What      string  `json:"what"`
	Time      float64 `json:"time"`
	Step      int64   `json:"step"`
	WorldSize int     `json:"world_size"`
	Rank      int     `json:"rank"`
	Round     int     `json:"round"`
	PID       int     `json:"pid"`
	Consumed  int64   `json:"consumed"`
	Samples   []int   `json:"samples"`
	Sent      bool    `json:"sent"`
	Why       string  `json:"why"`
	Bytes     int64   `json:"bytes"`
	ExitCode  int     `json:"exit_code"`
	node      string
}

func (a *testAgent) ipEvents(t *testing.T) []ipEvent {
	t.Helper()
	var out []ipEvent
	a.workerLines(func(_ int, line []byte) {
		var ev ipEvent
		if json.Unmarshal(line, &ev) == nil && ev.Event != "" {
			ev.node = a.id
			out = append(out, ev)
		}
	})
	sort.SliceStable(out, func(i, j int) bool { return out[i].Time < out[j].Time })
	return out
}

// steppingAt reports whether every agent's workers completed a step at
// world size ws after since (a unix time), at step >= minStep.
func steppingAt(t *testing.T, agents []*testAgent, ws int, since float64, minStep int64) bool {
	for _, a := range agents {
		ok := false
		for _, ev := range a.ipEvents(t) {
			if ev.Event == "step" && ev.WorldSize == ws && ev.Time > since && ev.Step >= minStep {
				ok = true
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

func lastStep(t *testing.T, agents ...*testAgent) int64 {
	var m int64
	for _, a := range agents {
		for _, ev := range a.ipEvents(t) {
			if ev.Event == "step" && ev.Step > m {
				m = ev.Step
			}
		}
	}
	return m
}

func unixNow() float64 { return float64(time.Now().UnixNano()) / 1e9 }

// TestInProcessMembershipChanges runs examples/pytorch/elastic_train.py
// (real PyTorch, gloo) under three real agents in in-process mode and
// changes the membership three ways: the master node gets a notice (it is
// excluded), a fourth node joins, and a node vanishes (network cut and
// SIGKILL of its worker). Every worker keeps its process across the
// changes, the joiner is handed the state by a survivor (no checkpoint is
// read), no step is done twice, and the data position carries over: no
// sample is seen twice or skipped within an epoch. Then a reference run
// replays the same sequence of world sizes in restart mode, from a
// checkpoint at every change, and must reach the same parameters.
func TestInProcessMembershipChanges(t *testing.T) {
	py := torchPython(t)
	addrs := loopbackAddrs(t, 4)
	script := filepath.Join(repoRoot(t), "examples", "pytorch", "elastic_train.py")
	ckpt, out := t.TempDir(), t.TempDir()
	const (
		steps   = 700
		batch   = 4
		samples = 90 // not a multiple of any step's 8 or 12 samples: steps straddle epochs
	)
	dump := filepath.Join(out, "in-process.json")
	common := []string{"--samples", strconv.Itoa(samples), "--batch", strconv.Itoa(batch), "--seed", "7", "--timeout", "20"}
	args := append([]string{"--steps", strconv.Itoa(steps), "--step-time", "0.04", "--ckpt", ckpt, "--ckpt-every", "50",
		"--log-samples", "--dump", dump}, common...)
	rc := rdzvConfig(t, 2, 3)
	rc.DeadAfter = 2 * time.Second
	off := false
	tc := TrainingConfig{Command: append([]string{py, "-u", script}, args...), NprocPerNode: 1, MaxRestarts: 3,
		DrainGrace: 10 * time.Second, CheckpointURI: ckpt, Elastic: ElasticInProcess, WarmStart: &off,
		Env: map[string]string{"OMP_NUM_THREADS": "1"}}
	d := newFakeDaemon(t, rc, tc)
	cuts := map[string]*cutTransport{}
	start := func(i int) *testAgent {
		id := "n" + strconv.Itoa(i)
		cuts[id] = newCutTransport()
		return startAgent(t, d, id, addrs[i], withCuttableNetwork(cuts[id]))
	}
	agents := []*testAgent{start(0), start(1), start(2)}
	waitFor(t, 90*time.Second, "three workers training", func() bool { return steppingAt(t, agents, 3, 0, 20) })

	// 1. A notice for the master node: it leaves, the others go on at 2.
	victim, survivors := groupRankZero(t, d, agents)
	t0 := unixNow()
	if err := d.service().Exclude(context.Background(), testFleet, victim.id, "spot-interruption (test)"); err != nil {
		t.Fatal(err)
	}
	target := lastStep(t, victim) + 10
	waitFor(t, 30*time.Second, "survivors training at world size 2", func() bool {
		return steppingAt(t, survivors, 2, t0, target)
	})
	t.Logf("notice: survivors stepping at world size 2 within %.2fs", unixNow()-t0)
	if s := lastStep(t, survivors...); s > steps-250 {
		t.Fatalf("the job is at step %d of %d already: the machine is too slow for this test's phases", s, steps)
	}

	// 2. A node joins: it is handed the state by a survivor.
	joiner := start(3)
	t1 := unixNow()
	all := append(append([]*testAgent(nil), survivors...), joiner)
	waitFor(t, 90*time.Second, "the joiner training at world size 3", func() bool {
		return steppingAt(t, all, 3, t1, 0)
	})
	t.Logf("join: three workers stepping within %.2fs of the agent's start", unixNow()-t1)

	// 3. A non-master survivor vanishes: its heartbeats stop, its worker dies.
	var lost *testAgent
	st, err := d.service().Status(testFleet)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range survivors {
		if len(st.Members) > 0 && st.Members[0].NodeID != a.id {
			lost = a
		}
	}
	if lost == nil {
		t.Fatalf("no non-master survivor among %v", st.Members)
	}
	target = lastStep(t, joiner) + 10
	waitFor(t, 30*time.Second, "ten steps at world size 3", func() bool {
		return steppingAt(t, all, 3, t1, target)
	})
	rest := slices.DeleteFunc(slices.Clone(all), func(a *testAgent) bool { return a == lost })
	t2 := unixNow()
	cuts[lost.id].cut()
	for _, ev := range lost.ipEvents(t) {
		if ev.Event == "start" && ev.PID > 0 && alive(ev.PID) {
			_ = syscall.Kill(-ev.PID, syscall.SIGKILL)
		}
	}
	waitFor(t, 60*time.Second, "the two left training at world size 2", func() bool {
		return steppingAt(t, rest, 2, t2, 0)
	})
	t.Logf("loss: the others stepping at world size 2 within %.2fs (dead_after %s)", unixNow()-t2, rc.DeadAfter)

	waitAll(t, 120*time.Second, rest...)
	wantDone(t, d, true)
	lost.cancel()
	_ = lost.wait(t, 15*time.Second)
	if err := victim.wait(t, 15*time.Second); err != nil {
		t.Fatalf("excluded agent: %v", err)
	}

	// Every node ran one worker process, whatever happened around it.
	for _, a := range append(append([]*testAgent(nil), agents...), joiner) {
		var pids []int
		for _, ev := range a.ipEvents(t) {
			if ev.Event == "start" {
				pids = append(pids, ev.PID)
			}
		}
		if len(pids) != 1 {
			t.Errorf("node %s started workers %v, want exactly one process across all rounds", a.id, pids)
		}
	}
	evs := map[string][]ipEvent{}
	var everything []ipEvent
	for _, a := range append(append([]*testAgent(nil), agents...), joiner) {
		evs[a.id] = a.ipEvents(t)
		everything = append(everything, evs[a.id]...)
	}
	sort.SliceStable(everything, func(i, j int) bool { return everything[i].Time < everything[j].Time })
	var leaves, synced, loads, failed int
	for _, ev := range evs[victim.id] {
		if ev.Event == "elastic" && ev.What == "leave" {
			leaves++
		}
	}
	for _, ev := range everything {
		if ev.Event == "elastic" && ev.What == "synced" && ev.node == joiner.id && !ev.Sent && ev.Why == "joiners" && ev.Bytes > 0 {
			synced++
		}
		if ev.Event == "resume" {
			loads++
		}
		if ev.Event == "elastic" && ev.What == "collective-failed" && ev.Time > t2 {
			failed++
		}
	}
	if leaves != 1 {
		t.Errorf("the excluded node's worker left %d times, want once", leaves)
	}
	if synced != 1 {
		t.Errorf("the joiner received the state %d times from a survivor, want once", synced)
	}
	if failed == 0 {
		t.Error("after the loss no worker reported a failed collective: the failure path was not taken")
	}
	if loads != 0 {
		t.Errorf("%d checkpoint loads: in-process changes must not read checkpoints", loads)
	}
	// No step done twice on any node.
	for id, es := range evs {
		var prev int64
		for _, ev := range es {
			if ev.Event != "step" {
				continue
			}
			if ev.Step <= prev {
				t.Errorf("node %s did step %d again after step %d (a lost step)", id, ev.Step, prev)
			}
			prev = ev.Step
		}
	}

	// The run's lineage: which world size and data position every step had.
	type stepAt struct {
		ws       int
		consumed int64
	}
	lineage := map[int64]stepAt{}
	for _, ev := range everything {
		if ev.Event == "step" {
			lineage[ev.Step] = stepAt{ev.WorldSize, ev.Consumed} // the latest report of a step wins
		}
	}
	var sizes []string
	var next int64
	for k := int64(1); k <= steps; k++ {
		s, ok := lineage[k]
		if !ok {
			t.Fatalf("nobody reported step %d", k)
		}
		if s.consumed != next {
			t.Fatalf("step %d started at sample position %d, want %d: the data position was not carried over", k, s.consumed, next)
		}
		next += int64(s.ws * batch)
		if k == 1 || lineage[k-1].ws != s.ws {
			sizes = append(sizes, fmt.Sprintf("from step %d: %d", k, s.ws))
		}
	}
	t.Logf("world sizes: %s", strings.Join(sizes, ", "))
	if len(sizes) != 4 {
		t.Errorf("world size changes %v, want 3 → 2 → 3 → 2", sizes)
	}
	// Sample coverage: the stream position of every sample a rank logged.
	posIdx := map[int64]int{}
	for _, ev := range everything {
		if ev.Event != "step" {
			continue
		}
		if s := lineage[ev.Step]; s.ws != ev.WorldSize || s.consumed != ev.Consumed {
			continue // a step done at another size by a node that died with it
		}
		for j, idx := range ev.Samples {
			pos := ev.Consumed + int64(ev.Rank*batch+j)
			if old, ok := posIdx[pos]; ok && old != idx {
				t.Fatalf("stream position %d: sample %d and %d", pos, old, idx)
			}
			posIdx[pos] = idx
		}
	}
	unseen := 0
	for e := int64(0); (e+1)*samples <= next; e++ {
		seen := map[int]bool{}
		for p := e * samples; p < (e+1)*samples; p++ {
			idx, ok := posIdx[p]
			if !ok {
				unseen++ // a rank that did the step but died or failed before reporting it
				continue
			}
			if seen[idx] || idx < 0 || idx >= samples {
				t.Fatalf("epoch %d: sample %d seen twice (or out of range)", e, idx)
			}
			seen[idx] = true
		}
	}
	t.Logf("samples: %d epochs, no sample twice; %d positions unreported (ranks of the step the loss broke)", next/samples, unseen)
	if unseen > 2*batch {
		t.Errorf("%d sample positions nobody reported; at most %d (the ranks of the step the lost node broke)", unseen, 2*batch)
	}

	// The reference: the same world sizes, restart mode, a checkpoint at each change.
	refCkpt := t.TempDir()
	refDump := filepath.Join(out, "reference.json")
	var from int64
	for k := int64(1); k <= steps; k++ {
		if k < steps && lineage[k+1].ws == lineage[k].ws {
			continue
		}
		ws := lineage[k].ws
		runReference(t, py, script, ws, append([]string{"--steps", strconv.FormatInt(k, 10), "--ckpt", refCkpt,
			"--ckpt-every", "0", "--dump", refDump}, common...))
		t.Logf("reference: steps %d–%d at world size %d", from+1, k, ws)
		from = k
	}
	got, want := readDump(t, dump), readDump(t, refDump)
	if got.Step != steps || want.Step != steps || got.Consumed != want.Consumed || len(got.Params) != len(want.Params) || len(got.Params) == 0 {
		t.Fatalf("in-process run ended at step %d (position %d, %d params), the reference at %d (%d, %d)",
			got.Step, got.Consumed, len(got.Params), want.Step, want.Consumed, len(want.Params))
	}
	var maxDiff float64
	for i := range got.Params {
		diff := math.Abs(got.Params[i] - want.Params[i])
		maxDiff = max(maxDiff, diff)
		if diff > 1e-5*(1+math.Abs(want.Params[i])) {
			t.Fatalf("parameter %d: %g in process, %g in the reference", i, got.Params[i], want.Params[i])
		}
	}
	t.Logf("final parameters: %d, largest difference from the reference %.3g", len(got.Params), maxDiff)
}

type paramDump struct {
	Step     int64     `json:"step"`
	Consumed int64     `json:"consumed"`
	Params   []float64 `json:"params"`
}

func readDump(t *testing.T, file string) paramDump {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var d paramDump
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	return d
}

// runReference runs one restart-mode segment of ws workers on loopback,
// the way torchrun would (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), and
// waits for all of them to exit 0. The port is picked free and then handed
// to the workers, so another socket can still take it in between (CI saw
// rank 0 fail to bind once, on a port from the ephemeral range); such a
// segment never started training, so it is run again on a new port, at
// most three times.
func runReference(t *testing.T, py, script string, ws int, args []string) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		err := referenceSegment(t, py, script, ws, args)
		if err == nil {
			return
		}
		if !errors.Is(err, errPortTaken) || attempt == 3 {
			t.Fatal(err)
		}
		t.Logf("reference: attempt %d: %v; again on another port", attempt, err)
	}
}

var errPortTaken = errors.New("the master port was taken before rank 0 could bind it")

func referenceSegment(t *testing.T, py, script string, ws int, args []string) error {
	t.Helper()
	port, err := freeport.Pick()
	if err != nil {
		t.Fatal(err)
	}
	cmds := make([]*exec.Cmd, ws)
	outs := make([]*strings.Builder, ws)
	killAll := func() {
		for _, c := range cmds {
			if c != nil {
				_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			}
		}
	}
	for r := range ws {
		c := exec.Command(py, append([]string{"-u", script}, args...)...)
		c.Env = append(os.Environ(), "RANK="+strconv.Itoa(r), "LOCAL_RANK=0", "WORLD_SIZE="+strconv.Itoa(ws),
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port), "OMP_NUM_THREADS=1", "FLEETD_ELASTIC=", "FLEETD_ELASTIC_FILE=")
		outs[r] = &strings.Builder{}
		c.Stdout, c.Stderr = outs[r], outs[r]
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := c.Start(); err != nil {
			killAll()
			t.Fatal(err)
		}
		cmds[r] = c
	}
	// Reap every rank whatever happens, so a retry starts with none left.
	dones := make([]chan error, ws)
	for r, c := range cmds {
		dones[r] = make(chan error, 1)
		go func() { dones[r] <- c.Wait() }()
	}
	defer func() {
		killAll()
		for _, d := range dones {
			<-d
		}
	}()
	for r, c := range cmds {
		select {
		case err := <-dones[r]:
			dones[r] <- err // for the deferred reap
			// torch 1.13 has (rarely) aborted in the interpreter's teardown,
			// after the run was complete and written; that is no wrong result.
			if err != nil && strings.Contains(outs[r].String(), `"event":"done"`) && c.ProcessState.ExitCode() == -1 {
				t.Logf("reference rank %d ended with %v after it finished (teardown)", r, err)
				err = nil
			}
			if err != nil && r == 0 && strings.Contains(outs[r].String(), "Address already in use") &&
				strings.Contains(outs[r].String(), `"what":"join-failed"`) {
				return fmt.Errorf("reference rank 0 (port %d): %v: %w", port, err, errPortTaken)
			}
			if err != nil {
				return fmt.Errorf("reference rank %d: %v\n%s", r, err, outs[r])
			}
		case <-time.After(120 * time.Second):
			return fmt.Errorf("reference rank %d did not finish\n%s", r, outs[r])
		}
	}
	return nil
}

// TestInProcessModeRestartsUnawareWorkers: in in-process mode, a script
// that does not use fleetd_elastic (the stdlib trainer) never says hello,
// so a membership change restarts its workers as in restart mode, with a
// warning, and the job completes.
func TestInProcessModeRestartsUnawareWorkers(t *testing.T) {
	addrs := loopbackAddrs(t, 2)
	ckpt := t.TempDir()
	tc := trainerJob(t, 80, ckpt)
	tc.Elastic = ElasticInProcess
	d := newFakeDaemon(t, rdzvConfig(t, 1, 2), tc)
	a0, a1 := startAgent(t, d, "n0", addrs[0]), startAgent(t, d, "n1", addrs[1])
	waitFor(t, 30*time.Second, "both workers training", func() bool { return a0.maxStep(t) >= 10 && a1.maxStep(t) >= 10 })
	if err := d.service().Exclude(context.Background(), testFleet, a1.id, "spot-interruption (test)"); err != nil {
		t.Fatal(err)
	}
	waitAll(t, 60*time.Second, a0)
	wantDone(t, d, true)
	if l := a0.logLines(t, "in-process mode: these workers have not loaded fleetd_elastic (yet); restarting them for the new round"); len(l) == 0 {
		t.Error("no warning that the workers do not speak the in-process protocol")
	}
	if r := a0.rounds(t); len(r) < 2 {
		t.Errorf("the survivor's workers ran rounds %v: they should have been restarted for the new round", r)
	}
	if c := readCheckpoint(t, ckpt); c.Step != 80 || c.WorldSize != 1 {
		t.Errorf("final checkpoint %+v, want step 80 at world size 1", c)
	}
}
