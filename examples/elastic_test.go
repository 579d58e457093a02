package examples

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// helperEvent is a {"event":"elastic"} line of fleetd_elastic.
type helperEvent struct {
	What         string `json:"what"`
	Step         int    `json:"step"`
	Signal       string `json:"signal"`
	Checkpointed bool   `json:"checkpointed"`
}

func (p *proc) helperEvents(what string) []helperEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []helperEvent
	for _, l := range p.out {
		var ev helperEvent
		if strings.HasPrefix(l, `{"event":"elastic"`) && json.Unmarshal([]byte(l), &ev) == nil && ev.What == what {
			out = append(out, ev)
		}
	}
	return out
}

// TestElasticExampleRestartMode: examples/pytorch/elastic_train.py, written
// for the in-process mode, behaves as an ordinary torchrun-style script in
// restart mode (no FLEETD_ELASTIC): the checkpoint-on-notice contract (a
// SIGTERM to every worker stops all of them after the same step, rank 0
// saves it, each confirms it in FLEETD_CHECKPOINT_DONE and exits 0) and a
// next round of another size that resumes from that checkpoint at the
// same data position.
func TestElasticExampleRestartMode(t *testing.T) {
	t.Parallel()
	py, scr := torchPython(t), script(t, "pytorch/elastic_train.py")
	ckpt, dir := t.TempDir(), t.TempDir()
	args := []string{"--steps", "100000", "--ckpt-every", "1000", "--step-time", "0.03", "--samples", "64", "--batch", "4"}
	r1 := round{world: 3, port: freePort(t), ckpt: ckpt, runID: "elastic"}
	ps := noticeRound(t, py, scr, r1, 1, dir, -1, args...)
	ps[0].waitFor(t, 90*time.Second, "step 5", func(ev event) bool { return ev.Event == "step" && ev.Step >= 5 })
	for _, p := range ps {
		p.signal(t, syscall.SIGTERM)
	}
	for i, code := range waitAll(t, ps, 30*time.Second) {
		if code != 0 {
			t.Fatalf("rank %d exited %d after SIGTERM, want 0", i, code)
		}
	}
	stopStep := ps[0].last(t, "step").Step
	if saved := ps[0].last(t, "checkpoint"); saved.Step != stopStep {
		t.Fatalf("rank 0 saved step %d; it stopped after step %d", saved.Step, stopStep)
	}
	for rank, p := range ps {
		if s := p.last(t, "step").Step; s != stopStep {
			t.Errorf("rank %d stopped after step %d, rank 0 after %d", rank, s, stopStep)
		}
		st := p.helperEvents("stop")
		if len(st) != 1 || st[0].Step != stopStep || !st[0].Checkpointed || st[0].Signal != "SIGTERM" {
			t.Errorf("rank %d stop events %+v, want one at step %d, checkpointed, SIGTERM", rank, st, stopStep)
		}
		b, err := os.ReadFile(filepath.Join(dir, "round-1-rank-"+strconv.Itoa(rank)+".checkpoint"))
		if err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(stopStep) {
			t.Errorf("rank %d FLEETD_CHECKPOINT_DONE: %q, %v; want %d", rank, b, err, stopStep)
		}
	}

	final := stopStep + 5
	r2 := round{world: 2, port: freePort(t), ckpt: ckpt, runID: "elastic"}
	args2 := append([]string{"--steps", strconv.Itoa(final)}, args[2:]...)
	ps2 := noticeRound(t, py, scr, r2, 2, dir, stopStep, args2...)
	for i, code := range waitAll(t, ps2, 90*time.Second) {
		if code != 0 {
			t.Fatalf("round 2 rank %d exited %d", i, code)
		}
	}
	if rs := ps2[0].last(t, "resume"); rs.Step != stopStep || rs.ExpectedStep == nil || *rs.ExpectedStep != stopStep {
		t.Fatalf("rank 0 resumed %+v, want step %d (FLEETD_RESUME_STEP)", rs, stopStep)
	}
	for _, p := range ps2 {
		checkSteps(t, p, stopStep+1, final, 2)
	}
	if _, err := os.Stat(filepath.Join(ckpt, "DONE")); err != nil {
		t.Errorf("no DONE marker after the run: %v", err)
	}
}
