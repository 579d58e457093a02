package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fleetd/fleetd/rendezvous"
)

// maxShipLine bounds one log line shipped to the daemon (the file keeps
// the whole line).
const maxShipLine = 4096

// pipeDrainWait is how long the output of an exited worker is still read:
// a process outside the worker's group that inherited the pipe must not
// keep the reader alive forever.
const pipeDrainWait = 2 * time.Second

// exitStatus is how a worker ended.
type exitStatus struct {
	Code   int            // exit code; -1 when killed by a signal or never started
	Signal syscall.Signal // the signal that killed it, else 0
	Err    error          // the worker could not be started
}

func (s exitStatus) ok() bool { return s.Err == nil && s.Signal == 0 && s.Code == 0 }

func (s exitStatus) String() string {
	switch {
	case s.Err != nil:
		return "not started: " + s.Err.Error()
	case s.Signal != 0:
		return "killed by " + signalName(s.Signal)
	}
	return "exit " + strconv.Itoa(s.Code)
}

func signalName(s syscall.Signal) string {
	switch s {
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGKILL:
		return "SIGKILL"
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGSEGV:
		return "SIGSEGV"
	case syscall.SIGABRT:
		return "SIGABRT"
	}
	return "signal " + strconv.Itoa(int(s))
}

// worker is one training process, the leader of its own process group.
type worker struct {
	localRank, rank int
	pid             int
	warm            bool // a warm interpreter became this worker
	logFile         string
	errorFile       string
	doneFile        string // FLEETD_CHECKPOINT_DONE
	// out is the worker's output (in-process mode re-points it at the
	// next round's log); elastic: it said hello through fleetd_elastic.
	out      *workerOutput
	elastic  atomic.Bool
	done     chan struct{} // closed once reaped; status is set then
	status   exitStatus
	exitedAt time.Time
}

func (w *worker) exited() bool { return isClosed(w.done) }

// isClosed reports whether c is closed, without waiting.
func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// workerSet is the node's workers of one round.
type workerSet struct {
	round        int
	assign       rendezvous.Assignment
	restartCount int
	workers      []*worker
	started      time.Time
	// stopping is set before the agent signals the workers, so their exits
	// are not mistaken for failures.
	stopping atomic.Bool

	// Owned by the controller goroutine.
	okExits int
	handled bool // a failure of this set is being (or was) handled
}

func (s *workerSet) running() bool {
	for _, w := range s.workers {
		if !w.exited() {
			return true
		}
	}
	return false
}

// workerExit tells the controller that a worker ended (after its output
// was read to the end).
type workerExit struct {
	set *workerSet
	w   *worker
}

// supervisor starts and stops worker processes.
type supervisor struct {
	log       *slog.Logger
	logDir    string
	drainFile string
	// requestFile is FLEETD_CHECKPOINT_REQUEST.
	requestFile string
	fleet       string
	node        string
	ifname      string
	// ship receives every output line (truncated to maxShipLine).
	ship func(round, rank int, line string)
	// onStep receives the step of every {"event":"step"} line.
	onStep func(step int64)
	exits  chan workerExit
	quit   chan struct{} // closed when nobody reads exits any more
	// warm holds the warm interpreters; nil: every worker starts cold.
	warm *warmPool
	// elasticFile (FLEETD_ELASTIC_FILE) and helperDir (fleetd_elastic.py)
	// of the in-process mode.
	elasticFile, helperDir string
	// ckptDir is training.checkpoint's dir (FLEETD_CHECKPOINT_DIR), if any.
	ckptDir string
	// root prefixes the machine paths the network detection reads ("" on a VM).
	root string
}

// envParams is what the workers' environment depends on for an assignment.
func (s *supervisor) envParams(a rendezvous.Assignment, tc TrainingConfig, restartCount int, dir string) workerEnvParams {
	p := workerEnvParams{
		Base: os.Environ(), Assignment: a, Training: tc, RestartCount: restartCount,
		Fleet: s.fleet, Node: s.node, DrainFile: s.drainFile, Ifname: s.ifname,
		CheckpointRequest: s.requestFile, CheckpointDir: s.ckptDir,
		ElasticFile: s.elasticFileFor(tc), HelperDir: s.helperDir,
		Network: detectNetwork(s.root, tc.Network),
	}
	if dir != "" {
		p.ErrorFile = func(lr int) string {
			return filepath.Join(dir, "rank-"+strconv.Itoa(a.Rank(lr))+".error.json")
		}
		p.CheckpointDone = func(lr int) string {
			return filepath.Join(dir, "rank-"+strconv.Itoa(a.Rank(lr))+".checkpoint")
		}
		p.ProgressFile = filepath.Join(dir, ProgressFile)
	}
	return p
}

