package agent

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

	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/providers/local/imdsfake"
	"github.com/fleetd/fleetd/rendezvous"
)

// finalDone returns the trainer's done events, one per rank that printed one.
func finalDone(t *testing.T, agents ...*testAgent) []event {
	var out []event
	for _, a := range agents {
		for _, ev := range a.events(t) {
			if ev.Event == "done" {
				out = append(out, ev)
			}
		}
	}
	return out
}

func waitAll(t *testing.T, limit time.Duration, agents ...*testAgent) {
	t.Helper()
	for _, a := range agents {
		if err := a.wait(t, limit); err != nil {
			t.Fatalf("agent %s: Run: %v", a.id, err)
		}
	}
}

func wantDone(t *testing.T, d *fakeDaemon, success bool) doneReport {
	t.Helper()
	reps := d.doneReports()
	if len(reps) == 0 {
		t.Fatal("no node reported the job done")
	}
	if reps[0].req.Success != success {
		t.Fatalf("done reported %+v, want success=%v", reps[0], success)
	}
	return reps[0]
}

func TestThreeNodesTrainToCompletion(t *testing.T) {
	addrs := loopbackAddrs(t, 3)
	ckpt := t.TempDir()
	const steps = 40
	d := newFakeDaemon(t, rdzvConfig(t, 3, 3), trainerJob(t, steps, ckpt))
	var agents []*testAgent
	for i, addr := range addrs {
		agents = append(agents, startAgent(t, d, "n"+string(rune('0'+i)), addr))
	}
	waitAll(t, 45*time.Second, agents...)

	rep := wantDone(t, d, true)
	if rep.req.Step != steps {
		t.Errorf("done reported step %d, want %d", rep.req.Step, steps)
	}
	if c := readCheckpoint(t, ckpt); c.Step != steps || c.WorldSize != 3 {
		t.Errorf("final checkpoint %+v, want step %d at world size 3", c, steps)
	}
	if _, err := os.Stat(filepath.Join(ckpt, DoneMarker)); err != nil {
		t.Errorf("DONE marker: %v", err)
	}
	dones := finalDone(t, agents...)
	if len(dones) != 3 {
		t.Fatalf("%d ranks printed done, want 3", len(dones))
	}
	for _, ev := range dones {
		if ev.Step != steps || ev.WorldSize != 3 || !slices.Equal(ev.Weights, dones[0].Weights) || ev.Bias != dones[0].Bias {
			t.Errorf("rank %d finished at step %d, world size %d, weights differ: %v", ev.Rank, ev.Step, ev.WorldSize,
				!slices.Equal(ev.Weights, dones[0].Weights))
		}
	}
	for _, a := range agents {
		if r := a.rounds(t); !slices.Equal(r, []int{1}) {
			t.Errorf("agent %s ran rounds %v, want only round 1", a.id, r)
		}
		if d.shippedLines(a.id) == 0 {
			t.Errorf("agent %s shipped no log lines to the daemon", a.id)
		}
		if d.registerCount(a.id) == 0 {
			t.Errorf("agent %s never registered", a.id)
		}
	}
}

// groupRankZero returns the agent holding group rank 0 in the current round.
func groupRankZero(t *testing.T, d *fakeDaemon, agents []*testAgent) (*testAgent, []*testAgent) {
	t.Helper()
	st, err := d.service().Status(testFleet)
	if err != nil {
		t.Fatal(err)
	}
	var zero *testAgent
	var rest []*testAgent
	for _, a := range agents {
		if len(st.Members) > 0 && st.Members[0].NodeID == a.id {
			zero = a
		} else {
			rest = append(rest, a)
		}
	}
	if zero == nil {
		t.Fatalf("no agent is group rank 0: %+v", st.Members)
	}
	return zero, rest
}

