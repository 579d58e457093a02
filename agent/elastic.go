package agent

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetd/fleetd/internal/ctxtime"
	"github.com/fleetd/fleetd/rendezvous"
)

// Defaults of the elastic agent's timing knobs (Options).
const (
	DefaultPeerLostWindow = 30 * time.Second
	DefaultRestartGrace   = 10 * time.Second
	DefaultDoneMarkerWait = 30 * time.Second
	DefaultLeaveTimeout   = 5 * time.Second
	DefaultMaxBackoff     = 5 * time.Second
	defaultDrainGrace     = 30 * time.Second // torchrun's shutdown timeout
	// DefaultNoticeMargin: workers asked to checkpoint on a notice must be
	// gone this long before the notice's deadline (Options.NoticeMargin).
	DefaultNoticeMargin = 5 * time.Second
	// minCheckpointGrace: even past the deadline, workers get this long
	// between SIGTERM and SIGKILL.
	minCheckpointGrace = time.Second
	defaultHeartbeat   = 2 * time.Second
	minBackoff         = 200 * time.Millisecond
	progressEvery      = 10 * time.Second
	// DefaultMasterListenWait bounds how long a node holds its warm
	// workers back until the master's store listens: torch < 2.4's
	// TCPStore client retries a refused connect once a second, so waiting
	// longer cannot win anything.
	DefaultMasterListenWait = time.Second
)

// ExitPeerLost is the worker exit code of a lost peer (docs/examples.md).
const ExitPeerLost = 3

// DoneMarker is the file a trainer writes into its checkpoint dir when the
// job is complete.
const DoneMarker = "DONE"

// Worker states reported in heartbeats.
const (
	wsNone       = "none"
	wsRunning    = "running"
	wsStopped    = "stopped"
	wsPeerLost   = "peer-lost"
	wsRestarting = "restarting"
	wsFailed     = "failed"
	wsSucceeded  = "succeeded"
	wsDrained    = "drained"
	wsStarting   = "starting" // waiting for the master's store
	// checkpointing: asked to checkpoint before stopping (notice)
	wsCheckpointing = "checkpointing"
)

// elastic is the controller: one goroutine owns the node's rendezvous view
// and its workers; watch, heartbeat and worker goroutines feed it events.
type elastic struct {
	a     *agent
	dc    *daemonClient
	hc    *http.Client
	rz    *rendezvous.Client
	id    identity
	sup   *supervisor
	peers peerServer // serves staged data to peers (peerstage.go)
	b     backoff
	fleet string
	node  string

	mu       sync.Mutex // guards training, hbRound, hbState, hbListen (read by the heartbeat)
	training TrainingConfig
	hbRound  int
	hbState  string
	hbListen int           // the round whose store this (master) node's worker listens on
	hbKick   chan struct{} // an immediate heartbeat (with hbListen)

	step    atomic.Int64
	hasStep atomic.Bool
	hbEvery atomic.Int64 // ns
	// ckpt manages training.checkpoint (nil without one).
	ckpt *checkpoints
	// prog follows the current round's progress file (FLEETD_PROGRESS);
	// noProgress: the daemon refused the heartbeat's progress field (an
	// older daemon), so heartbeats carry none.
	prog       atomic.Pointer[progressTail]
	noProgress atomic.Bool
	// doneBefore: the checkpoint's DONE marker was there when the current
	// round's workers started (the job had finished before this run).
	doneBefore bool

	// Owned by the controller goroutine.
	session  string
	cur      rendezvous.View
	curAt    time.Time
	joined   bool
	ws       *workerSet
	restarts int
	failed   bool // max_restarts exceeded: no more workers
	excluded bool
	finished bool
	doneSent bool
	peerLost *time.Timer
	doneWait *time.Timer
	// pending is an assignment whose warm workers wait (at most
	// MasterListenWait, timer pendingT) for the master's store.
	pending   *rendezvous.Assignment
	pendingT  *time.Timer
	pendingAt time.Time
	watchGen  int
	watchStop context.CancelFunc

	views       chan watchResult
	hints       chan rendezvous.HeartbeatResponse
	reconnected chan struct{}
	timers      chan timerEvent
}

type watchResult struct {
	gen  int
	view rendezvous.View
}

type timerEvent struct {
	kind  string // "peer-lost", "done-wait", "master-listen" or "warm-refill"
	set   *workerSet
	round int // master-listen: the pending round
}