// start launches the node's workers for an assignment, each from its warm
// interpreter when one is ready for it, else cold. A worker that cannot
// be started is reported through exits like one that failed. resume, if
// set, is the step the node's previous workers checkpointed
// (FLEETD_RESUME_STEP).
func (s *supervisor) start(a rendezvous.Assignment, tc TrainingConfig, restartCount int, resume *int64) *workerSet {
	set := &workerSet{round: a.Round, assign: a, restartCount: restartCount, started: time.Now()}
	dir := filepath.Join(s.logDir, "round-"+strconv.Itoa(a.Round))
	mkErr := os.MkdirAll(dir, 0o755)
	params := s.envParams(a, tc, restartCount, dir)
	params.ResumeStep = resume
	_ = os.Remove(params.ProgressFile) // a stale file would pose as this round's reports
	for lr := range a.LocalWorldSize {
		w := &worker{localRank: lr, rank: a.Rank(lr), done: make(chan struct{})}
		w.logFile = filepath.Join(dir, "rank-"+strconv.Itoa(w.rank)+".log")
		w.errorFile = params.ErrorFile(lr)
		w.doneFile = params.CheckpointDone(lr)
		set.workers = append(set.workers, w)
		err := mkErr
		if err == nil {
			err = s.launch(set, w, tc, workerEnv(params, lr))
		}
		if err != nil {
			w.status, w.exitedAt = exitStatus{Code: -1, Err: err}, time.Now()
			close(w.done)
			s.log.Error("worker not started", "round", a.Round, "rank", w.rank, "err", err)
			go s.report(workerExit{set: set, w: w})
		}
	}
	return set
}

func (s *supervisor) launch(set *workerSet, w *worker, tc TrainingConfig, env []string) error {
	if len(tc.Command) == 0 {
		return errors.New("the fleet's training block has no command")
	}
	_ = os.Remove(w.errorFile) // a stale file would pose as this attempt's root cause
	_ = os.Remove(w.doneFile)  // and a stale marker as this attempt's checkpoint
	f, err := os.OpenFile(w.logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	args := workerArgs(tc.Command, w.localRank)
	if wp := s.takeWarm(w.localRank, args, env, tc.Workdir); wp != nil && s.handOff(set, w, wp, f, env) {
		s.log.Info("worker started", "round", set.round, "rank", w.rank, "local_rank", w.localRank, "pid", w.pid,
			"restart_count", set.restartCount, "log", w.logFile, "warm", true, "warm_ready", wp.isReady())
		return nil
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = env
	cmd.Dir = tc.Workdir
	out := s.newOutput()
	w.out = out
	out.attach(f, set.round, w)
	p, err := s.spawn(cmd, out, set, w, nil)
	if err != nil {
		out.close()
		return err
	}
	w.pid = p.pid
	s.log.Info("worker started", "round", set.round, "rank", w.rank, "local_rank", w.localRank, "pid", w.pid,
		"restart_count", set.restartCount, "log", w.logFile, "warm", false)
	return nil
}

// proc is a started process: a worker, or a warm interpreter that may
// become one. It leads its own process group; stdout and stderr share one
// pipe (which keeps them in order), pumped into out.
type proc struct {
	pid  int
	out  *workerOutput
	done chan struct{} // closed once reaped

	mu sync.Mutex
	// The worker it is; nil while it is a warm interpreter.
	set *workerSet
	w   *worker
	// onIdleExit is called when it ends before becoming a worker.
	onIdleExit func(pid int, st exitStatus)
}

func (p *proc) exited() bool { return isClosed(p.done) }

// become makes p the worker w of set, unless it has ended already.
func (p *proc) become(set *workerSet, w *worker) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited() {
		return false
	}
	p.set, p.w = set, w
	return true
}

// spawn starts cmd in its own process group with its output on one pipe.
// Once it ends (its group swept, its output read), the exit is reported
// for the worker it is by then, or to onIdleExit.
func (s *supervisor) spawn(cmd *exec.Cmd, out *workerOutput, set *workerSet, w *worker, onIdleExit func(int, exitStatus)) (*proc, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	keepInheritedFromWorkers()
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		return nil, err
	}
	pw.Close() // the process holds the only write end now: EOF when its group is gone
	p := &proc{pid: cmd.Process.Pid, out: out, done: make(chan struct{}), set: set, w: w, onIdleExit: onIdleExit}
	pumped := make(chan struct{})
	go func() {
		defer close(pumped)
		defer pr.Close()
		out.pump(pr)
	}()
	go func() {
		// DataLoader workers and the like must not outlive their worker.
		err := waitAndSweep(cmd)
		st := exitStatus{Code: -1}
		if ps := cmd.ProcessState; ps != nil {
			st.Code = ps.ExitCode()
			if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				st.Signal = ws.Signal()
			}
		} else if err != nil {
			st.Err = err
		}
		p.mu.Lock()
		close(p.done)
		set, w, idle := p.set, p.w, p.onIdleExit
		p.mu.Unlock()
		if w != nil {
			w.status, w.exitedAt = st, time.Now()
			close(w.done)
		}
		select {
		case <-pumped:
		case <-time.After(pipeDrainWait):
			pr.Close()
			<-pumped
		}
		switch {
		case w != nil:
			s.report(workerExit{set: set, w: w})
		case idle != nil:
			idle(p.pid, st)
		}
	}()
	return p, nil
}

