package local

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
)

// procStat is the part of /proc/<pid>/stat the provider needs.
type procStat struct {
	state   byte   // R, S, D, Z, X, ...
	session int    // session id
	start   uint64 // start time in clock ticks since boot; with pid, identifies a process
}

// readStat parses /proc/<pid>/stat. The command name (field 2) may contain
// spaces and parentheses, so parsing starts after the last ')'.
func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 > len(b) {
		return procStat{}, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := bytes.Fields(b[i+2:])
	// f[0] is field 3 (state), f[3] field 6 (session), f[19] field 22 (starttime).
	if len(f) < 20 || len(f[0]) != 1 {
		return procStat{}, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	sid, err1 := strconv.Atoi(string(f[3]))
	start, err2 := strconv.ParseUint(string(f[19]), 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return procStat{}, fmt.Errorf("malformed /proc/%d/stat: %w", pid, err)
	}
	return procStat{state: f[0][0], session: sid, start: start}, nil
}

// startTime returns the start time of a live process.
func startTime(pid int) (uint64, error) {
	st, err := readStat(pid)
	if err != nil {
		return 0, err
	}
	return st.start, nil
}

// alive reports whether pid is the very process that had start time start
// (not a later process that reused the pid) and has not exited. A zombie
// (exited, not yet reaped by its parent) counts as dead.
func alive(pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	st, err := readStat(pid)
	if err != nil {
		return false
	}
	return st.start == start && st.state != 'Z' && st.state != 'X'
}

// sessionMembers lists the live processes of session sid, except skip.
func sessionMembers(sid, skip int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == skip {
			continue
		}
		st, err := readStat(pid)
		if err != nil || st.session != sid || st.state == 'Z' || st.state == 'X' {
			continue
		}
		out = append(out, pid)
	}
	return out
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
	st, err := readStat(sid)
	if err != nil {
		return true // leader gone
	}
	return st.start == start
}
