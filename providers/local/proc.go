package local

import (
	"slices"
	"syscall"

	"github.com/fleetd/fleetd/internal/procstat"
)

// startTime returns the start time of a live process.
func startTime(pid int) (uint64, error) {
	st, err := procstat.Read(pid)
	if err != nil {
		return 0, err
	}
	return st.Start, nil
}

// alive reports whether pid is the very process that had start time start
// (not a later process that reused the pid) and has not exited. A zombie
// (exited, not yet reaped by its parent) counts as dead.
func alive(pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	st, err := procstat.Read(pid)
	if err != nil {
		return false
	}
	return st.Start == start && !st.Exited()
}

// sessionMembers lists the live processes of session sid, except skip.
func sessionMembers(sid, skip int) []int {
	return slices.DeleteFunc(procstat.SessionMembers(sid), func(pid int) bool { return pid == skip })
}

// signalSession sends sig to every live process of session sid except
// skip and returns how many there were. Sessions, not process groups, are
// the node boundary: workers that run in their own process groups stay in
// the node's session, as processes stay on a VM.
func signalSession(sid, skip int, sig syscall.Signal) int {
	pids := sessionMembers(sid, skip)
	for _, p := range pids {
		_ = syscall.Kill(p, sig)
	}
	return len(pids)
}

// sessionIsOurs reports whether signalling session sid is safe: its leader
// (pid == sid) is still the process we started, or is gone. A pid stays
// allocated while any process uses it as a session id, so a gone leader
// means the remaining members are our node's orphans, never a stranger's
// session that reused the number.
func sessionIsOurs(sid int, start uint64) bool {
	st, err := procstat.Read(sid)
	if err != nil {
		return true // leader gone
	}
	return st.Start == start
}
