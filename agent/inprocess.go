package agent

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/fleetd/fleetd/agentwire"
	"github.com/fleetd/fleetd/rendezvous"
)

// In-process elastic mode (docs/agent.md, "In-process elastic mode"): the
// workers stay alive across membership changes. At a new round the agent
// does not stop them; it writes the node's new assignment to
// FLEETD_ELASTIC_FILE, where fleetd_elastic (the Python helper the agent
// ships) finds it at the next step boundary; the workers leave the old
// process group after a step all of them agree on and form the new one,
// and joiners (started fresh, as in restart mode) are handed the state by
// a survivor. Workers that do not speak the protocol (no hello line) are
// restarted as in restart mode.

//go:embed fleetd_elastic.py
var elasticHelperPy []byte

// Elastic modes (TrainingConfig.Elastic, the spec's training.elastic).
const (
	ElasticRestart   = "restart"
	ElasticInProcess = agentwire.ElasticInProcess
)

// Files of the in-process mode, in the agent's work dir.
const (
	ElasticFileName       = "elastic.json"      // FLEETD_ELASTIC_FILE
	HelperDirName         = "python"            // put first on the workers' PYTHONPATH
	ElasticHelperFileName = "fleetd_elastic.py" // the helper, in HelperDirName
)

// elasticProtocol is the version of the FLEETD_ELASTIC_FILE format; the
// helper ignores messages of another version.
const elasticProtocol = 1

// States of an ElasticMessage.
const (
	elasticAssigned = "assigned" // join the assignment's round
	elasticWaiting  = "waiting"  // leave the running group at the agreed step; a round is forming
	elasticLeave    = "leave"    // this node leaves the job: leave the group at the agreed step and exit 0
)

// inProcessWarmDelay: in in-process mode a node refills its warm
// interpreters this long after it started workers (they serve only a
// restart), so their imports do not compete with a joiner's state
// transfer for the CPU.
const inProcessWarmDelay = 10 * time.Second

// elasticLinePrefix starts every line fleetd_elastic prints about itself.
const elasticLinePrefix = `{"event":"elastic"`