func newElastic(a *agent, dc *daemonClient, hc *http.Client, sup *supervisor) *elastic {
	cfg := a.opts.Config
	return &elastic{
		a: a, dc: dc, hc: hc, sup: sup,
		fleet: cfg.Fleet, node: cfg.NodeID,
		b:           backoff{min: minBackoff, max: a.opts.MaxBackoff},
		session:     rendezvous.NewSession(),
		hbState:     wsNone,
		hbKick:      make(chan struct{}, 1),
		views:       make(chan watchResult, 1),
		hints:       make(chan rendezvous.HeartbeatResponse, 1),
		reconnected: a.reconnected,
		timers:      make(chan timerEvent, 4),
	}
}

// every rate-limits a repeated log line.
type every struct {
	d    time.Duration
	last time.Time
}

func (r *every) ok() bool {
	if now := time.Now(); now.Sub(r.last) >= r.d {
		r.last = now
		return true
	}
	return false
}

// run is the agent's life with a daemon: register, join, then follow the
// rendezvous until the job is finished (nil) or ctx ends (graceful
// shutdown, nil).
func (e *elastic) run(ctx context.Context) error {
	defer close(e.sup.quit)
	defer e.sup.closeWarm("agent exits")
	defer e.stopWatch()
	if err := e.register(ctx); err != nil {
		e.shutdown()
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("agent: %w", err)
	}
	e.sup.prepareWarm(e.trainingConfig())
	// The latest checkpoint is restored while the warm interpreters
	// import, and before the node joins: its workers start on it.
	ckptCtx, stopCkpt := context.WithCancel(ctx)
	var ckptWG sync.WaitGroup
	defer func() { stopCkpt(); ckptWG.Wait() }()
	e.startCheckpoints(ckptCtx, &ckptWG)
	if err := e.stageData(ctx); err != nil { // the node joins with its data on disk
		e.shutdown()
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("agent: %w", err)
	}
	e.awaitWarm(ctx)
	v, err := e.join(ctx)
	if err != nil {
		e.shutdown()
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("agent: %w", err)
	}
	select {
	case <-e.reconnected: // a daemon that came up while we registered: nothing to redo
	default:
	}
	hbCtx, stopHB := context.WithCancel(ctx)
	defer stopHB()
	go e.heartbeatLoop(hbCtx)
	e.adopt(ctx, v)
	for !e.finished {
		if ctx.Err() != nil {
			break
		}
		e.ensureWatch(ctx)
		select {
		case <-ctx.Done():
		case r := <-e.views:
			if r.gen == e.watchGen {
				e.stopWatch()
				e.adopt(ctx, r.view)
			}
		case ex := <-e.sup.exits:
			e.onExit(ctx, ex)
		case t := <-e.timers:
			e.onTimer(ctx, t)
		case h := <-e.hints:
			// The heartbeat answer disagrees with our view for longer than
			// a watch answer takes: re-arm the watch, which then returns
			// at once with the current view.
			if (h.Round != e.cur.Round || h.State != e.cur.State) && time.Since(e.curAt) > 2*e.heartbeatEvery() {
				e.stopWatch()
			}
		case <-e.reconnected:
			e.a.log.Info("daemon reachable again: registering and re-joining with the same session")
			if e.register(ctx) != nil {
				continue
			}
			e.sup.prepareWarm(e.trainingConfig()) // the spec may have changed meanwhile
			if v, err := e.join(ctx); err == nil {
				e.adopt(ctx, v)
			}
		}
	}
	if e.finished {
		_ = e.flushCheckpoints(ctx) // logged; the node is deleted next either way
		e.a.log.Info("job finished: agent exits", "success", e.cur.Success, "round", e.cur.Round)
		return nil
	}
	e.shutdown()
	return nil
}

// awaitWarm holds the first join until the warm interpreters are ready,
// at most WarmJoinWait: a join re-forms the running round and restarts
// every worker of the job, which should not then wait for this node's
// imports. The job keeps training without the node meanwhile.
func (e *elastic) awaitWarm(ctx context.Context) {
	start := time.Now()
	n, ok := e.sup.waitWarm(ctx.Done(), e.a.opts.WarmJoinWait)
	switch {
	case n == 0 || ctx.Err() != nil:
	case ok:
		e.a.log.Info("warm interpreters ready; joining the rendezvous", "count", n, "waited", time.Since(start).Round(time.Millisecond).String())
	default:
		e.a.log.Warn("warm interpreters not ready; joining the rendezvous anyway", "count", n, "waited", time.Since(start).Round(time.Millisecond).String())
	}
}

