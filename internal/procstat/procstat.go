// Package procstat reads /proc/<pid>/stat. The local provider tells its
// nodes' processes by it, and the benchmarks and chaos tests find and kill
// those processes by it, so all three read the same fields the same way.
package procstat

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
)

// Stat is the part of /proc/<pid>/stat fleetd reads.
type Stat struct {
	State   byte // R, S, D, T (stopped), Z (zombie), X (dead), ...
	PPid    int
	Session int
	// Start is the start time in clock ticks after boot; with the pid it
	// names one process, not a later one that reused the pid.
	Start uint64
}

// Exited reports a process that has exited: a zombie not reaped yet, or dead.
func (s Stat) Exited() bool { return s.State == 'Z' || s.State == 'X' }

// Read reads the stat of pid.
func Read(pid int) (Stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Stat{}, err
	}
	st, err := Parse(b)
	if err != nil {
		return Stat{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return st, nil
}

// Parse parses one stat line. The command name (field 2) may hold spaces
// and parentheses, so fields are counted after the last ')'.
func Parse(b []byte) (Stat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 > len(b) {
		return Stat{}, fmt.Errorf("malformed stat %q", b)
	}
	// f[0] is field 3 (state), f[1] field 4 (ppid), f[3] field 6
	// (session), f[19] field 22 (starttime).
	f := bytes.Fields(b[i+2:])
	if len(f) < 20 || len(f[0]) != 1 {
		return Stat{}, fmt.Errorf("malformed stat %q", b)
	}
	ppid, err1 := strconv.Atoi(string(f[1]))
	sid, err2 := strconv.Atoi(string(f[3]))
	start, err3 := strconv.ParseUint(string(f[19]), 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return Stat{}, fmt.Errorf("malformed stat %q: %w", b, err)
	}
	return Stat{State: f[0][0], PPid: ppid, Session: sid, Start: start}, nil
}

// SessionMembers lists the live processes of session sid. Sessions, not
// process groups, are a local node's boundary: workers in process groups
// of their own stay in their node's session.
func SessionMembers(sid int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := Read(pid); err == nil && st.Session == sid && !st.Exited() {
			out = append(out, pid)
		}
	}
	return out
}
