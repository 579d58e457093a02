package agent

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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
	logFile         string
	errorFile       string
	done            chan struct{} // closed once reaped; status is set then
	status          exitStatus
	exitedAt        time.Time
}

func (w *worker) exited() bool {
	select {
	case <-w.done:
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
	fleet     string
	node      string
	ifname    string
	// ship receives every output line (truncated to maxShipLine).
	ship func(round, rank int, line string)
	// onStep receives the step of every {"event":"step"} line.
	onStep func(step int64)
	exits  chan workerExit
	quit   chan struct{} // closed when nobody reads exits any more
}

// start launches the node's workers for an assignment. A worker that
// cannot be started is reported through exits like one that failed.
func (s *supervisor) start(a rendezvous.Assignment, tc TrainingConfig, restartCount int) *workerSet {
	set := &workerSet{round: a.Round, assign: a, restartCount: restartCount, started: time.Now()}
	dir := filepath.Join(s.logDir, "round-"+strconv.Itoa(a.Round))
	mkErr := os.MkdirAll(dir, 0o755)
	params := workerEnvParams{
		Base: os.Environ(), Assignment: a, Training: tc, RestartCount: restartCount,
		Fleet: s.fleet, Node: s.node, DrainFile: s.drainFile, Ifname: s.ifname,
		ErrorFile: func(lr int) string {
			return filepath.Join(dir, "rank-"+strconv.Itoa(a.Rank(lr))+".error.json")
		},
	}
	for lr := range a.LocalWorldSize {
		w := &worker{localRank: lr, rank: a.Rank(lr), done: make(chan struct{})}
		w.logFile = filepath.Join(dir, "rank-"+strconv.Itoa(w.rank)+".log")
		w.errorFile = params.ErrorFile(lr)
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
	f, err := os.OpenFile(w.logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		f.Close()
		return err
	}
	args := workerArgs(tc.Command, w.localRank)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = env
	cmd.Dir = tc.Workdir
	cmd.Stdout, cmd.Stderr = pw, pw // one stream keeps stdout and stderr in order
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		f.Close()
		return err
	}
	pw.Close() // the worker holds the only write end now: EOF when its group is gone
	w.pid = cmd.Process.Pid
	s.log.Info("worker started", "round", set.round, "rank", w.rank, "local_rank", w.localRank, "pid", w.pid,
		"restart_count", set.restartCount, "log", w.logFile)

	pumped := make(chan struct{})
	go func() {
		defer close(pumped)
		defer f.Close()
		defer pr.Close()
		s.pump(pr, f, set.round, w.rank)
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
		w.status, w.exitedAt = st, time.Now()
		close(w.done)
		select {
		case <-pumped:
		case <-time.After(pipeDrainWait):
			pr.Close()
			<-pumped
		}
		s.report(workerExit{set: set, w: w})
	}()
	return nil
}

func (s *supervisor) report(ex workerExit) {
	select {
	case s.exits <- ex:
	case <-s.quit:
	}
}

// pump copies a worker's output to its log file and hands each line to
// the shipper and the step parser.
func (s *supervisor) pump(r *os.File, f *os.File, round, rank int) {
	br := bufio.NewReaderSize(r, 64<<10)
	var line []byte
	flush := func() {
		l := strings.TrimRight(string(line), "\r\n")
		line = line[:0]
		if s.onStep != nil {
			if st, ok := parseStep(l); ok {
				s.onStep(st)
			}
		}
		if s.ship != nil {
			s.ship(round, rank, l)
		}
	}
	for {
		chunk, err := br.ReadSlice('\n')
		if len(chunk) > 0 {
			_, _ = f.Write(chunk)
			if room := maxShipLine - len(line); room > 0 {
				line = append(line, chunk[:min(room, len(chunk))]...)
			}
			if chunk[len(chunk)-1] == '\n' {
				flush()
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			if len(line) > 0 {
				flush()
			}
			return
		}
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