func (s *supervisor) report(ex workerExit) {
	select {
	case s.exits <- ex:
	case <-s.quit:
	}
}

// maxWarmOutput bounds what a warm interpreter may print before it
// becomes a worker (kept for its worker's log).
const maxWarmOutput = 1 << 20

// workerOutput takes a process's output: into the worker's log file, the
// shipper and the step parser once attached; until then (a warm
// interpreter, whose round is not known yet) into a bounded buffer.
type workerOutput struct {
	s *supervisor

	mu          sync.Mutex
	f           *os.File
	round, rank int
	w           *worker  // the worker it is (nil while a warm interpreter)
	next        *os.File // in-process mode: the next round's log, from the next line on
	nextRound   int
	line        []byte // the current line, up to maxShipLine
	pending     []byte
	dropped     int
	eof         bool
}

func (s *supervisor) newOutput() *workerOutput { return &workerOutput{s: s} }

// pump reads r to its end.
func (o *workerOutput) pump(r *os.File) {
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			o.write(buf[:n])
		}
		if err != nil {
			o.close()
			return
		}
	}
}

func (o *workerOutput) write(b []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.f == nil {
		room := max(maxWarmOutput-len(o.pending), 0)
		o.pending = append(o.pending, b[:min(room, len(b))]...)
		o.dropped += len(b) - min(room, len(b))
		return
	}
	o.consume(b)
}

// attach sends the output of worker w to f (for round), starting with
// what was buffered.
func (o *workerOutput) attach(f *os.File, round int, w *worker) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.f, o.round, o.rank, o.w = f, round, w.rank, w
	if o.dropped > 0 {
		o.consume(fmt.Appendf(nil, "[fleetd agent: %d bytes of output from before the start were dropped]\n", o.dropped))
	}
	o.consume(o.pending)
	o.pending = nil
	if o.eof {
		o.finish()
	}
}

// close is the end of the output.
func (o *workerOutput) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.eof = true
	if o.f != nil {
		o.finish()
	}
}

func (o *workerOutput) finish() {
	if len(o.line) > 0 {
		o.flushLine()
	}
	o.f.Close()
	if o.next != nil {
		o.next.Close()
		o.next = nil
	}
}

// reattach sends the output to f, for round and rank, from the start of
// the next line on (in-process mode: the worker now runs that round).
func (o *workerOutput) reattach(f *os.File, round, rank int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.eof || o.f == nil {
		f.Close()
		return
	}
	if o.next != nil {
		o.next.Close()
	}
	o.next, o.nextRound = f, round
	o.rank = rank
	if len(o.line) == 0 {
		o.switchFile()
	}
}

func (o *workerOutput) switchFile() {
	o.f.Close()
	o.f, o.round = o.next, o.nextRound
	o.next = nil
}

// consume writes b to the log and hands each complete line to the shipper
// and the step parser.
func (o *workerOutput) consume(b []byte) {
	if o.next == nil {
		_, _ = o.f.Write(b)
	}
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		chunk := b
		if i >= 0 {
			chunk = b[:i+1]
		}
		if o.next != nil {
			_, _ = o.f.Write(chunk) // line by line until the switch
		}
		if room := maxShipLine - len(o.line); room > 0 {
			o.line = append(o.line, chunk[:min(room, len(chunk))]...)
		}
		b = b[len(chunk):]
		if i >= 0 {
			o.flushLine()
			if o.next != nil {
				o.switchFile()
				if len(b) > 0 {
					_, _ = o.f.Write(b)
				}
			}
		}
	}
}