// register announces the node to the daemon and takes the training config,
// retrying until it succeeds.
func (e *elastic) register(ctx context.Context) error {
	req := registerRequest{Address: e.id.Addr, Zone: e.id.Zone, InstanceID: e.id.InstanceID, AgentVersion: e.a.opts.Version}
	var resp registerResponse
	prog := every{d: progressEvery}
	start := time.Now()
	err := retry(ctx, e.b, func(ctx context.Context) error {
		var err error
		resp, err = e.dc.register(ctx, req)
		return err
	}, func(attempt int, err error) {
		if prog.ok() {
			e.a.log.Warn("waiting for the daemon to accept registration", "attempt", attempt, "waited", time.Since(start).Round(time.Second).String(), "err", err)
		}
	})
	if err != nil {
		if ctx.Err() == nil {
			e.a.log.Error("registration refused", "err", err)
		}
		return err
	}
	if resp.RendezvousURL == "" {
		resp.RendezvousURL = e.dc.base
	}
	tc := withDataEnv(resp.Training, e.a.opts.Root)
	e.mu.Lock()
	e.training = tc
	e.mu.Unlock()
	if tc.Heartbeat > 0 && e.hbEvery.Load() == 0 {
		e.hbEvery.Store(int64(tc.Heartbeat))
	}
	if e.rz == nil {
		e.rz = rendezvous.NewClient(resp.RendezvousURL, e.a.opts.Config.Token, e.hc)
		e.rz.MinBackoff, e.rz.MaxBackoff = minBackoff, e.a.opts.MaxBackoff
	}
	e.a.log.Info("registered", "address", e.id.Addr, "zone", e.id.Zone, "instance", e.id.InstanceID,
		"rendezvous_url", resp.RendezvousURL, "command", strings.Join(tc.Command, " "), "nproc_per_node", tc.NprocPerNode,
		"max_restarts", tc.MaxRestarts)
	return nil
}

func (e *elastic) trainingConfig() TrainingConfig {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.training
}

// join (re)joins the rendezvous with the current session, retrying until
// the daemon answers.
func (e *elastic) join(ctx context.Context) (rendezvous.View, error) {
	tc := e.trainingConfig()
	req := rendezvous.JoinRequest{NodeID: e.node, Addr: e.id.Addr, Zone: e.id.Zone, Nproc: max(tc.NprocPerNode, 1), Session: e.session}
	var v rendezvous.View
	prog := every{d: progressEvery}
	err := retry(ctx, e.b, func(ctx context.Context) error {
		var err error
		v, err = e.rz.Join(ctx, e.fleet, req)
		return err
	}, func(attempt int, err error) {
		if prog.ok() {
			e.a.log.Warn("joining the rendezvous failed; retrying", "attempt", attempt, "err", err)
		}
	})
	if err != nil {
		if ctx.Err() == nil {
			e.a.log.Error("rendezvous join refused", "err", err)
		}
		return v, err
	}
	e.joined = true
	return v, nil
}

func (e *elastic) heartbeatEvery() time.Duration {
	if d := time.Duration(e.hbEvery.Load()); d > 0 {
		return d
	}
	return defaultHeartbeat
}

// heartbeatLoop keeps the node alive and reports its workers. Its answer
// also tells the controller when the view moved on without the watch.
func (e *elastic) heartbeatLoop(ctx context.Context) {
	failing := false
	prog := every{d: progressEvery}
	for {
		interval := e.heartbeatEvery()
		t := time.NewTimer(interval)
		kicked := false
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-e.hbKick:
			t.Stop()
			kicked = true
		}
		e.mu.Lock()
		req := rendezvous.HeartbeatRequest{NodeID: e.node, Round: e.hbRound, Workers: e.hbState}
		if kicked {
			// Only in the heartbeat it triggered: an older daemon would
			// refuse the field in every heartbeat.
			req.Listening = e.hbListen
		}
		e.mu.Unlock()
		if e.hasStep.Load() {
			s := e.step.Load()
			req.Step = &s
		}
		req.Progress = e.progressReport()
		hctx, cancel := context.WithTimeout(ctx, max(3*interval, 3*time.Second))
		resp, err := e.rz.Heartbeat(hctx, e.fleet, req)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil && req.Progress != nil && strings.Contains(err.Error(), `unknown field "progress"`) {
			// An older daemon: training goes on, its progress is not forwarded.
			e.noProgress.Store(true)
			e.a.log.Warn("the daemon does not take progress reports (older version); not forwarding them", "err", err)
			continue
		}
		if err != nil {
			if !failing || prog.ok() {
				e.a.log.Warn("heartbeat failed; workers keep running", "err", err)
			}
			failing = true
			continue
		}
		if resp.HeartbeatMS > 0 {
			e.hbEvery.Store(int64(time.Duration(resp.HeartbeatMS) * time.Millisecond))
		}
		failing = false
		select {
		case e.hints <- resp:
		default:
		}
	}
}

