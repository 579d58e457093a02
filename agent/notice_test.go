package agent

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/providers/local/imdsfake"
	"github.com/fleetd/fleetd/rendezvous"
)

// agentLogLine is one line of the agent's JSON log, the fields the
// checkpoint tests read.
type agentLogLine struct {
	Msg            string `json:"msg"`
	Round          int    `json:"round"`
	Took           string `json:"took"`
	Sigkilled      int    `json:"sigkilled"`
	CheckpointStep *int64 `json:"checkpoint_step"`
	Bound          string `json:"bound"`
	Leaving        bool   `json:"leaving"`
}

func (a *testAgent) logLines(t *testing.T, msg string) []agentLogLine {
	t.Helper()
	b, err := os.ReadFile(a.paths().LogFile)
	if err != nil {
		t.Fatal(err)
	}
	var out []agentLogLine
	for line := range strings.Lines(string(b)) {
		var l agentLogLine
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == msg {
			out = append(out, l)
		}
	}
	return out
}

func (l agentLogLine) took(t *testing.T) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(l.Took)
	if err != nil {
		t.Fatalf("log line %+v: %v", l, err)
	}
	return d
}

// TestNoticeCheckpointsBeforeRoundChange: the rank-0 node (the checkpoint
// writer) gets a notice. Its agent and the survivors' agents ask their
// workers to checkpoint (request file + SIGTERM); the trainer, which
// checkpoints only every 1000 steps on its own, saves the step the group
// stopped at, every worker confirms it and exits 0 well within the bound,
// and the survivors' next round resumes exactly there: no step is lost.
func TestNoticeCheckpointsBeforeRoundChange(t *testing.T) {
	const steps = 120
	d, agents, ckpt := startThree(t, steps, 0, nil, "--ckpt-every", "1000")
	victim, survivors := groupRankZero(t, d, agents)
	if err := d.service().Exclude(context.Background(), testFleet, victim.id, "spot-interruption notice (test)"); err != nil {
		t.Fatal(err)
	}
	asked := time.Now()
	waitAll(t, 45*time.Second, agents...)
	wantDone(t, d, true)
	if c := readCheckpoint(t, ckpt); c.Step != steps || c.WorldSize != 2 {
		t.Errorf("final checkpoint %+v, want step %d at world size 2", c, steps)
	}

	// Round 1 ended on a notice: every worker saw the request, the group
	// stopped after one step, and every worker confirmed its checkpoint.
	var round1Max int64
	for _, a := range agents {
		for _, ev := range a.events(t) {
			if ev.Round == 1 && ev.Event == "step" {
				round1Max = max(round1Max, ev.Step)
			}
		}
	}
	grace := d.tc.DrainGrace
	for _, a := range agents {
		var stop, confirmed *event
		for _, ev := range a.events(t) {
			if ev.Round != 1 {
				continue
			}
			switch ev.Event {
			case "stop":
				stop = &ev
			case "checkpointed":
				confirmed = &ev
			}
		}
		if stop == nil || stop.Signal != "SIGTERM" || stop.Request == nil {
			t.Fatalf("agent %s: round 1 stop event %+v: no SIGTERM with a checkpoint request", a.id, stop)
		}
		req := stop.Request
		if req.Round != 1 || req.Reason != rendezvous.CauseNotice || req.Leaving != (a == victim) ||
			!strings.Contains(req.Detail, "spot-interruption notice (test)") {
			t.Errorf("agent %s: request %+v", a.id, req)
		}
		// No notice deadline is known here (the daemon excluded the node):
		// the bound is drain_grace, for the survivors too (not RestartGrace).
		if b := req.Deadline.Sub(req.RequestedAt); b != grace {
			t.Errorf("agent %s: request bound %v, want drain_grace %v", a.id, b, grace)
		}
		if confirmed == nil || confirmed.Step != round1Max {
			t.Errorf("agent %s: confirmed checkpoint %+v, want step %d (the last step of round 1)", a.id, confirmed, round1Max)
		}
		lines := a.logLines(t, "workers checkpointed and stopped")
		if len(lines) != 1 || lines[0].Round != 1 || lines[0].Sigkilled != 0 || lines[0].CheckpointStep == nil ||
			*lines[0].CheckpointStep != round1Max || lines[0].took(t) > grace/2 {
			t.Errorf("agent %s: %+v, want round 1 checkpointed at step %d, nothing killed, well within %v", a.id, lines, round1Max, grace)
		} else {
			t.Logf("agent %s: workers checkpointed step %d and exited %s after the request", a.id, round1Max, lines[0].Took)
		}
		if _, err := os.Stat(a.paths().CheckpointRequest); !os.IsNotExist(err) {
			t.Errorf("agent %s: request file left behind: %v", a.id, err)
		}
	}

	// The survivors' round 2 resumes from that step, told so by the agent.
	for _, a := range survivors {
		var start, resume *event
		for _, ev := range a.events(t) {
			if ev.Round == 2 && ev.Event == "start" {
				start = &ev
			}
			if ev.Round == 2 && ev.Event == "resume" {
				resume = &ev
			}
		}
		if start == nil || start.ResumeStep == nil || *start.ResumeStep != round1Max {
			t.Errorf("agent %s: round 2 start %+v, want FLEETD_RESUME_STEP=%d", a.id, start, round1Max)
		}
		if resume == nil || resume.Step != round1Max {
			t.Fatalf("agent %s: round 2 resume %+v, want step %d", a.id, resume, round1Max)
		}
		t.Logf("agent %s: lost steps %d (round 1 reached %d, round 2 resumed from %d)", a.id, round1Max-resume.Step, round1Max, resume.Step)
	}
	if r := victim.rounds(t); !slices.Equal(r, []int{1}) {
		t.Errorf("the node with the notice ran rounds %v, want only round 1", r)
	}
	t.Logf("notice to job end: %v", time.Since(asked).Round(time.Millisecond))
}

