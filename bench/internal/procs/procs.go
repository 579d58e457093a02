// Package procs is what the recovery and elastic benchmarks share about
// the local nodes they run: process sessions and free ports.
package procs

import (
	"sync"
	"syscall"
	"time"

	"github.com/fleetd/fleetd/internal/procstat"
)

// Every simulated node, torchrun's and fleetd's, is a process session of
// its own (torchrun agents are started with setsid here; the local
// provider starts each node's supervisor with setsid). Killing a node
// without notice is SIGKILL to every process of its session at once:
// agent, workers and all, like a VM that vanishes.

// SessionOf returns the session id of pid and whether it has exited (a
// zombie not reaped yet).
func SessionOf(pid int) (sid int, exited bool, err error) {
	st, err := procstat.Read(pid)
	return st.Session, st.Exited(), err
}

// SessionMembers lists the live processes of session sid.
func SessionMembers(sid int) []int { return procstat.SessionMembers(sid) }

// KillSession SIGKILLs every process of session sid, repeating for
// processes forked meanwhile, for at most 2 s. It returns how many
// processes it signalled.
func KillSession(sid int) int {
	if sid <= 1 {
		return 0
	}
	n := 0
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		pids := SessionMembers(sid)
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				n++
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return n
}

// StopSession freezes a session (SIGSTOP to every member) the way a VM
// that vanishes goes quiet: its sockets stay open and send nothing, so
// peers learn of it only through their timeouts. It repeats until a pass
// finds no member it has not stopped (a process forked meanwhile) and
// returns how many it stopped. KillSession ends stopped processes too.
func StopSession(sid int) int {
	if sid <= 1 {
		return 0
	}
	stopped := map[int]bool{}
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		fresh := 0
		for _, pid := range SessionMembers(sid) {
			if !stopped[pid] && syscall.Kill(pid, syscall.SIGSTOP) == nil {
				stopped[pid] = true
				fresh++
			}
		}
		if fresh == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	return len(stopped)
}

// Frozen remembers the sessions it stopped (StopSession), so that a
// benchmark ends them however its run ends.
type Frozen struct {
	mu   sync.Mutex
	sids []int
}

// Stop freezes session sid and returns how many processes it stopped.
func (f *Frozen) Stop(sid int) int {
	f.mu.Lock()
	f.sids = append(f.sids, sid)
	f.mu.Unlock()
	return StopSession(sid)
}

// KillAll SIGKILLs every session Stop froze (stopped processes die of it).
func (f *Frozen) KillAll() {
	f.mu.Lock()
	sids := f.sids
	f.sids = nil
	f.mu.Unlock()
	for _, sid := range sids {
		KillSession(sid)
	}
}