// progressReport reads the current round's progress file and summarises
// it for the heartbeat; nil when there is nothing to forward.
func (e *elastic) progressReport() *rendezvous.Progress {
	t := e.prog.Load()
	if t == nil || e.noProgress.Load() {
		return nil
	}
	before, _ := t.invalid()
	t.poll()
	if n, line := t.invalid(); before == 0 && n > 0 {
		e.a.log.Warn("progress file has lines that are not reports (want a JSON object with an integer step per line); skipping them",
			"file", t.path, "round", t.round, "line", line)
	}
	return t.snapshot()
}

// ensureWatch keeps one long-poll running from the current view.
func (e *elastic) ensureWatch(ctx context.Context) {
	if e.watchStop != nil {
		return
	}
	e.watchGen++
	gen, last := e.watchGen, e.cur
	wctx, cancel := context.WithCancel(ctx)
	e.watchStop = cancel
	go func() {
		b := e.b
		prog := every{d: progressEvery}
		for {
			v, err := e.rz.Watch(wctx, e.fleet, e.node, last)
			if err == nil {
				select {
				case e.views <- watchResult{gen: gen, view: v}:
				case <-wctx.Done():
				}
				return
			}
			if wctx.Err() != nil {
				return
			}
			if prog.ok() {
				e.a.log.Warn("rendezvous watch failed; retrying", "err", err)
			}
			if ctxtime.Sleep(wctx, b.next()) != nil {
				return
			}
		}
	}()
}

func (e *elastic) stopWatch() {
	if e.watchStop != nil {
		e.watchStop()
		e.watchStop = nil
	}
}

func (e *elastic) setStatus(round int, state string) {
	e.mu.Lock()
	e.hbRound, e.hbState = round, state
	e.mu.Unlock()
}

// grace returns the SIGTERM→SIGKILL grace: drain_grace for drains and
// shutdown, at most RestartGrace for membership restarts (the survivors
// wait for every node's old workers to be gone).
func (e *elastic) grace(membership bool) time.Duration {
	g := e.trainingConfig().DrainGrace
	if g <= 0 {
		g = defaultDrainGrace
	}
	if membership {
		g = min(g, e.a.opts.RestartGrace)
	}
	return g
}

// checkpointAsk is a stop caused by an interruption notice: the workers
// are asked to checkpoint first (docs/agent.md, "Checkpoint on notice").
type checkpointAsk struct {
	leaving bool   // this node got the notice
	detail  string // which node, which notice
	// deadline is when the node with the notice goes away, as the
	// rendezvous view says (zero: unknown).
	deadline time.Time
}

// askFor returns the checkpoint request a view implies for the node's
// running workers: on a round change the rendezvous attributes to a
// notice, or nil.
func askFor(v rendezvous.View) *checkpointAsk {
	if v.Cause != rendezvous.CauseNotice {
		return nil
	}
	return &checkpointAsk{detail: v.Reason, deadline: v.NoticeDeadline}
}

// checkpointBound is how long workers asked to checkpoint may take before
// they are SIGKILLed: drain_grace, and at most until NoticeMargin before
// the notice's deadline (never less than minCheckpointGrace): on the node
// with the notice and, when the rendezvous view carries the deadline, on
// every survivor (their workers checkpoint together with the leaving
// node's, which is gone at the deadline).
func (e *elastic) checkpointBound(noticeDeadline, now time.Time) time.Duration {
	g := e.grace(false)
	if !noticeDeadline.IsZero() {
		g = min(g, noticeDeadline.Sub(now)-e.a.opts.NoticeMargin)
	}
	return max(g, minCheckpointGrace)
}

