package local

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleetd/providers"
)

// startUnrecorded does what Create does up to the moment it would record
// the supervisor's pid, and no further, as when the launching process is
// killed in between: a record with pid 0 and a running supervisor.
func startUnrecorded(t *testing.T, dir, id string) (exited chan struct{}, waitErr func() error, st store) {
	t.Helper()
	st = store{dir: dir}
	if err := st.init(); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(st.instanceDir(id), "root"), 0o755); err != nil {
		t.Fatal(err)
	}
	ln, addr, err := allocateAddress(DefaultAddressPrefix, map[string]bool{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	rec := record{ID: id, Fleet: "test", Offering: providers.Offering{Provider: Name, Zone: "local-a", CapacityType: providers.Spot},
		Address: addr, MetadataURL: "http://" + ln.Addr().String(), Tags: map[string]string{},
		LaunchedAt: time.Now().UTC(), Secret: "s", AgentBinary: os.Args[0], StopGrace: time.Second}
	if err := st.save(rec); err != nil {
		t.Fatal(err)
	}
	lf, err := ln.(interface{ File() (*os.File, error) }).File()
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	cmd := exec.Command(os.Args[0], NodeCommand, "-dir", st.instanceDir(id))
	cmd.Env = append(nodeEnv(), envListenFD+"=3")
	cmd.ExtraFiles = []*os.File{lf}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var werr error
	exited = make(chan struct{})
	go func() { werr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		signalSession(cmd.Process.Pid, 0, syscall.SIGKILL)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
		}
		if t.Failed() {
			t.Logf("supervisor output:\n%s", out.String())
		}
	})
	return exited, func() error { <-exited; return werr }, st
}

// TestUnrecordedLaunchPowersOff: a supervisor whose launch was never
// recorded (Create killed between the start and the pid's write) starts no
// agent, and powers off once the provider's next look marks the pid-less
// record terminated: no node runs on that nobody could ever stop.
func TestUnrecordedLaunchPowersOff(t *testing.T) {
	dir := t.TempDir()
	const id = "i-0123456789abcdef0"
	exited, waitErr, st := startUnrecorded(t, dir, id)

	time.Sleep(500 * time.Millisecond) // time enough to start an agent, were it going to
	select {
	case <-exited:
		t.Fatalf("the supervisor ended before the record was marked: %v", waitErr())
	default:
	}
	if s := st.readStatus(id); s.AgentPID != 0 {
		t.Fatalf("an agent started (pid %d) for an unrecorded launch", s.AgentPID)
	}

	p := New(Options{StateDir: dir})
	cfg := providers.Config{Fleet: "test", Raw: json.RawMessage(`{}`)}
	list, err := p.List(t.Context(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].State != providers.StateTerminated {
		t.Fatalf("list %+v, want the one instance terminated", list)
	}
	select {
	case <-exited:
		if waitErr() == nil {
			t.Error("the supervisor exited 0; want the error of a node that never ran")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the supervisor still runs 10 s after its record was marked terminated")
	}
	if s := st.readStatus(id); !s.Exited || !strings.Contains(s.ExitReason, "terminated before its launch was recorded") || s.AgentPID != 0 {
		t.Errorf("status %+v", s)
	}
}

// TestAwaitAdoption: the wait ends on the supervisor's own pid, refuses
// another's, and gives up after its bound.
func TestAwaitAdoption(t *testing.T) {
	st := store{dir: t.TempDir()}
	const id = "i-0123456789abcdef1"
	if err := os.MkdirAll(st.instanceDir(id), 0o755); err != nil {
		t.Fatal(err)
	}
	save := func(pid int) {
		if err := st.save(record{ID: id, PID: pid}); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()

	save(0)
	go func() { time.Sleep(100 * time.Millisecond); save(os.Getpid()) }()
	if err := awaitAdoption(ctx, st, id, 10*time.Second); err != nil {
		t.Errorf("recorded after 100 ms: %v", err)
	}
	save(os.Getpid() + 1)
	if err := awaitAdoption(ctx, st, id, 10*time.Second); err == nil || !strings.Contains(err.Error(), "another supervisor") {
		t.Errorf("another pid: %v", err)
	}
	save(0)
	if err := awaitAdoption(ctx, st, id, 200*time.Millisecond); err == nil || !strings.Contains(err.Error(), "not recorded within") {
		t.Errorf("never recorded: %v", err)
	}
}
