package procs

import (
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleetd/internal/procstat"
)

// TestStopSession freezes real process trees in sessions of their own and
// ends them with KillSession.
func TestStopSession(t *testing.T) {
	for _, tc := range []struct {
		name, script string
		members      int
	}{
		{"one process", "exec sleep 60", 1},
		{"a shell and its children", "sleep 60 & sleep 60 & wait", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("sh", "-c", tc.script)
			cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			sid := cmd.Process.Pid
			defer KillSession(sid)
			for deadline := time.Now().Add(10 * time.Second); len(SessionMembers(sid)) < tc.members; {
				if time.Now().After(deadline) {
					t.Fatalf("session has %v, want %d members", SessionMembers(sid), tc.members)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if n := StopSession(sid); n != tc.members {
				t.Errorf("StopSession stopped %d, want %d", n, tc.members)
			}
			for _, pid := range SessionMembers(sid) {
				// SIGSTOP is delivered asynchronously: wait for the state.
				for deadline := time.Now().Add(5 * time.Second); ; {
					st, err := procstat.Read(pid)
					if err != nil {
						t.Fatal(err)
					}
					if st.State == 'T' {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("pid %d in state %c after StopSession, want T", pid, st.State)
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			if n := KillSession(sid); n < tc.members {
				t.Errorf("KillSession signalled %d, want at least %d", n, tc.members)
			}
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the stopped session's leader did not die of SIGKILL")
			}
		})
	}
}