// stopWorkers stops the current workers, if any are alive. With ask, the
// workers are first asked to checkpoint: the request file is written,
// then they get SIGTERM and until the request's deadline.
func (e *elastic) stopWorkers(membership bool, why string, ask *checkpointAsk) {
	if e.ws == nil || !e.ws.running() {
		if e.ws != nil {
			e.ws.stopping.Store(true)
		}
		return
	}
	g := e.grace(membership)
	start := time.Now()
	var req *CheckpointRequest
	if ask != nil {
		nd := ask.deadline
		if ask.leaving {
			if own := e.a.noticeDeadline(); !own.IsZero() {
				nd = own
			}
		}
		g = e.checkpointBound(nd, start)
		req = &CheckpointRequest{Round: e.ws.round, Reason: rendezvous.CauseNotice, Detail: ask.detail, Leaving: ask.leaving,
			Deadline: start.Add(g).UTC(), NoticeDeadline: nd, RequestedAt: start.UTC()}
		if err := writeJSONAtomic(e.sup.requestFile, req); err != nil {
			e.a.log.Error("writing the checkpoint request failed; stopping the workers anyway", "err", err)
		}
		e.setStatus(e.ws.round, wsCheckpointing)
		e.a.log.Info("asking workers to checkpoint before they stop", "round", e.ws.round, "reason", why,
			"leaving", ask.leaving, "bound", g.Round(time.Millisecond).String(), "deadline", req.Deadline, "notice_deadline", nd, "file", e.sup.requestFile)
	} else {
		e.a.log.Info("stopping workers", "round", e.ws.round, "reason", why, "grace", g.String())
	}
	killed := e.ws.stop(g)
	step, n := e.ws.checkpointed()
	attrs := []any{"round", e.ws.round, "took", time.Since(start).Round(time.Millisecond).String(), "sigkilled", killed}
	if n > 0 {
		attrs = append(attrs, "checkpoint_step", step, "checkpointed_workers", n)
	}
	if req != nil {
		if err := os.Remove(e.sup.requestFile); err != nil && !os.IsNotExist(err) {
			e.a.log.Warn("removing the checkpoint request failed", "err", err)
		}
		attrs = append(attrs, "workers", len(e.ws.workers))
		if n == len(e.ws.workers) && killed == 0 {
			e.a.log.Info("workers checkpointed and stopped", attrs...)
			return
		}
		e.a.log.Warn("workers stopped without confirming a checkpoint", attrs...)
		return
	}
	e.a.log.Info("workers stopped", attrs...)
}

// resumeStep is FLEETD_RESUME_STEP for the next round: the step the
// node's last workers confirmed they checkpointed, if they did.
func (e *elastic) resumeStep() *int64 {
	if e.ws == nil {
		// The node's first workers: the checkpoint restored at start.
		if s := e.ckpt.restoredStep(); s >= 0 {
			return &s
		}
		return nil
	}
	if step, n := e.ws.checkpointed(); n > 0 {
		return &step
	}
	return nil
}

func (e *elastic) cancelTimers() {
	for _, t := range []**time.Timer{&e.peerLost, &e.doneWait, &e.pendingT} {
		if *t != nil {
			(*t).Stop()
			*t = nil
		}
	}
	e.pending = nil
}

func (e *elastic) after(d time.Duration, kind string, set *workerSet) *time.Timer {
	return time.AfterFunc(d, func() {
		select {
		case e.timers <- timerEvent{kind: kind, set: set}:
		case <-e.sup.quit:
		}
	})
}

