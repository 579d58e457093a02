package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/internal/freeport"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// fleetdBinary builds the real binary once per test run: the daemon tests
// exercise it as users do, as separate processes talking HTTP.
func fleetdBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "fleetd-bin-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "fleetd")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

type devDaemon struct {
	cmd   *exec.Cmd
	addr  string
	token string
	done  chan error
}

// startDaemon runs `fleetd serve -dev` on a fixed data dir and reads the
// exported address and token from its output.
func startDaemon(t *testing.T, bin, dataDir, addr string) *devDaemon {
	t.Helper()
	return startDevDaemonIn(t, bin, "", dataDir, addr)
}

// startApplied runs a dev daemon on dataDir and applies src (written to
// NAME.hcl); a failed apply stops the daemon. Defer its stop.
func startApplied(t *testing.T, bin, dataDir, name, src string) *devDaemon {
	t.Helper()
	specFile := filepath.Join(t.TempDir(), name+".hcl")
	if err := os.WriteFile(specFile, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, bin, dataDir, freeAddr(t))
	if out, errOut, code := d.cli(t, bin, "apply", "-auto-approve", specFile); code != 0 {
		d.stop(t)
		t.Fatalf("apply: %d\n%s\n%s", code, out, errOut)
	}
	return d
}

// localFleet is the frame of the e2e tests' fleets: nodes of one GPU
// colocated in one region on the local provider. The sizes and the blocks'
// bodies are each test's own.
type localFleet struct {
	name     string
	sizes    string // the *_nodes lines
	provider string // the body of provider "local"
	training string
	// rendezvous is the rendezvous block's body; "" leaves the block out.
	rendezvous string
}

func (f localFleet) hcl() string {
	s := fmt.Sprintf("\nfleet %q {%s\n  node {\n    gpus = 1\n  }\n  placement {\n    colocate = \"region\"\n  }\n"+
		"  provider \"local\" {%s\n  }\n  training {%s\n  }\n", f.name, f.sizes, f.provider, f.training)
	if f.rendezvous != "" {
		s += "  rendezvous {" + f.rendezvous + "\n  }\n"
	}
	return s + "}\n"
}

// localNodeDir is a dev daemon's local provider directory under dataDir;
// startDevDaemonIn kills the node processes there when t ends.
func localNodeDir(dataDir string) string { return filepath.Join(dataDir, "local") }

func (d *devDaemon) stop(t *testing.T) {
	t.Helper()
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-d.done:
		if err != nil {
			t.Fatalf("daemon exit after SIGTERM: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("daemon did not stop on SIGTERM")
	}
}

func (d *devDaemon) cli(t *testing.T, bin string, args ...string) (string, string, int) {
	t.Helper()
	return runFleetd(t, bin, d.addr, d.token, args...)
}

// runFleetd runs the CLI against addr (one address or a comma-separated
// list of a cluster's servers) and returns stdout, stderr and the exit code.
func runFleetd(t *testing.T, bin, addr, token string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "FLEETD_ADDR="+addr, "FLEETD_TOKEN="+token)
	return runCLI(t, cmd)
}

// runCLI runs cmd and returns its stdout, stderr and exit code; a command
// that cannot run fails t.
func runCLI(t *testing.T, cmd *exec.Cmd) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// TestDaemonApplyStatusRestart is the foundation's acceptance path: serve
// -dev, apply the local example, status -json shows it, a restarted daemon
// still has it, and the API refuses requests without the token.
func TestDaemonApplyStatusRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := fleetdBinary(t)
	dataDir := t.TempDir()
	addr := freeAddr(t)
	d := startDaemon(t, bin, dataDir, addr)
	spec := filepath.Join("..", "..", "configs", "examples", "local.hcl")

	out, errOut, code := d.cli(t, bin, "apply", "-auto-approve", spec)
	if code != 0 {
		t.Fatalf("apply exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if !strings.Contains(out, "Applied fleet") {
		t.Fatalf("apply output: %s", out)
	}
	var st api.Status
	out, errOut, code = d.cli(t, bin, "status", "-json")
	if code != 0 {
		t.Fatalf("status exit %d: %s", code, errOut)
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status -json: %v\n%s", err, out)
	}
	if len(st.Fleets) != 1 || st.Fleets[0].Generation != 1 {
		t.Fatalf("status fleets = %+v", st.Fleets)
	}
	name := st.Fleets[0].Name

	// Applying the same file again is a no-op: the generation stays.
	if out, errOut, code = d.cli(t, bin, "apply", "-auto-approve", "-json", spec); code != 0 {
		t.Fatalf("re-apply exit %d: %s", code, errOut)
	}
	var ar api.ApplyResponse
	if err := json.Unmarshal([]byte(out), &ar); err != nil || ar.Plan.Fleets[0].Action != api.ActionNoop || ar.Fleets[0].Generation != 1 {
		t.Fatalf("re-apply: %v %+v", err, ar)
	}

	// No token, wrong token → 401; /healthz needs none.
	for _, tok := range []string{"", "wrong-token-wrong-token"} {
		req, _ := http.NewRequest("GET", d.addr+"/v1/status", nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("token %q: status %d, want 401", tok, resp.StatusCode)
		}
	}

	d.stop(t)
	d2 := startDaemon(t, bin, dataDir, addr)
	if d2.token != d.token {
		t.Fatalf("token changed across restart")
	}
	out, errOut, code = d2.cli(t, bin, "status", "-json")
	if code != 0 {
		t.Fatalf("status after restart exit %d: %s", code, errOut)
	}
	st = api.Status{}
	if err := json.Unmarshal([]byte(out), &st); err != nil || len(st.Fleets) != 1 || st.Fleets[0].Name != name {
		t.Fatalf("after restart: %v %+v", err, st.Fleets)
	}
	out, _, code = d2.cli(t, bin, "status", name)
	if code != 0 || !strings.Contains(out, name) {
		t.Fatalf("status %s: %d %s", name, code, out)
	}
	out, _, code = d2.cli(t, bin, "events")
	if code != 0 || !strings.Contains(out, "fleet.applied") {
		t.Fatalf("events: %d %s", code, out)
	}
	// Destroy removes a fleet without nodes.
	if _, errOut, code = d2.cli(t, bin, "destroy", "-auto-approve", name); code != 0 {
		t.Fatalf("destroy: %d %s", code, errOut)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, _, code = d2.cli(t, bin, "status", name)
		if code == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("fleet not removed after destroy")
		}
		time.Sleep(100 * time.Millisecond)
	}
	d2.stop(t)
}

// TestApplyRejectsBrokenSpecLocally checks spec errors are reported by the
// CLI, with positions, before anything reaches the daemon (exit 2).
func TestApplyRejectsBrokenSpecLocally(t *testing.T) {
	bin := fleetdBinary(t)
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.hcl")
	if err := os.WriteFile(bad, []byte("fleet \"x\" {\n  min_nodes = 3\n  max_nodes = 1\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "apply", "-auto-approve", bad)
	// An address nobody listens on: the CLI must fail before dialing.
	cmd.Env = append(os.Environ(), "FLEETD_ADDR=http://127.0.0.1:1", "FLEETD_TOKEN=x")
	out, err := cmd.CombinedOutput()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 2 {
		t.Fatalf("exit: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "bad.hcl:") || strings.Contains(string(out), "connection refused") {
		t.Fatalf("output:\n%s", out)
	}
}