func (o *workerOutput) flushLine() {
	l := strings.TrimRight(string(o.line), "\r\n")
	o.line = o.line[:0]
	if o.s.onStep != nil {
		if st, ok := parseStep(l); ok {
			o.s.onStep(st)
		}
	}
	if o.w != nil && strings.HasPrefix(l, elasticLinePrefix) {
		o.s.onElasticLine(o.w, o.round, l)
	}
	if o.s.ship != nil {
		o.s.ship(o.round, o.rank, l)
	}
}

// parseStep recognises the trainers' {"event":"step","step":N} lines.
func parseStep(line string) (int64, bool) {
	if !strings.HasPrefix(line, "{") || !strings.Contains(line, `"step"`) {
		return 0, false
	}
	var ev struct {
		Event string `json:"event"`
		Step  *int64 `json:"step"`
	}
	if json.Unmarshal([]byte(line), &ev) != nil || ev.Event != "step" || ev.Step == nil {
		return 0, false
	}
	return *ev.Step, true
}

// stop ends the set's workers: SIGTERM to every live worker's process
// group, SIGKILL to those still alive after grace. It returns once every
// worker is reaped (or a bounded time after SIGKILL) and reports how many
// had to be killed.
func (s *workerSet) stop(grace time.Duration) (killed int) {
	s.stopping.Store(true)
	for _, w := range s.workers {
		if !w.exited() && w.pid > 0 {
			_ = syscall.Kill(-w.pid, syscall.SIGTERM)
		}
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	expired := false
	for _, w := range s.workers {
		if expired {
			break
		}
		select {
		case <-w.done:
		case <-t.C:
			expired = true
		}
	}
	if !expired {
		return 0
	}
	for _, w := range s.workers {
		if !w.exited() && w.pid > 0 {
			killed++
			_ = syscall.Kill(-w.pid, syscall.SIGKILL)
		}
	}
	bound := time.NewTimer(10 * time.Second) // SIGKILL is not ignorable; only a stuck kernel stops it
	defer bound.Stop()
	for _, w := range s.workers {
		select {
		case <-w.done:
		case <-bound.C:
			return killed
		}
	}
	return killed
}

// checkpointed reads the FLEETD_CHECKPOINT_DONE markers of the set's
// workers: how many wrote a valid one, and the lowest step among them
// (they should agree; the lowest is the safe claim).
func (s *workerSet) checkpointed() (step int64, n int) {
	for _, w := range s.workers {
		st, ok := readCheckpointDone(w.doneFile)
		if !ok {
			continue
		}
		if n == 0 || st < step {
			step = st
		}
		n++
	}
	return step, n
}

// readCheckpointDone parses a FLEETD_CHECKPOINT_DONE marker: the step as a
// JSON number ("1200", what `f.write(str(step))` leaves), or a JSON object
// with an integer "step".
func readCheckpointDone(file string) (int64, bool) {
	if file == "" {
		return 0, false
	}
	b, err := os.ReadFile(file)
	if err != nil || len(b) > 64<<10 {
		return 0, false
	}
	var n int64
	if json.Unmarshal(b, &n) == nil {
		return n, n >= 0
	}
	var obj struct {
		Step *int64 `json:"step"`
	}
	if json.Unmarshal(b, &obj) == nil && obj.Step != nil && *obj.Step >= 0 {
		return *obj.Step, true
	}
	return 0, false
}

// rootCause reads a worker's torchelastic error file ({"message":
// {"message": "..."}} or {"message": "..."}), if it wrote one.
func rootCause(file string) string {
	b, err := os.ReadFile(file)
	if err != nil || len(b) == 0 {
		return ""
	}
	var ef struct {
		Message json.RawMessage `json:"message"`
	}
	if json.Unmarshal(b, &ef) != nil {
		return ""
	}
	var s string
	if json.Unmarshal(ef.Message, &s) == nil {
		return s
	}
	var inner struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(ef.Message, &inner) == nil {
		return inner.Message
	}
	return ""
}

// describeExit is a one-line account of a failed worker for logs and the
// done report.
func describeExit(w *worker) string {
	msg := fmt.Sprintf("rank %d (local %d, pid %d) %s", w.rank, w.localRank, w.pid, w.status)
	if rc := rootCause(w.errorFile); rc != "" {
		msg += ": " + rc
	}
	return msg
}