// adopt acts on a rendezvous view.
func (e *elastic) adopt(ctx context.Context, v rendezvous.View) {
	prev := e.cur
	e.stopWatch()
	e.cur, e.curAt = v, time.Now()
	if v.HeartbeatMS > 0 {
		e.hbEvery.Store(int64(time.Duration(v.HeartbeatMS) * time.Millisecond))
	}
	if v.Round != prev.Round || v.State != prev.State {
		e.a.log.Info("rendezvous view", "round", v.Round, "round_state", string(v.RoundState), "state", string(v.State), "reason", v.Reason)
	}
	switch v.State {
	case rendezvous.NodeFinished:
		e.cancelTimers()
		e.stopWorkers(false, "job finished", nil)
		e.sup.closeWarm("job finished")
		e.setStatus(0, wsStopped)
		e.finished = true

	case rendezvous.NodeExcluded:
		if e.excluded {
			return
		}
		e.excluded = true
		e.cancelTimers()
		if err := e.a.drainForExclusion(v.Reason); err != nil {
			e.a.log.Error("writing drain file failed", "err", err)
		}
		e.setStatus(e.roundOf(), wsDrained)
		if !e.canHandOver() || !e.leaveInProcess(v) {
			e.stopWorkers(false, "excluded: "+v.Reason, &checkpointAsk{leaving: true, detail: "this node was excluded: " + v.Reason, deadline: v.NoticeDeadline})
		}
		e.sup.closeWarm("node excluded")
		e.setStatus(0, wsDrained)
		e.reportDrained(ctx, v)

	case rendezvous.NodeUnknown:
		// Not a member: dropped while silent, or the daemon forgot us.
		// Join again (same session); workers keep running if the answer
		// is still their round.
		if e.excluded || e.finished {
			return
		}
		if nv, err := e.join(ctx); err == nil && nv.State != rendezvous.NodeUnknown {
			e.adopt(ctx, nv)
		}

	case rendezvous.NodeWaiting, rendezvous.NodeStandby:
		e.cancelTimers()
		if e.canHandOver() && e.holdInProcess(v) {
			return
		}
		e.explainNoHandOver(v.Round)
		e.stopWorkers(true, "round "+fmt.Sprint(v.Round)+" is "+string(v.State), askFor(v))
		e.setStatus(0, string(v.State))

	case rendezvous.NodeAssigned:
		if v.Assignment == nil || e.failed || e.excluded {
			return
		}
		if e.ws != nil && e.ws.round == v.Round {
			return // this round's workers run (or ended; their exits are handled)
		}
		if e.pending != nil && e.pending.Round == v.Round {
			if v.MasterListening {
				e.startPending("the master's store listens")
			}
			return
		}
		e.cancelTimers()
		if e.canHandOver() && e.handOver(v) {
			return
		}
		e.explainNoHandOver(v.Round)
		e.stopWorkers(true, fmt.Sprintf("new round %d", v.Round), askFor(v))
		// Warm workers would reach MASTER_PORT before the master's new
		// store is up (its old worker checkpoints first) and then retry
		// only after a second: when this job's masters report their
		// store, wait for this round's report, briefly. Cold workers
		// import for longer than that anyway.
		// (In-process mode: fleetd_elastic waits for the store itself.)
		if v.MasterListens && !v.MasterListening && v.Assignment.GroupRank > 0 && !e.trainingConfig().InProcess() &&
			e.sup.hasWarm(e.trainingConfig(), v.Assignment.LocalWorldSize) {
			a := *v.Assignment
			e.pending, e.pendingAt = &a, time.Now()
			e.pendingT = time.AfterFunc(e.a.opts.MasterListenWait, func() {
				select {
				case e.timers <- timerEvent{kind: "master-listen", round: a.Round}:
				case <-e.sup.quit:
				}
			})
			e.setStatus(0, wsStarting)
			return
		}
		e.startWorkers(*v.Assignment)
	}
}

// startPending starts the workers of the pending assignment.
func (e *elastic) startPending(why string) {
	a := *e.pending
	waited := time.Since(e.pendingAt)
	e.cancelTimers()
	e.a.log.Info("waited for the master's store", "round", a.Round, "waited", waited.Round(time.Millisecond).String(), "reason", why)
	e.startWorkers(a)
}

func (e *elastic) roundOf() int {
	if e.ws != nil && e.ws.running() {
		return e.ws.round
	}
	return 0
}

