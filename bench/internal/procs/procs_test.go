package procs

import (
	"os/exec"
	"syscall"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	tests := []struct {
		stat    string
		sid     int
		exited  bool
		wantErr bool
	}{
		{"4242 (python3) S 1 4242 4240 0 -1 4194560 0 0", 4240, false, false},
		{"17 (a (b) c) Z 1 17 17 0 -1", 17, true, false},
		{"17 (torch run) R 1 17 99 0", 99, false, false},
		{"17 python3 S 1 17 99", 0, false, true},
		{"17 (x) S 1", 0, false, true},
	}
	for _, tt := range tests {
		st, err := parseStat([]byte(tt.stat))
		if (err != nil) != tt.wantErr || st.sid != tt.sid || st.exited() != tt.exited {
			t.Errorf("parseStat(%q) = %d, %v, %v; want %d, %v, err %v", tt.stat, st.sid, st.exited(), err, tt.sid, tt.exited, tt.wantErr)
		}
	}
}

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
					st, err := readStat(pid)
					if err != nil {
						t.Fatal(err)
					}
					if st.state == 'T' {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("pid %d in state %c after StopSession, want T", pid, st.state)
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
