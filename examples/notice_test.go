package examples

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestCheckpointOnNotice plays the agent's side of the checkpoint-on-notice
// contract (docs/agent.md) by hand, for both scripts: a round of three
// workers checkpoints only every 1000 steps; a notice arrives (request file,
// then SIGTERM to every worker, as the agents of the leaving node and of the
// survivors send it); every rank must stop after the same step, rank 0 must
// checkpoint it, and every rank must confirm that step in
// FLEETD_CHECKPOINT_DONE only once the checkpoint is on disk, then exit 0.
// The next round (two workers, FLEETD_RESUME_STEP set) resumes exactly
// there: the notice costs 0 steps.
func TestCheckpointOnNotice(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		script string
		python func(*testing.T) string
		args   []string
	}{
		{"trainer/train.py", stdPython, []string{"--step-time", "0.03"}},
		{"pytorch/ddp_train.py", torchPython, []string{"--step-time", "0.05", "--timeout", "60"}},
	} {
		t.Run(filepath.Base(tc.script), func(t *testing.T) {
			t.Parallel()
			testCheckpointOnNotice(t, tc.python(t), script(t, tc.script), tc.args)
		})
	}
}

// noticeRound starts one round's ranks as one node each, with the
// checkpoint-on-notice variables the agent sets.
func noticeRound(t *testing.T, py, scr string, r round, n int, dir string, resume int, args ...string) []*proc {
	t.Helper()
	ps := make([]*proc, r.world)
	for rank := range ps {
		env := append(r.env(rank), "FLEETD_ROUND="+strconv.Itoa(n),
			"FLEETD_CHECKPOINT_REQUEST="+filepath.Join(dir, fmt.Sprintf("request-%d.json", rank)),
			"FLEETD_CHECKPOINT_DONE="+filepath.Join(dir, fmt.Sprintf("round-%d-rank-%d.checkpoint", n, rank)))
		if resume >= 0 {
			env = append(env, "FLEETD_RESUME_STEP="+strconv.Itoa(resume))
		}
		argv := append([]string{py, "-u", scr}, args...)
		ps[rank] = start(t, fmt.Sprintf("round %d rank %d", n, rank), env, argv...)
	}
	return ps
}

func testCheckpointOnNotice(t *testing.T, py, scr string, extra []string) {
	ckpt, dir := t.TempDir(), t.TempDir()
	args := append([]string{"--steps", "100000", "--ckpt-every", "1000"}, extra...)
	r1 := round{world: 3, port: freePort(t), ckpt: ckpt, runID: "notice"}
	ps := noticeRound(t, py, scr, r1, 1, dir, -1, args...)
	ps[0].waitFor(t, 90*time.Second, "step 5", func(ev event) bool { return ev.Event == "step" && ev.Step >= 5 })

	// Rank 2's node got the notice; every node's agent writes its request
	// and SIGTERMs its worker.
	deadline := time.Now().Add(20 * time.Second).UTC().Format(time.RFC3339Nano)
	for rank, p := range ps {
		req := fmt.Sprintf(`{"round":1,"reason":"notice","detail":"node n2 excluded: spot-interruption notice","leaving":%v,"deadline":%q}`, rank == 2, deadline)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("request-%d.json", rank)), []byte(req), 0o644); err != nil {
			t.Fatal(err)
		}
		p.signal(t, syscall.SIGTERM)
	}
	asked := time.Now()
	for i, code := range waitAll(t, ps, 20*time.Second) {
		if code != 0 {
			t.Fatalf("rank %d exited %d after the checkpoint request, want 0", i, code)
		}
	}
	t.Logf("all ranks checkpointed and exited %v after the request", time.Since(asked).Round(time.Millisecond))

	saved := ps[0].last(t, "checkpoint")
	stopStep := ps[0].last(t, "step").Step
	if saved.Reason != "stop" || saved.Step != stopStep {
		t.Fatalf("rank 0's last checkpoint %+v; it stopped after step %d", saved, stopStep)
	}
	for rank, p := range ps {
		if s := p.last(t, "step").Step; s != stopStep {
			t.Errorf("rank %d stopped after step %d, rank 0 after %d", rank, s, stopStep)
		}
		st := p.last(t, "stop")
		if st.Request == nil || st.Request.Reason != "notice" || st.Request.Round != 1 || st.Request.Leaving != (rank == 2) {
			t.Errorf("rank %d stop event %+v: the request was not read", rank, st)
		}
		c := p.last(t, "checkpointed")
		if c.Step != stopStep || c.Time < saved.Time {
			t.Errorf("rank %d confirmed %+v before rank 0 saved step %d at %f", rank, c, stopStep, saved.Time)
		}
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("round-1-rank-%d.checkpoint", rank)))
		if err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(stopStep) {
			t.Errorf("rank %d FLEETD_CHECKPOINT_DONE: %q, %v; want %d", rank, b, err, stopStep)
		}
	}

	// The survivors' next round: resumes at the confirmed step, no step lost.
	final := stopStep + 5
	r2 := round{world: 2, port: freePort(t), ckpt: ckpt, runID: "notice"}
	args2 := append([]string{"--steps", strconv.Itoa(final), "--ckpt-every", "1000"}, extra...)
	ps2 := noticeRound(t, py, scr, r2, 2, dir, stopStep, args2...)
	for i, code := range waitAll(t, ps2, 90*time.Second) {
		if code != 0 {
			t.Fatalf("round 2 rank %d exited %d", i, code)
		}
	}
	for _, p := range ps2 {
		rs := p.last(t, "resume")
		if rs.Step != stopStep || rs.ExpectedStep == nil || *rs.ExpectedStep != stopStep {
			t.Fatalf("%s resumed %+v, want step %d (FLEETD_RESUME_STEP)", p.name, rs, stopStep)
		}
		if w := p.all("warning"); len(w) != 0 {
			t.Errorf("%s warned: %+v", p.name, w)
		}
		checkSteps(t, p, stopStep+1, final, 2)
	}
	t.Logf("lost steps: %d (stopped after step %d, resumed from %d)", stopStep-ps2[0].last(t, "resume").Step, stopStep, stopStep)
}

// TestResumeStepAheadOfCheckpoint: FLEETD_RESUME_STEP names a step the
// storage does not show (yet). Rank 0 waits --resume-wait for it, then
// resumes from what there is and says how many steps that costs.
func TestResumeStepAheadOfCheckpoint(t *testing.T) {
	t.Parallel()
	py, train := stdPython(t), script(t, "trainer/train.py")
	ckpt := t.TempDir()
	r := round{world: 1, port: freePort(t), ckpt: ckpt, runID: "ahead",
		extraEnv:  []string{"FLEETD_RESUME_STEP=12"},
		extraArgs: []string{"--steps", "3", "--step-time", "0", "--resume-wait", "0.5"}}
	start := time.Now()
	p := r.start(t, py, train)[0]
	if code := p.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if took := time.Since(start); took < 500*time.Millisecond {
		t.Errorf("rank 0 did not wait for the checkpoint (%v)", took)
	}
	w := p.last(t, "warning")
	if !strings.Contains(w.Message, "FLEETD_RESUME_STEP=12") || !strings.Contains(w.Message, "12 steps are recomputed") {
		t.Fatalf("warning %+v", w)
	}
}

// stopRequest is the request a stop event echoes.
type stopRequest struct {
	Round   int    `json:"round"`
	Reason  string `json:"reason"`
	Leaving bool   `json:"leaving"`
}