// ignoreTermScript ignores SIGTERM in round 1 and reports the checkpoint
// request it sees; in a later round it reports its environment and ends
// the job.
const ignoreTermScript = `
import json, os, signal, sys, time
def emit(**kv):
    print(json.dumps(kv), flush=True)
resume = os.environ.get("FLEETD_RESUME_STEP")
emit(event="start", pid=os.getpid(), resume_step=int(resume) if resume else None)
if os.environ["FLEETD_ROUND"] != "1":
    with open(os.path.join(os.environ["FLEETD_CHECKPOINT_URI"], "DONE"), "w") as f:
        f.write("{}\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
seen = False
while True:
    path = os.environ["FLEETD_CHECKPOINT_REQUEST"]
    if not seen and os.path.exists(path):
        with open(path) as f:
            emit(event="stop", signal="ignored", request=json.load(f))
        seen = True
    time.sleep(0.05)
`

// TestIgnoredCheckpointRequestIsKilledAtBound: a script that ignores the
// request still works, it is SIGKILLed at the bound, NoticeMargin before
// the notice's deadline (sooner than drain_grace): on the node with the
// notice, which read it in its metadata, and on the survivor, which has it
// from the rendezvous view. The next round gets no FLEETD_RESUME_STEP,
// since nobody confirmed a checkpoint.
func TestIgnoredCheckpointRequestIsKilledAtBound(t *testing.T) {
	py := needPython(t)
	addrs := loopbackAddrs(t, 2)
	fake := imdsfake.New(imdsfake.Identity{InstanceID: "i-0leaver", AvailabilityZone: "local-1a", LifeCycle: "spot", LocalIPv4: addrs[0]}, nil)
	meta := serveIMDS(t, fake)

	dir, ckpt := t.TempDir(), t.TempDir()
	scr := filepath.Join(dir, "ignore.py")
	if err := os.WriteFile(scr, []byte(ignoreTermScript), 0o644); err != nil {
		t.Fatal(err)
	}
	const drainGrace, margin = 8 * time.Second, 2 * time.Second
	tc := TrainingConfig{Command: []string{py, scr}, NprocPerNode: 1, MaxRestarts: 3, DrainGrace: drainGrace, CheckpointURI: ckpt}
	rc := rdzvConfig(t, 1, 2)
	rc.LastCall = 15 * time.Second // round 1 has both nodes, however slowly one starts
	d := newFakeDaemon(t, rc, tc)
	leaver := startAgent(t, d, "leaver", addrs[0], func(o *Options) {
		o.Config.Metadata = MetadataConfig{Kind: MetadataAWSIMDS}
		o.MetadataURL = meta.URL
		o.PollInterval = 50 * time.Millisecond
		o.NoticeMargin = margin
	})
	survivor := startAgent(t, d, "survivor", addrs[1], func(o *Options) { o.NoticeMargin = margin })
	waitFor(t, 20*time.Second, "both workers of round 1", func() bool {
		st, err := d.service().Status(testFleet)
		return err == nil && st.Round == 1 && len(st.Members) == 2 && len(leaver.events(t)) > 0 && len(survivor.events(t)) > 0
	})

	const lead = 6 * time.Second
	noticeDeadline := time.Now().Add(lead).UTC().Truncate(time.Second) // IMDS has whole seconds
	fake.SetSpotAction("terminate", noticeDeadline)
	waitAll(t, 30*time.Second, survivor)
	wantDone(t, d, true)
	waitFor(t, 10*time.Second, "the leaver's workers stopped", func() bool {
		return len(leaver.logLines(t, "workers stopped without confirming a checkpoint")) > 0
	})

	for _, tt := range []struct {
		a       *testAgent
		leaving bool
		min     time.Duration
		max     time.Duration
	}{
		// The leaver's bound ends margin before the notice deadline, 3-4s
		// after the notice: well before drain_grace.
		{leaver, true, 1500 * time.Millisecond, lead - margin + time.Second},
		// So does the survivor's: the view of the new round carries the
		// deadline (it used to wait drain_grace).
		{survivor, false, 1500 * time.Millisecond, lead - margin + time.Second},
	} {
		var req *CheckpointRequest
		for _, ev := range tt.a.events(t) {
			if ev.Round == 1 && ev.Event == "stop" {
				req = ev.Request
			}
		}
		if req == nil || req.Leaving != tt.leaving || req.Reason != rendezvous.CauseNotice {
			t.Errorf("agent %s: the worker saw request %+v", tt.a.id, req)
		}
		if req != nil && !req.NoticeDeadline.Equal(noticeDeadline) {
			t.Errorf("agent %s: request's notice deadline %v, want %v", tt.a.id, req.NoticeDeadline, noticeDeadline)
		}
		lines := tt.a.logLines(t, "workers stopped without confirming a checkpoint")
		if len(lines) != 1 || lines[0].Sigkilled != 1 || lines[0].CheckpointStep != nil {
			t.Fatalf("agent %s: %+v, want one SIGKILLed worker without a checkpoint", tt.a.id, lines)
		}
		asked := tt.a.logLines(t, "asking workers to checkpoint before they stop")
		if len(asked) != 1 || asked[0].Leaving != tt.leaving {
			t.Fatalf("agent %s: %+v", tt.a.id, asked)
		}
		if took := lines[0].took(t); took < tt.min || took > tt.max {
			t.Errorf("agent %s: the ignoring worker was killed %v after the request, want %v..%v", tt.a.id, took, tt.min, tt.max)
		} else {
			t.Logf("agent %s (leaving %v): bound %s, ignoring worker SIGKILLed %v after the request", tt.a.id, tt.leaving, asked[0].Bound, took)
		}
	}
	var next *event
	for _, ev := range survivor.events(t) {
		if ev.Round == 2 && ev.Event == "start" {
			next = &ev
		}
	}
	if next == nil || next.ResumeStep != nil {
		t.Errorf("survivor's round 2 start %+v: want it started, without FLEETD_RESUME_STEP", next)
	}
	leaver.cancel()
	if err := leaver.wait(t, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}