func (e *elastic) startWorkers(a rendezvous.Assignment) {
	tc := e.trainingConfig()
	resume := e.resumeStep()
	attrs := []any{"round", a.Round, "group_rank", a.GroupRank, "group_world_size", a.GroupWorldSize,
		"world_size", a.WorldSize, "rank_offset", a.RankOffset, "master", fmt.Sprintf("%s:%d", a.MasterAddr, a.MasterPort),
		"restart_count", e.restarts}
	if resume != nil {
		attrs = append(attrs, "resume_step", *resume)
	}
	e.a.log.Info("starting workers", attrs...)
	e.prog.Store(newProgressTail(filepath.Join(e.sup.logDir, "round-"+strconv.Itoa(a.Round), ProgressFile), a))
	if dir, local := e.checkpointDir(); local {
		e.doneBefore = markerExists(dir)
	}
	if tc.InProcess() && e.sup.elasticFile != "" {
		// Fresh workers find their round there as well (and any later one).
		if err := e.tell(elasticAssigned, rendezvous.View{Round: a.Round}, &a); err != nil {
			e.a.log.Warn("in-process mode: writing the round failed", "err", err)
		}
	}
	e.ws = e.sup.start(a, tc, e.restarts, resume)
	if net := detectNetwork(e.sup.root, tc.Network); net.Fabric != "" {
		e.a.log.Info("network", "path", net.String())
		e.setStatus(a.Round, wsRunning+" "+net.short()) // status shows the transport the job got
	} else {
		e.setStatus(a.Round, wsRunning)
	}
	if a.GroupRank == 0 && !tc.InProcess() {
		go e.reportListening(e.ws)
	}
	// The next round's interpreters import while this one trains. In
	// in-process mode they are needed only if these workers restart:
	// their imports wait until a joiner has been handed its state.
	if tc.InProcess() {
		e.after(inProcessWarmDelay, "warm-refill", nil)
	} else {
		e.sup.prepareWarm(tc)
	}
}

// onExit classifies a worker exit of the current round.
func (e *elastic) onExit(ctx context.Context, ex workerExit) {
	set, w := ex.set, ex.w
	if set != e.ws || set.stopping.Load() {
		return // we stopped it: a planned exit
	}
	if w.status.ok() {
		set.okExits++
		e.a.log.Info("worker exited", "round", set.round, "rank", w.rank, "status", w.status.String())
		if set.okExits == len(set.workers) {
			e.completed(set)
		}
		return
	}
	if set.handled {
		return // the set's first failure is being handled already
	}
	set.handled = true
	desc := describeExit(w)
	if w.status.Err == nil && w.status.Signal == 0 && w.status.Code == ExitPeerLost {
		// A lost peer is what a membership change looks like from inside
		// the group; the new round usually arrives within dead_after.
		window := e.a.opts.PeerLostWindow
		e.a.log.Warn("worker lost a peer; waiting for a new round before counting a failure", "round", set.round, "worker", desc, "window", window.String())
		e.stopWorkers(true, "a peer was lost", nil)
		e.setStatus(0, wsPeerLost)
		e.cancelTimers()
		e.peerLost = e.after(window, "peer-lost", set)
		return
	}
	e.failure(ctx, desc)
}

func (e *elastic) onTimer(ctx context.Context, t timerEvent) {
	if t.kind == "warm-refill" {
		if !e.finished && !e.excluded && !e.failed {
			e.sup.prepareWarm(e.trainingConfig())
		}
		return
	}
	if t.kind == "master-listen" {
		if e.pending != nil && e.pending.Round == t.round {
			e.startPending(fmt.Sprintf("no word from the master's store within %s", e.a.opts.MasterListenWait))
		}
		return
	}
	if t.set != e.ws {
		return
	}
	switch t.kind {
	case "peer-lost":
		e.peerLost = nil
		e.failure(ctx, fmt.Sprintf("workers of round %d lost a peer and no new round came within %s", t.set.round, e.a.opts.PeerLostWindow))
	case "done-wait":
		e.doneWait = nil
		dir, _ := e.checkpointDir()
		detail := "all local workers exited 0"
		if !markerExists(dir) {
			detail += fmt.Sprintf("; no %s marker in %s after %s", DoneMarker, dir, e.a.opts.DoneMarkerWait)
		}
		e.reportDone(true, detail)
	}
}

// failure counts an application failure against max_restarts and either
// restarts the job at once or gives up.
func (e *elastic) failure(ctx context.Context, desc string) {
	tc := e.trainingConfig()
	e.restarts++
	e.stopWorkers(true, "worker failure", nil)
	if e.restarts > tc.MaxRestarts {
		e.failed = true
		e.sup.closeWarm("max_restarts exceeded")
		e.setStatus(0, wsFailed)
		e.a.log.Error("worker failed; max_restarts exhausted", "failures", e.restarts, "max_restarts", tc.MaxRestarts, "worker", desc)
		e.reportDone(false, fmt.Sprintf("max_restarts (%d) exceeded on %s: %s", tc.MaxRestarts, e.node, desc))
		return
	}
	e.a.log.Warn("worker failed; restarting the job", "restart_count", e.restarts, "max_restarts", tc.MaxRestarts, "worker", desc)
	e.setStatus(0, wsRestarting)
	// A new session tells the rendezvous this node lost its workers: the
	// round is re-formed at once with the same members (a Leave + Join
	// would first close a round without this node, then re-admit it
	// after last_call: two restarts instead of one).
	e.session = rendezvous.NewSession()
	v, err := e.join(ctx)
	if err != nil {
		return
	}
	e.adopt(ctx, v)
}