func startThree(t *testing.T, steps int, deadAfter time.Duration, extra map[string][]agentOpt, args ...string) (*fakeDaemon, []*testAgent, string) {
	t.Helper()
	addrs := loopbackAddrs(t, 3)
	ckpt := t.TempDir()
	rc := rdzvConfig(t, 2, 3)
	if deadAfter > 0 {
		rc.DeadAfter = deadAfter
	}
	d := newFakeDaemon(t, rc, trainerJob(t, steps, ckpt, args...))
	var agents []*testAgent
	for i, addr := range addrs {
		id := "n" + string(rune('0'+i))
		agents = append(agents, startAgent(t, d, id, addr, extra[id]...))
	}
	waitFor(t, 20*time.Second, "training at world size 3", func() bool {
		for _, a := range agents {
			if a.maxStep(t) < 15 {
				return false
			}
		}
		return true
	})
	return d, agents, ckpt
}

// survivorsRestarted checks that the survivors resumed from a checkpoint
// at world size 2 in a later round and returns when that round started.
func survivorsRestarted(t *testing.T, survivors []*testAgent, minStep int64) {
	t.Helper()
	for _, a := range survivors {
		var resumed, started bool
		for _, ev := range a.events(t) {
			if ev.Round < 2 {
				continue
			}
			if ev.Event == "start" && ev.WorldSize == 2 {
				started = true
				if ev.RestartCount != 0 {
					t.Errorf("agent %s: restart count %d after a membership change, want 0", a.id, ev.RestartCount)
				}
			}
			if ev.Event == "resume" && ev.WorldSize == 2 && ev.Step >= minStep {
				resumed = true
			}
		}
		if !started || !resumed {
			var seen []string
			for _, ev := range a.events(t) {
				if ev.Event == "start" || ev.Event == "resume" {
					seen = append(seen, fmt.Sprintf("round %d %s ws=%d step=%d", ev.Round, ev.Event, ev.WorldSize, ev.Step))
				}
			}
			t.Errorf("agent %s: started at world size 2: %v, resumed from step >= %d: %v; events: %s", a.id, started, minStep, resumed, strings.Join(seen, "; "))
		}
	}
}

func TestExcludedNodeDrainsAndSurvivorsContinue(t *testing.T) {
	const steps = 100
	d, agents, ckpt := startThree(t, steps, 0, nil)
	victim, survivors := groupRankZero(t, d, agents) // the master moves too
	atStep := victim.maxStep(t)
	if err := d.service().Exclude(context.Background(), testFleet, victim.id, "spot-interruption (test)"); err != nil {
		t.Fatal(err)
	}
	excludedAt := time.Now()
	waitFor(t, 10*time.Second, "survivors training at world size 2", func() bool {
		for _, a := range survivors {
			ok := false
			for _, ev := range a.events(t) {
				if ev.Round >= 2 && ev.Event == "step" && ev.WorldSize == 2 {
					ok = true
				}
			}
			if !ok {
				return false
			}
		}
		return true
	})
	t.Logf("survivors stepping at world size 2 %v after the exclusion", time.Since(excludedAt).Round(time.Millisecond))
	waitAll(t, 45*time.Second, agents...)

	wantDone(t, d, true)
	survivorsRestarted(t, survivors, atStep)
	if c := readCheckpoint(t, ckpt); c.Step != steps || c.WorldSize != 2 {
		t.Errorf("final checkpoint %+v, want step %d at world size 2", c, steps)
	}
	dr, err := ReadDrain(victim.paths().DrainFile)
	if err != nil {
		t.Fatalf("excluded node's drain file: %v", err)
	}
	if dr.Kind != DrainExcluded || !strings.Contains(dr.Detail, "spot-interruption (test)") {
		t.Errorf("drain file %+v", dr)
	}
	if !victim.stoppedBy(t, "SIGTERM") {
		t.Error("the excluded node's worker never reported a SIGTERM stop")
	}
	if r := victim.rounds(t); !slices.Equal(r, []int{1}) {
		t.Errorf("excluded node ran rounds %v, want only round 1", r)
	}
	// It told the daemon it is done, once, so the node is deleted before
	// its drain deadline; the survivors did not.
	dr2 := d.drainedReports()
	if len(dr2) != 1 || dr2[0].node != victim.id || dr2[0].req.FlushError != "" || !strings.Contains(dr2[0].req.Reason, "spot-interruption (test)") {
		t.Errorf("drained reports %+v, want one from %s", dr2, victim.id)
	}
}

