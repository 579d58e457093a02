package agent

import (
	"bufio"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fleetd/fleetd/rendezvous"
)

// Warm starts (docs/agent.md): for a Python entrypoint the agent keeps,
// per local rank, one interpreter that has already imported torch, so a
// new round's worker skips the interpreter start and the import (about
// 1.3 s of CPU per worker here, several seconds on a loaded node).

//go:embed warmstart.py
var warmstartPy []byte

// WarmStartFileName is the bootstrap the agent writes into its work dir.
const WarmStartFileName = "warmstart.py"

// DefaultWarmJoinWait bounds how long a newly started agent waits for its
// warm interpreters before it joins the rendezvous.
const DefaultWarmJoinWait = 60 * time.Second

// warmDiscardWait bounds the wait for discarded interpreters to be reaped.
const warmDiscardWait = 5 * time.Second

// roundEnvKeys are the worker variables only an assignment determines;
// a warm interpreter starts without them and receives them at handoff.
// Everything else in the worker's environment is known before the round.
var roundEnvKeys = map[string]bool{
	"RANK": true, "WORLD_SIZE": true, "GROUP_RANK": true, "GROUP_WORLD_SIZE": true,
	"ROLE_RANK": true, "ROLE_WORLD_SIZE": true, "MASTER_ADDR": true, "MASTER_PORT": true,
	"TORCHELASTIC_RESTART_COUNT": true, "TORCHELASTIC_RUN_ID": true, "TORCHELASTIC_ERROR_FILE": true,
	EnvRound: true, EnvCheckpointDone: true, EnvResumeStep: true, EnvProgress: true,
}

// staticEnv is env without the per-round variables (env is sorted, so is
// the result).
func staticEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); !roundEnvKeys[k] {
			out = append(out, kv)
		}
	}
	return out
}

var pythonName = regexp.MustCompile(`^python[0-9.]*$`)

// pythonEntry splits a worker command into interpreter flags and the
// entrypoint ("SCRIPT.py ARGS…" or "-m MODULE ARGS…") when the command is
// a Python interpreter running a script file or a module. Anything else
// (-c, stdin, -i, -x, unknown options, a directory or zip) is not warm-
// startable: those start cold.
func pythonEntry(args []string) (flags, entry []string, ok bool) {
	if len(args) < 2 || !pythonName.MatchString(filepath.Base(args[0])) {
		return nil, nil, false
	}
	for i := 1; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-m":
			if i+1 >= len(args) || args[i+1] == "" {
				return nil, nil, false
			}
			return args[1:i], args[i:], true
		case a == "-W" || a == "-X" || a == "--check-hash-based-pycs":
			i++ // the option's argument
			if i >= len(args) {
				return nil, nil, false
			}
		case strings.HasPrefix(a, "--") || a == "-":
			return nil, nil, false
		case strings.HasPrefix(a, "-"):
			// A cluster such as -uB; -W and -X take the rest of the word,
			// or the next word when they end it.
			for j := 1; j < len(a); j++ {
				c := a[j]
				if c == 'W' || c == 'X' {
					if j == len(a)-1 {
						i++
						if i >= len(args) {
							return nil, nil, false
						}
					}
					break
				}
				if !strings.ContainsRune("bBdEIOqsSuvRP", rune(c)) {
					return nil, nil, false
				}
			}
		case strings.HasSuffix(a, ".py"):
			return args[1:i], args[i:], true
		default:
			return nil, nil, false
		}
	}
	return nil, nil, false
}

// warmProc is one warm interpreter, for one local rank.
type warmProc struct {
	p        *proc
	key      string   // what it was prepared for: argv, workdir, static env
	args     []string // the cold command (workerArgs)
	path     string   // the interpreter as exec resolves it
	lr       int
	handoff  *os.File // write end of its fd 3
	started  time.Time
	ready    chan struct{} // closed once it reported (or ended)
	readyErr string        // set before ready closes; "" = imports done
	// discarded is set before the agent kills it, so its end is not taken
	// for a failure.
	discarded atomic.Bool
}

func (wp *warmProc) isReady() bool { return isClosed(wp.ready) }

// warmPerRank is how many warm interpreters a local rank keeps. Two, so
// that two round changes in quick succession (a lost node, then its
// replacement joining; a burst of spot notices) both start warm: the
// interpreter that replaces a used one needs a few seconds of CPU, more
// while the node trains. The second one starts once the first is ready,
// so a node never runs two imports of the same rank at once.
const warmPerRank = 2 // one in in-process mode (docs/agent.md)