// completed handles every local worker having exited 0: the job is done
// if the checkpoint dir has the DONE marker (or cannot be checked from
// here). Without the marker, another node (rank 0's) may be the one that
// sees it; if nobody reports within DoneMarkerWait, this node does.
func (e *elastic) completed(set *workerSet) {
	e.setStatus(0, wsSucceeded)
	dir, local := e.checkpointDir()
	if local && e.doneBefore {
		// Re-applying a spec whose checkpoint holds a finished job ends at
		// once: say why, or "job succeeded" puzzles.
		e.a.log.Info("all local workers exited 0; the checkpoint already held a finished job", "round", set.round, "checkpoint_dir", dir)
		e.reportDone(true, fmt.Sprintf("the checkpoint in %s already held a finished job: its %s marker was there before round %d's workers started, so they trained nothing; remove %s (or use another checkpoint_uri) to train again",
			dir, DoneMarker, set.round, filepath.Join(dir, DoneMarker)))
		return
	}
	if !local || markerExists(dir) {
		e.a.log.Info("all local workers exited 0; reporting the job done", "round", set.round, "checkpoint_dir", dir)
		e.reportDone(true, fmt.Sprintf("all workers of %s exited 0 in round %d", e.node, set.round))
		return
	}
	e.a.log.Info("all local workers exited 0 but the DONE marker is missing; waiting for the job to finish", "dir", dir, "wait", e.a.opts.DoneMarkerWait.String())
	e.cancelTimers()
	e.doneWait = e.after(e.a.opts.DoneMarkerWait, "done-wait", set)
}

// checkpointDir resolves checkpoint_uri to a local directory: a plain
// path (relative to the workers' workdir) or a file:// URL. Other schemes
// are not local.
func (e *elastic) checkpointDir() (string, bool) {
	tc := e.trainingConfig()
	if e.ckpt != nil {
		return e.ckpt.dir, true
	}
	u := tc.CheckpointURI
	switch {
	case u == "":
		return "", false
	case strings.HasPrefix(u, "file://"):
		return strings.TrimPrefix(u, "file://"), true
	case strings.Contains(u, "://"):
		return "", false
	case !filepath.IsAbs(u) && tc.Workdir != "":
		return filepath.Join(tc.Workdir, u), true
	}
	return u, true
}

func markerExists(dir string) bool {
	if dir == "" {
		return false
	}
	_, err := os.Stat(filepath.Join(dir, DoneMarker))
	return err == nil
}

// reportDone tells the daemon, once, that the job ended; retried in the
// background until accepted.
func (e *elastic) reportDone(success bool, detail string) {
	if e.doneSent {
		return
	}
	e.doneSent = true
	req := doneRequest{Success: success, Step: e.step.Load(), Detail: detail}
	ctx := e.a.runCtx
	go func() {
		prog := every{d: progressEvery}
		err := retry(ctx, e.b, func(ctx context.Context) error { return e.dc.done(ctx, req) },
			func(attempt int, err error) {
				if prog.ok() {
					e.a.log.Warn("reporting job end failed; retrying", "attempt", attempt, "err", err)
				}
			})
		if err != nil {
			if ctx.Err() == nil {
				e.a.log.Error("reporting job end refused", "err", err)
			}
			return
		}
		e.a.log.Info("job end reported", "success", success, "step", req.Step, "detail", detail)
	}()
}

// shutdown is the agent's graceful exit (SIGTERM): workers get drain_grace,
// then the node leaves the rendezvous so the others re-form at once.
func (e *elastic) shutdown() {
	e.cancelTimers()
	e.stopWorkers(false, "agent shutdown", nil)
	e.sup.closeWarm("agent shutdown")
	e.setStatus(0, wsStopped)
	if !e.joined || e.excluded || e.finished || e.rz == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.a.opts.LeaveTimeout)
	defer cancel()
	if err := e.rz.Leave(ctx, e.fleet, e.node); err != nil {
		e.a.log.Warn("leaving the rendezvous failed", "err", err)
		return
	}
	e.a.log.Info("left the rendezvous")
}