func TestLostNodeSurvivorsRestartAfterDeadAfter(t *testing.T) {
	const steps = 100
	ct := newCutTransport()
	// n0 joins first, so it is usually group rank 0; whichever it is, it
	// is the one lost.
	d, agents, ckpt := startThree(t, steps, 2*time.Second, map[string][]agentOpt{"n0": {withCuttableNetwork(ct)}})
	victim := agents[0]
	survivors := agents[1:]
	atStep := victim.maxStep(t)

	// The node vanishes: no more heartbeats, its workers die at once.
	ct.cut()
	lostAt := time.Now()
	for _, ev := range victim.events(t) {
		if ev.Event == "start" && ev.PID > 0 && alive(ev.PID) {
			if err := syscall.Kill(-ev.PID, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, a := range survivors {
		if err := a.wait(t, 45*time.Second); err != nil {
			t.Fatalf("agent %s: %v", a.id, err)
		}
	}
	t.Logf("survivors finished %v after the loss", time.Since(lostAt).Round(time.Millisecond))
	wantDone(t, d, true)
	// The victim may die between printing a step and checkpointing it.
	survivorsRestarted(t, survivors, atStep-1)
	// An unannounced loss is no notice: nobody was asked to checkpoint,
	// and no next round was told a resume step.
	for _, a := range survivors {
		if l := a.logLines(t, "asking workers to checkpoint before they stop"); len(l) != 0 {
			t.Errorf("agent %s asked for a checkpoint after an unannounced loss: %+v", a.id, l)
		}
		for _, ev := range a.events(t) {
			if (ev.Event == "stop" && ev.Request != nil) || (ev.Event == "start" && ev.ResumeStep != nil) {
				t.Errorf("agent %s: round %d %s event %+v after an unannounced loss", a.id, ev.Round, ev.Event, ev)
			}
		}
	}
	if c := readCheckpoint(t, ckpt); c.Step != steps || c.WorldSize != 2 {
		t.Errorf("final checkpoint %+v, want step %d at world size 2", c, steps)
	}
	st, err := d.service().Status(testFleet)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != rendezvous.RoundFinished {
		t.Errorf("rendezvous state %s, want finished", st.State)
	}
	// The lost agent is still trying to reach the daemon; SIGTERM ends it.
	victim.cancel()
	if err := victim.wait(t, 10*time.Second); err != nil {
		t.Fatalf("lost agent: %v", err)
	}
}

// envDumpScript saves its environment, waits until every rank did (the
// job must not be reported done before), then marks the job done.
const envDumpScript = `
import json, os, sys, time
out = os.environ["ENV_OUT"]
tmp = os.path.join(out, ".env-%s.tmp" % os.environ["RANK"])
info = dict(os.environ)
info["__name__"], info["__argv__"] = __name__, json.dumps(sys.argv)  # not variable names: no clash
with open(tmp, "w") as f:
    json.dump(info, f)
os.rename(tmp, os.path.join(out, "env-%s.json" % os.environ["RANK"]))
deadline = time.time() + 20
ranks = range(int(os.environ["WORLD_SIZE"]))
while not all(os.path.exists(os.path.join(out, "env-%d.json" % r)) for r in ranks):
    if time.time() > deadline:
        sys.exit(3)
    time.sleep(0.02)
with open(os.path.join(os.environ["FLEETD_CHECKPOINT_URI"], "DONE"), "w") as f:
    f.write("{}\n")
`

// TestWorkerEnvironmentContract checks the contract for cold starts and
// for warm ones (real PyTorch: the warm interpreter imports torch).
func TestWorkerEnvironmentContract(t *testing.T) {
	for _, tt := range []struct {
		name   string
		python func(*testing.T) string
		warm   bool
	}{
		{name: "cold", python: needPython},
		{name: "warm", python: torchPython, warm: true},
	} {
		t.Run(tt.name, func(t *testing.T) { testWorkerEnvironmentContract(t, tt.python(t), tt.warm) })
	}
}

func testWorkerEnvironmentContract(t *testing.T, py string, warm bool) {
	addrs := loopbackAddrs(t, 2)
	t.Setenv("FLEETD_TEST_INHERITED", "from the agent") // workers inherit the agent's environment
	dir, ckpt, out := t.TempDir(), t.TempDir(), t.TempDir()
	script := filepath.Join(dir, "envdump.py")
	if err := os.WriteFile(script, []byte(envDumpScript), 0o644); err != nil {
		t.Fatal(err)
	}
	rc := rdzvConfig(t, 2, 2)
	tc := TrainingConfig{Command: []string{py, script}, NprocPerNode: 2, MaxRestarts: 3, DrainGrace: 5 * time.Second,
		CheckpointURI: ckpt, Workdir: dir,
		Env: map[string]string{"ENV_OUT": out, "FOO": "bar", "RANK": "99", "NCCL_DEBUG": "WARN"}, WarmStart: &warm}
	d := newFakeDaemon(t, rc, tc)
	agents := []*testAgent{startAgent(t, d, "a", addrs[0]), startAgent(t, d, "b", addrs[1])}
	waitAll(t, 30*time.Second, agents...)
	wantDone(t, d, true)

	st, err := d.service().Status(testFleet)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]*testAgent{"a": agents[0], "b": agents[1]}
	master := byID[st.Members[0].NodeID]
	// torchrun 1.13's measured key set (reference/torchelastic.md §1.1)
	// must all be present.
	torchrunKeys := []string{"GROUP_RANK", "GROUP_WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
		"NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS", "RANK", "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE",
		"TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID",
		"TORCHELASTIC_USE_AGENT_STORE", "WORLD_SIZE"}
	errFiles := map[string]bool{}
	for rank := range 4 {
		b, err := os.ReadFile(filepath.Join(out, "env-"+itoa(rank)+".json"))
		if err != nil {
			t.Fatalf("rank %d: %v", rank, err)
		}
		var env map[string]string
		if err := json.Unmarshal(b, &env); err != nil {
			t.Fatal(err)
		}
		node := byID[st.Members[rank/2].NodeID]
		want := map[string]string{
			"RANK": itoa(rank), "LOCAL_RANK": itoa(rank % 2), "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
			"GROUP_RANK": itoa(rank / 2), "GROUP_WORLD_SIZE": "2",
			"ROLE_NAME": "default", "ROLE_RANK": itoa(rank), "ROLE_WORLD_SIZE": "4",
			"MASTER_ADDR": master.addr, "MASTER_PORT": itoa(rc.MasterPort),
			"TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_RUN_ID": st.RunID,
			"TORCHELASTIC_USE_AGENT_STORE": "False",
			"TORCHELASTIC_ERROR_FILE":      filepath.Join(node.paths().LogDir, "round-1", "rank-"+itoa(rank)+".error.json"),
			"PYTHONUNBUFFERED":             "1",
			"FLEETD_FLEET":                 testFleet, "FLEETD_NODE_ID": node.id, "FLEETD_DRAIN_FILE": node.paths().DrainFile,
			"FLEETD_CHECKPOINT_URI": ckpt, "FLEETD_ROUND": "1",
			"FLEETD_CHECKPOINT_REQUEST": node.paths().CheckpointRequest,
			"FLEETD_CHECKPOINT_DONE":    filepath.Join(node.paths().LogDir, "round-1", "rank-"+itoa(rank)+".checkpoint"),
			"FLEETD_PROGRESS":           filepath.Join(node.paths().LogDir, "round-1", ProgressFile),
			"FOO":                       "bar", "NCCL_DEBUG": "WARN", "FLEETD_TEST_INHERITED": "from the agent",
		}
		if v, ok := os.LookupEnv("OMP_NUM_THREADS"); ok {
			want["OMP_NUM_THREADS"] = v
		} else {
			want["OMP_NUM_THREADS"] = "1"
		}
		if v, ok := os.LookupEnv("NCCL_ASYNC_ERROR_HANDLING"); ok {
			want["NCCL_ASYNC_ERROR_HANDLING"] = v
		} else {
			want["NCCL_ASYNC_ERROR_HANDLING"] = "1"
		}
		if ifn := ifnameOf(node.addr); ifn != "" && os.Getenv("GLOO_SOCKET_IFNAME") == "" {
			want["GLOO_SOCKET_IFNAME"] = ifn
		}
		for k, v := range want {
			if got, ok := env[k]; !ok || got != v {
				t.Errorf("rank %d: %s=%q (set: %v), want %q", rank, k, got, ok, v)
			}
		}
		if v, ok := env["FLEETD_RESUME_STEP"]; ok {
			t.Errorf("rank %d: FLEETD_RESUME_STEP=%q in the first round", rank, v)
		}
		for _, k := range torchrunKeys {
			if _, ok := env[k]; !ok {
				t.Errorf("rank %d: torchrun's %s is missing", rank, k)
			}
		}
		if env["__name__"] != "__main__" || env["__argv__"] != fmt.Sprintf("[%q]", script) {
			t.Errorf("rank %d: __name__ %q, argv %s; want __main__, [%q]", rank, env["__name__"], env["__argv__"], script)
		}
		errFiles[env["TORCHELASTIC_ERROR_FILE"]] = true
	}
	for _, a := range agents {
		b, err := os.ReadFile(a.paths().LogFile)
		if err != nil {
			t.Fatal(err)
		}
		var starts []bool
		for line := range strings.Lines(string(b)) {
			var l struct {
				Msg   string `json:"msg"`
				Round int    `json:"round"`
				Warm  bool   `json:"warm"`
			}
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "worker started" && l.Round == 1 {
				starts = append(starts, l.Warm)
			}
		}
		if !slices.Equal(starts, []bool{warm, warm}) {
			t.Errorf("agent %s: round 1 worker starts warm=%v, want %v twice", a.id, starts, warm)
		}
	}
	if len(errFiles) != 4 {
		t.Errorf("error files are not per worker: %v", errFiles)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// flakyScript fails (exit 1, with an @record-style error file) on the node
// with group rank FAIL_GROUP_RANK while TORCHELASTIC_RESTART_COUNT is below
// FAIL_TIMES (after FAIL_AFTER seconds, default 0.3), and otherwise
// becomes the trainer.
const flakyScript = `
import json, os, sys, time
if (os.environ["GROUP_RANK"] == os.environ["FAIL_GROUP_RANK"]
        and int(os.environ["TORCHELASTIC_RESTART_COUNT"]) < int(os.environ["FAIL_TIMES"])):
    time.sleep(float(os.environ.get("FAIL_AFTER", "0.3")))
    with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as f:
        json.dump({"message": {"message": "RuntimeError: injected failure", "extraInfo": {}}}, f)
    print("injected failure", file=sys.stderr)
    sys.exit(1)
os.execv(sys.executable, [sys.executable] + sys.argv[1:])
`

// flakyJob is the 40-step trainer behind flakyScript at script, failing
// failTimes times on group rank 1; extra adds to its environment.
func flakyJob(t *testing.T, py, script, ckpt string, failTimes int, extra map[string]string) TrainingConfig {
	tc := trainerJob(t, 40, ckpt)
	tc.Command = append([]string{py, script}, tc.Command[1:]...)
	tc.Env = map[string]string{"FAIL_GROUP_RANK": "1", "FAIL_TIMES": itoa(failTimes)}
	for k, v := range extra {
		tc.Env[k] = v
	}
	return tc
}

func TestWorkerFailuresCountAgainstMaxRestarts(t *testing.T) {
	py := needPython(t)
	tests := []struct {
		name        string
		maxRestarts int
		failTimes   int
		success     bool
	}{
		{name: "restart then finish", maxRestarts: 2, failTimes: 1, success: true},
		{name: "max restarts exceeded", maxRestarts: 1, failTimes: 100, success: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addrs := loopbackAddrs(t, 2)
			dir, ckpt := t.TempDir(), t.TempDir()
			script := filepath.Join(dir, "flaky.py")
			if err := os.WriteFile(script, []byte(flakyScript), 0o644); err != nil {
				t.Fatal(err)
			}
			tc := flakyJob(t, py, script, ckpt, tt.failTimes, nil)
			tc.MaxRestarts = tt.maxRestarts
			d := newFakeDaemon(t, rdzvConfig(t, 2, 2), tc)
			agents := []*testAgent{startAgent(t, d, "a", addrs[0]), startAgent(t, d, "b", addrs[1])}
			waitAll(t, 45*time.Second, agents...)

			rep := wantDone(t, d, tt.success)
			st, err := d.service().Status(testFleet)
			if err != nil {
				t.Fatal(err)
			}
			failing := agents[0]
			if st.Members[1].NodeID == "b" {
				failing = agents[1]
			}
			var counts []int
			for _, ev := range failing.events(t) {
				if ev.Event == "start" {
					counts = append(counts, ev.RestartCount)
				}
			}
			if tt.success {
				// The injected failure is gone at restart count 1, where
				// the trainer runs to the end.
				if !slices.Equal(counts, []int{1}) {
					t.Errorf("failing node's trainer starts had restart counts %v, want [1]", counts)
				}
				if c := readCheckpoint(t, ckpt); c.Step != 40 {
					t.Errorf("final checkpoint at step %d, want 40", c.Step)
				}
				return
			}
			if rep.node != failing.id || !strings.Contains(rep.req.Detail, "max_restarts (1) exceeded") ||
				!strings.Contains(rep.req.Detail, "injected failure") {
				t.Errorf("done report %+v, want a max_restarts failure with the root cause from %s", rep, failing.id)
			}
			if files, _ := filepath.Glob(filepath.Join(failing.paths().LogDir, "round-*")); len(files) != 2 {
				t.Errorf("failing node ran %d rounds, want 2 (max_restarts 1 = one restart)", len(files))
			}
		})
	}
}

func TestDaemonOutageKeepsWorkersRunning(t *testing.T) {
	addrs := loopbackAddrs(t, 2)
	ckpt := t.TempDir()
	const steps = 300
	rc := rdzvConfig(t, 2, 2)
	d := newFakeDaemon(t, rc, trainerJob(t, steps, ckpt))
	agents := []*testAgent{startAgent(t, d, "a", addrs[0]), startAgent(t, d, "b", addrs[1])}
	waitFor(t, 20*time.Second, "training", func() bool { return agents[0].maxStep(t) >= 15 })
	waitFor(t, 5*time.Second, "a heartbeat with the step", func() bool {
		st, err := d.service().Status(testFleet)
		if err != nil || len(st.Members) != 2 {
			return false
		}
		for _, m := range st.Members {
			if m.Step == nil || *m.Step < 1 || m.Workers != wsRunning || m.WorkerRound != 1 {
				return false
			}
		}
		return true
	})

	d.stop()
	before := agents[0].maxStep(t)
	time.Sleep(3 * time.Second)
	during := agents[0].maxStep(t)
	if during < before+20 {
		t.Errorf("workers made %d steps in 3s while the daemon was down", during-before)
	}
	d.start()
	waitAll(t, 45*time.Second, agents...)

	wantDone(t, d, true)
	for _, a := range agents {
		if r := a.rounds(t); !slices.Equal(r, []int{1}) {
			t.Errorf("agent %s ran rounds %v: the outage restarted its workers", a.id, r)
		}
		if n := d.registerCount(a.id); n < 2 {
			t.Errorf("agent %s registered %d times, want a re-registration after the outage", a.id, n)
		}
	}
	if c := readCheckpoint(t, ckpt); c.Step != steps || c.WorldSize != 2 {
		t.Errorf("final checkpoint %+v, want step %d at world size 2", c, steps)
	}
}

func TestSpotNoticeDrainsAndReachesDaemonAfterRestart(t *testing.T) {
	addrs := loopbackAddrs(t, 1)
	fake := imdsfake.New(imdsfake.Identity{InstanceID: "i-0spot", AvailabilityZone: "local-1a", LifeCycle: "spot", LocalIPv4: addrs[0]}, nil)
	meta := serveIMDS(t, fake)

	ckpt := t.TempDir()
	d := newFakeDaemon(t, rdzvConfig(t, 1, 1), trainerJob(t, 2000, ckpt))
	// No FLEETD_NODE_ADDR: address, zone and instance id come from IMDS.
	a := startAgent(t, d, "spot", "", func(o *Options) {
		o.Config.Metadata = MetadataConfig{Kind: MetadataAWSIMDS}
		o.MetadataURL = meta.URL
		o.PollInterval = 50 * time.Millisecond
	})
	waitFor(t, 20*time.Second, "training", func() bool { return a.maxStep(t) >= 5 })
	st, err := d.service().Status(testFleet)
	if err != nil {
		t.Fatal(err)
	}
	if m := st.Members[0]; m.Addr != addrs[0] || m.Zone != "local-1a" {
		t.Errorf("member %+v: want address %s and zone local-1a from IMDS", m, addrs[0])
	}

	// The notice arrives while the daemon is down: the node drains on its
	// own and the daemon hears of it once it is back.
	d.stop()
	deadline := time.Now().Add(2 * time.Minute).UTC().Truncate(time.Second)
	fake.SetSpotAction("terminate", deadline)
	waitFor(t, 5*time.Second, "drain file", func() bool { _, err := os.Stat(a.paths().DrainFile); return err == nil })
	dr, err := ReadDrain(a.paths().DrainFile)
	if err != nil || dr.Kind != interruption.SpotInterruption || !dr.Deadline.Equal(deadline) {
		t.Fatalf("drain file %+v, %v", dr, err)
	}
	waitFor(t, 5*time.Second, "the workers to see the drain", func() bool {
		for _, ev := range a.events(t) {
			if ev.Event == "drain" {
				return true
			}
		}
		return false
	})
	time.Sleep(time.Second) // a few failed deliveries
	d.start()
	waitFor(t, 10*time.Second, "the notice at the daemon", func() bool {
		for _, n := range d.noticesSeen() {
			if n.Kind == string(interruption.SpotInterruption) && n.Deadline.Equal(deadline) && n.Source == "aws-imds" {
				return true
			}
		}
		return false
	})
	// The daemon excluded the node: its workers are stopped with SIGTERM.
	waitFor(t, 10*time.Second, "the worker's SIGTERM stop", func() bool { return a.stoppedBy(t, "SIGTERM") })
	if n := d.registerCount("spot"); n < 2 {
		t.Errorf("registered %d times, want a re-registration after the restart", n)
	}
	a.cancel()
	if err := a.wait(t, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if r := a.rounds(t); !slices.Equal(r, []int{1}) {
		t.Errorf("an excluded node must not rejoin; it ran rounds %v", r)
	}
}

func TestAgentShutdownStopsWorkersAndLeaves(t *testing.T) {
	const steps = 100
	d, agents, ckpt := startThree(t, steps, 0, nil)
	_, rest := groupRankZero(t, d, agents)
	leaver, survivors := rest[0], []*testAgent{agents[0], agents[1], agents[2]}
	survivors = slices.DeleteFunc(survivors, func(a *testAgent) bool { return a == leaver })
	atStep := leaver.maxStep(t)

	leaver.cancel() // SIGTERM to the agent
	if err := leaver.wait(t, 15*time.Second); err != nil {
		t.Fatalf("Run after SIGTERM: %v", err)
	}
	// It left: it is no member any more, well before dead_after could have
	// dropped it.
	st, err := d.service().Status(testFleet)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range st.Members {
		if m.NodeID == leaver.id {
			t.Errorf("%s is still a member after a graceful shutdown: %+v", leaver.id, m)
		}
	}
	if !leaver.stoppedBy(t, "SIGTERM") {
		t.Error("the stopped agent's worker did not get a SIGTERM")
	}
	if _, err := os.Stat(leaver.paths().PIDFile); !os.IsNotExist(err) {
		t.Errorf("pid file left behind: %v", err)
	}
	waitAll(t, 45*time.Second, survivors...)
	wantDone(t, d, true)
	survivorsRestarted(t, survivors, atStep)
	if c := readCheckpoint(t, ckpt); c.Step != steps || c.WorldSize != 2 {
		t.Errorf("final checkpoint %+v, want step %d at world size 2", c, steps)
	}
}