// ElasticMessage is the content of FLEETD_ELASTIC_FILE, replaced
// atomically at every round change of an in-process job.
type ElasticMessage struct {
	Version int    `json:"version"`
	Round   int    `json:"round"`
	State   string `json:"state"`
	// Cause and Reason are the view's: why the running round was replaced.
	Cause  string `json:"cause,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Assignment and Workers are set when State is assigned: the node's
	// place in the round, and each local rank's round variables (RANK,
	// WORLD_SIZE, MASTER_ADDR, MASTER_PORT, FLEETD_ROUND, the per-round
	// files…), which the helper puts into os.environ.
	Assignment *rendezvous.Assignment `json:"assignment,omitempty"`
	Workers    []ElasticWorker        `json:"workers,omitempty"`
	WrittenAt  time.Time              `json:"written_at"`
}

// ElasticWorker is one local rank's environment for a round.
type ElasticWorker struct {
	LocalRank int               `json:"local_rank"`
	Env       map[string]string `json:"env"`
}

// writeElasticHelper writes fleetd_elastic.py into dir.
func writeElasticHelper(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, ElasticHelperFileName), elasticHelperPy)
}

// elasticFileFor is FLEETD_ELASTIC_FILE for tc: set in in-process mode
// (when the helper could be written), else empty.
func (s *supervisor) elasticFileFor(tc TrainingConfig) string {
	if tc.InProcess() && s.helperDir != "" {
		return s.elasticFile
	}
	return ""
}

// roundEnv is what the helper sets in os.environ when its worker moves to
// assignment a: the round's variables and fleetd's own (never the
// agent's environment or the spec's env, which do not change with a
// round).
func (s *supervisor) roundEnv(a rendezvous.Assignment, tc TrainingConfig, restartCount, lr int) map[string]string {
	dir := filepath.Join(s.logDir, "round-"+strconv.Itoa(a.Round))
	p := s.envParams(a, tc, restartCount, dir)
	p.Base = nil
	p.Training.Env = nil
	out := map[string]string{}
	for _, kv := range workerEnv(p, lr) {
		k, v, _ := strings.Cut(kv, "=")
		if roundEnvKeys[k] || strings.HasPrefix(k, "FLEETD_") || strings.HasPrefix(k, "TORCHELASTIC_") ||
			k == "LOCAL_RANK" || k == "LOCAL_WORLD_SIZE" || k == "ROLE_NAME" {
			out[k] = v
		}
	}
	return out
}

// tell replaces FLEETD_ELASTIC_FILE: state for round v.Round, with the
// assignment a when state is assigned.
func (e *elastic) tell(state string, v rendezvous.View, a *rendezvous.Assignment) error {
	msg := ElasticMessage{Version: elasticProtocol, Round: v.Round, State: state, Cause: v.Cause, Reason: v.Reason,
		WrittenAt: time.Now().UTC()}
	if a != nil {
		tc := e.trainingConfig()
		cp := *a
		msg.Assignment = &cp
		for lr := range a.LocalWorldSize {
			msg.Workers = append(msg.Workers, ElasticWorker{LocalRank: lr, Env: e.sup.roundEnv(*a, tc, e.restarts, lr)})
		}
	}
	return writeJSONAtomic(e.sup.elasticFile, msg)
}

// canHandOver reports whether the node's live workers follow the
// in-process protocol: the job is in in-process mode and every worker of
// the current set runs and said hello.
func (e *elastic) canHandOver() bool {
	if !e.trainingConfig().InProcess() || e.sup.elasticFile == "" || e.ws == nil || e.ws.stopping.Load() || e.ws.handled {
		return false
	}
	for _, w := range e.ws.workers {
		if w.exited() || !w.elastic.Load() {
			return false
		}
	}
	return len(e.ws.workers) > 0
}

// explainNoHandOver logs why an in-process job restarts its workers.
func (e *elastic) explainNoHandOver(round int) {
	if !e.trainingConfig().InProcess() || e.ws == nil || !e.ws.running() || e.ws.stopping.Load() {
		return
	}
	var silent []int
	for _, w := range e.ws.workers {
		if !w.exited() && !w.elastic.Load() {
			silent = append(silent, w.rank)
		}
	}
	if len(silent) > 0 {
		e.a.log.Warn("in-process mode: these workers have not loaded fleetd_elastic (yet); restarting them for the new round",
			"round", round, "ranks", fmt.Sprint(silent))
	}
}

// handOver moves the running workers to the round of v: their logs go to
// the round's directory from their next line on, and the assignment goes
// to FLEETD_ELASTIC_FILE. It reports false (nothing changed) when that
// cannot be done; the caller then restarts the workers.
func (e *elastic) handOver(v rendezvous.View) bool {
	a := *v.Assignment
	set := e.ws
	if a.LocalWorldSize != len(set.workers) {
		return false
	}
	start := time.Now()
	dir := filepath.Join(e.sup.logDir, "round-"+strconv.Itoa(a.Round))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		e.a.log.Error("in-process mode: the round's log dir cannot be made; restarting the workers", "err", err)
		return false
	}
	if err := e.tell(elasticAssigned, v, &a); err != nil {
		e.a.log.Error("in-process mode: writing the new round failed; restarting the workers", "file", e.sup.elasticFile, "err", err)
		return false
	}
	from := set.round
	for _, w := range set.workers {
		w.rank = a.Rank(w.localRank)
		w.logFile = filepath.Join(dir, "rank-"+strconv.Itoa(w.rank)+".log")
		w.errorFile = filepath.Join(dir, "rank-"+strconv.Itoa(w.rank)+".error.json")
		w.doneFile = filepath.Join(dir, "rank-"+strconv.Itoa(w.rank)+".checkpoint")
		_ = os.Remove(w.errorFile)
		_ = os.Remove(w.doneFile)
		f, err := os.OpenFile(w.logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			e.a.log.Warn("in-process mode: the worker's new log cannot be opened; it keeps the old one", "rank", w.rank, "err", err)
			continue
		}
		if w.out != nil {
			w.out.reattach(f, a.Round, w.rank)
		} else {
			f.Close()
		}
	}
	set.round, set.assign = a.Round, a
	e.prog.Store(newProgressTail(filepath.Join(dir, ProgressFile), a))
	e.setStatus(a.Round, wsRunning)
	e.a.log.Info("in-process: new round handed to the running workers", "round", a.Round, "from_round", from,
		"group_rank", a.GroupRank, "world_size", a.WorldSize, "master", fmt.Sprintf("%s:%d", a.MasterAddr, a.MasterPort),
		"cause", v.Cause, "took", time.Since(start).Round(time.Microsecond).String())
	return true
}

// holdInProcess tells the running workers that their round ended and
// the next one is forming: they leave the group at the agreed step and
// wait, keeping their state.
func (e *elastic) holdInProcess(v rendezvous.View) bool {
	if err := e.tell(elasticWaiting, v, nil); err != nil {
		e.a.log.Error("in-process mode: writing the round change failed; stopping the workers", "err", err)
		return false
	}
	e.setStatus(e.ws.round, string(v.State))
	e.a.log.Info("in-process: the workers wait for the next round", "round", v.Round, "state", string(v.State),
		"workers_round", e.ws.round, "cause", v.Cause)
	return true
}

// leaveInProcess makes the node's workers leave the job (the node was
// excluded): they leave the group after the step the group agrees on
// (the survivors keep the state; if nobody survives, rank 0 checkpoints
// first) and exit 0. What is still alive at the bound (as for a
// checkpoint request) is stopped.
func (e *elastic) leaveInProcess(v rendezvous.View) bool {
	set := e.ws
	start := time.Now()
	nd := e.a.noticeDeadline()
	if nd.IsZero() {
		nd = v.NoticeDeadline
	}
	bound := e.checkpointBound(nd, start)
	if err := e.tell(elasticLeave, v, nil); err != nil {
		e.a.log.Error("in-process mode: writing the leave failed; stopping the workers", "err", err)
		return false
	}
	set.stopping.Store(true)
	e.a.log.Info("in-process: asking the workers to leave the job", "round", set.round, "reason", v.Reason,
		"bound", bound.Round(time.Millisecond).String())
	t := time.NewTimer(bound)
	defer t.Stop()
	left := true
	for _, w := range set.workers {
		select {
		case <-w.done:
			continue
		case <-t.C:
		}
		left = false
		break
	}
	killed := 0
	if !left {
		killed = set.stop(minCheckpointGrace)
	}
	attrs := []any{"round", set.round, "took", time.Since(start).Round(time.Millisecond).String(), "sigkilled", killed}
	if step, n := set.checkpointed(); n > 0 {
		attrs = append(attrs, "checkpoint_step", step)
	}
	if left {
		e.a.log.Info("in-process: the workers left the job", attrs...)
	} else {
		e.a.log.Warn("in-process: the workers did not leave within the bound; stopped them", attrs...)
	}
	return true
}

// elasticEvent is the part of a fleetd_elastic line the agent reads.
type elasticEvent struct {
	What string `json:"what"`
}

// elasticLogged are the helper's events worth a line in the agent's log
// (the others, such as hello, change state only).
var elasticLogged = map[string]bool{
	"agreed": true, "joined": true, "reconfigured": true, "synced": true, "collective-failed": true,
	"leave": true, "peer-lost": true, "join-failed": true, "waiting": true, "aborted": true, "loaded": true,
}

// onElasticLine takes a line fleetd_elastic printed for worker w (round:
// the log it went to).
func (s *supervisor) onElasticLine(w *worker, round int, line string) {
	var ev elasticEvent
	if json.Unmarshal([]byte(line), &ev) != nil {
		return
	}
	if ev.What == "hello" {
		if !w.elastic.Swap(true) {
			s.log.Info("fleetd_elastic: worker says hello", "round", round, "rank", w.rank, "pid", w.pid)
		}
		return
	}
	if !elasticLogged[ev.What] {
		return
	}
	var fields map[string]any
	if json.Unmarshal([]byte(line), &fields) != nil {
		return
	}
	attrs := []any{"worker_pid", w.pid, "log_round", round}
	for _, k := range []string{"round", "rank", "world_size", "step", "took", "from_round", "next_round", "leaving",
		"members_leaving", "src", "sent", "bytes", "seconds", "mib_per_s", "why", "error", "reason", "failure"} {
		if v, ok := fields[k]; ok {
			attrs = append(attrs, k, v)
		}
	}
	s.log.Info("fleetd_elastic: worker "+ev.What, attrs...)
}