// warmPool holds the node's warm interpreters.
type warmPool struct {
	script string // absolute path of warmstart.py, or "" when it could not be written

	mu    sync.Mutex
	tc    TrainingConfig      // what prepare last prepared for
	slots map[int][]*warmProc // per local rank, oldest first
	off   map[string]string   // keys whose interpreter failed: they start cold
	all   []*warmProc         // started and not yet reaped, for the final cleanup
}

// warmSpec says how local rank lr would be warm-started under tc, or ok
// false when it starts cold.
type warmSpec struct {
	args, warmArgs, env []string
	key                 string
}

func warmKey(args []string, workdir string, env []string) string {
	return strings.Join(args, "\x00") + "\x00\x00" + workdir + "\x00\x00" + strings.Join(env, "\x00")
}

func (s *supervisor) warmSpecFor(tc TrainingConfig, lr int) (warmSpec, bool) {
	if s.warm == nil || s.warm.script == "" || len(tc.Command) == 0 || (tc.WarmStart != nil && !*tc.WarmStart) {
		return warmSpec{}, false
	}
	args := workerArgs(tc.Command, lr)
	flags, entry, ok := pythonEntry(args)
	if !ok {
		return warmSpec{}, false
	}
	nproc := max(tc.NprocPerNode, 1)
	env := staticEnv(workerEnv(s.envParams(rendezvous.Assignment{LocalWorldSize: nproc}, tc, 0, ""), lr))
	warmArgs := append(append(append([]string{args[0]}, flags...), s.warm.script), entry...)
	return warmSpec{args: args, warmArgs: warmArgs, env: env, key: warmKey(args, tc.Workdir, env)}, true
}

// prepareWarm makes every local rank of tc keep warmPerRank interpreters
// for tc: stale ones (another config) are discarded, missing ones started
// one at a time per rank. With warm starts off for tc, none. Cheap when
// nothing changed.
func (s *supervisor) prepareWarm(tc TrainingConfig) {
	if s.warm == nil {
		return
	}
	s.warm.mu.Lock()
	defer s.warm.mu.Unlock()
	s.warm.tc = tc
	s.refillLocked()
}

// refillLocked is prepareWarm for the last config; s.warm.mu is held.
func (s *supervisor) refillLocked() {
	tc := s.warm.tc
	nproc := max(tc.NprocPerNode, 1)
	for lr, procs := range s.warm.slots {
		spec, ok := s.warmSpecFor(tc, lr)
		keep := procs[:0]
		for _, wp := range procs {
			if lr < nproc && ok && spec.key == wp.key {
				keep = append(keep, wp)
			} else {
				s.discardWarm(wp, "the training config changed")
			}
		}
		s.warm.slots[lr] = keep
	}
	for lr := range nproc {
		spec, ok := s.warmSpecFor(tc, lr)
		procs := s.warm.slots[lr]
		keep := warmPerRank
		if tc.InProcess() {
			keep = 1 // survivors are not restarted: one start, or one fallback restart, at a time
		}
		if !ok || s.warm.off[spec.key] != "" || len(procs) >= keep ||
			(len(procs) > 0 && !procs[len(procs)-1].isReady()) {
			continue
		}
		wp, err := s.startWarm(tc, lr, spec)
		if err != nil {
			s.log.Warn("warm interpreter not started; workers start cold", "local_rank", lr, "err", err)
			s.warm.off[spec.key] = err.Error()
			continue
		}
		s.warm.slots[lr] = append(procs, wp)
	}
}

func (s *supervisor) startWarm(tc TrainingConfig, lr int, spec warmSpec) (*warmProc, error) {
	hr, hw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	sr, sw, err := os.Pipe()
	if err != nil {
		hr.Close()
		hw.Close()
		return nil, err
	}
	cmd := exec.Command(spec.warmArgs[0], spec.warmArgs[1:]...)
	cmd.Env, cmd.Dir = spec.env, tc.Workdir
	cmd.ExtraFiles = []*os.File{hr, sw} // fds 3 (handoff) and 4 (readiness)
	wp := &warmProc{key: spec.key, args: spec.args, path: cmd.Path, lr: lr, handoff: hw,
		started: time.Now(), ready: make(chan struct{})}
	wp.p, err = s.spawn(cmd, s.newOutput(), nil, nil, func(pid int, st exitStatus) { s.warmEnded(wp, pid, st) })
	hr.Close()
	sw.Close()
	if err != nil {
		hw.Close()
		sr.Close()
		return nil, err
	}
	// Keep the unreaped ones only: the list must not grow round after round.
	s.warm.all = slices.DeleteFunc(s.warm.all, func(o *warmProc) bool { return o.p.exited() })
	s.warm.all = append(s.warm.all, wp)
	go s.readReadiness(wp, sr)
	return wp, nil
}

// readReadiness waits for the interpreter's "ok" (or "error …") line.
func (s *supervisor) readReadiness(wp *warmProc, r *os.File) {
	defer r.Close()
	line, err := bufio.NewReaderSize(r, 1024).ReadString('\n')
	switch {
	case strings.TrimSpace(line) == "ok":
	case strings.HasPrefix(line, "error "):
		wp.readyErr = "importing torch failed: " + strings.TrimSpace(strings.TrimPrefix(line, "error "))
	case err != nil:
		wp.readyErr = "the interpreter ended before it was ready"
	default:
		wp.readyErr = fmt.Sprintf("unexpected readiness line %q", strings.TrimSpace(line))
	}
	close(wp.ready)
	s.warm.mu.Lock()
	defer s.warm.mu.Unlock()
	if wp.discarded.Load() {
		return
	}
	if wp.readyErr == "" {
		s.log.Info("warm interpreter ready", "local_rank", wp.lr, "pid", wp.p.pid, "took", time.Since(wp.started).Round(time.Millisecond).String())
		s.refillLocked() // the rank's next interpreter may start now
		return
	}
	// Not used for this config again: each new interpreter would fail the
	// same way. One that already became a worker runs the cold command.
	s.warm.off[wp.key] = wp.readyErr
	s.log.Warn("warm start unavailable; workers start cold", "local_rank", wp.lr, "pid", wp.p.pid, "reason", wp.readyErr)
	s.dropLocked(wp, true)
}

// dropLocked removes wp from its rank's interpreters (and kills it if
// kill); s.warm.mu is held.
func (s *supervisor) dropLocked(wp *warmProc, kill bool) {
	procs := s.warm.slots[wp.lr]
	if i := slices.Index(procs, wp); i >= 0 {
		s.warm.slots[wp.lr] = slices.Delete(procs, i, i+1)
		if kill {
			s.discardWarm(wp, wp.readyErr)
		}
	}
}

// warmEnded handles a warm interpreter that ended before it was used.
func (s *supervisor) warmEnded(wp *warmProc, pid int, st exitStatus) {
	wp.handoff.Close()
	if wp.discarded.Load() {
		return
	}
	s.warm.mu.Lock()
	defer s.warm.mu.Unlock()
	s.dropLocked(wp, false)
	if s.warm.off[wp.key] == "" {
		s.warm.off[wp.key] = "the warm interpreter ended before it was used: " + st.String()
	}
	s.log.Warn("warm interpreter ended before it was used; workers start cold", "local_rank", wp.lr, "pid", pid, "status", st.String())
}

// discardWarm kills an unused warm interpreter.
func (s *supervisor) discardWarm(wp *warmProc, why string) {
	wp.discarded.Store(true)
	if !wp.p.exited() {
		_ = syscall.Kill(-wp.p.pid, syscall.SIGKILL)
	}
	wp.handoff.Close()
	s.log.Info("warm interpreter discarded", "local_rank", wp.lr, "pid", wp.p.pid, "reason", why)
}

// takeWarm hands out an interpreter of local rank lr prepared for exactly
// env's static part: a ready one if there is one, else one still
// importing (halfway through its imports still beats a new interpreter).
func (s *supervisor) takeWarm(lr int, args, env []string, workdir string) *warmProc {
	if s.warm == nil {
		return nil
	}
	key := warmKey(args, workdir, staticEnv(env))
	s.warm.mu.Lock()
	defer s.warm.mu.Unlock()
	var pick *warmProc
	for _, wp := range s.warm.slots[lr] {
		switch {
		case wp.key != key:
			s.discardWarm(wp, "prepared for another environment")
		case wp.isReady() && wp.readyErr != "":
			s.discardWarm(wp, wp.readyErr)
		case pick == nil || (wp.isReady() && !pick.isReady()):
			pick = wp
		}
	}
	s.warm.slots[lr] = slices.DeleteFunc(s.warm.slots[lr], func(wp *warmProc) bool { return wp == pick || wp.discarded.Load() })
	return pick
}

// hasWarm reports whether each of nproc local ranks has a warm
// interpreter prepared for tc (ready or still importing).
func (s *supervisor) hasWarm(tc TrainingConfig, nproc int) bool {
	if s.warm == nil || nproc < 1 {
		return false
	}
	s.warm.mu.Lock()
	defer s.warm.mu.Unlock()
	for lr := range nproc {
		spec, ok := s.warmSpecFor(tc, lr)
		if !ok || !slices.ContainsFunc(s.warm.slots[lr], func(wp *warmProc) bool { return wp.key == spec.key }) {
			return false
		}
	}
	return true
}

// handOff makes wp the worker w: its output goes to w's log from now on
// (with what it printed while warm first) and it receives the round's
// environment. It reports false when wp ended meanwhile.
func (s *supervisor) handOff(set *workerSet, w *worker, wp *warmProc, f *os.File, env []string) bool {
	if !wp.p.become(set, w) {
		wp.discarded.Store(true)
		wp.handoff.Close()
		return false
	}
	w.pid, w.warm = wp.p.pid, true
	w.out = wp.p.out
	wp.p.out.attach(f, set.round, w)
	msg := make([]string, 0, 2+len(wp.args)+len(env))
	msg = append(append(append(msg, wp.path, strconv.Itoa(len(wp.args))), wp.args...), env...)
	// Written aside: an environment beyond the pipe's buffer would block
	// until an interpreter still importing reads it.
	go func() {
		_, err := wp.handoff.Write([]byte(strings.Join(msg, "\x00")))
		if cerr := wp.handoff.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			// It ended before it read the handoff: that exit is this worker's.
			s.log.Warn("warm handoff failed", "round", set.round, "rank", w.rank, "pid", w.pid, "err", err)
		}
	}()
	return true
}

// waitWarm waits until every local rank has a ready interpreter (or its
// warm start failed), at most limit. It returns how many ranks it waited
// for and whether they all reported in time.
func (s *supervisor) waitWarm(stop <-chan struct{}, limit time.Duration) (n int, ok bool) {
	if s.warm == nil {
		return 0, true
	}
	s.warm.mu.Lock()
	var chans []chan struct{}
	for _, procs := range s.warm.slots {
		if len(procs) > 0 {
			chans = append(chans, procs[0].ready) // the oldest: the first to be ready
		}
	}
	s.warm.mu.Unlock()
	t := time.NewTimer(limit)
	defer t.Stop()
	for _, c := range chans {
		select {
		case <-c:
		case <-t.C:
			return len(chans), false
		case <-stop:
			return len(chans), false
		}
	}
	return len(chans), true
}

// closeWarm discards every warm interpreter and waits (bounded) until
// they are reaped: nothing the agent started outlives it.
func (s *supervisor) closeWarm(why string) {
	if s.warm == nil {
		return
	}
	s.warm.mu.Lock()
	for lr, procs := range s.warm.slots {
		for _, wp := range procs {
			s.discardWarm(wp, why)
		}
		delete(s.warm.slots, lr)
	}
	all := s.warm.all
	s.warm.all = nil
	s.warm.tc = TrainingConfig{}
	s.warm.mu.Unlock()
	bound := time.NewTimer(warmDiscardWait)
	defer bound.Stop()
	for _, wp := range all {
		if !wp.discarded.Load() {
			continue // became a worker: the worker set stops it
		}
		select {
		case <-wp.p.done:
		case <-bound.C:
			return
		}
	}
}

// newWarmPool writes the bootstrap into dir; without it every worker
// starts cold.
func newWarmPool(dir string) (*warmPool, error) {
	p := &warmPool{slots: map[int][]*warmProc{}, off: map[string]string{}}
	abs, err := filepath.Abs(filepath.Join(dir, WarmStartFileName))
	if err == nil {
		err = writeFileAtomic(abs, warmstartPy)
	}
	if err != nil {
		return p, errors.Join(errors.New("warm starts are off: writing the bootstrap failed"), err)
	}
	p.script = abs
	return p, nil
}
