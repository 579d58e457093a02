package plugins_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleetd/internal/procstat"

	"github.com/fleetd/fleetd/internal/testutil"
	"github.com/fleetd/fleetd/plugins"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/providertest"
	"github.com/hashicorp/go-hclog"
	plugin "github.com/hashicorp/go-plugin"
)

// waitForGate waits until the plugin removes the gate file, which it does
// when Create starts blocking.
func waitForGate(t *testing.T, gate string) {
	t.Helper()
	for i := 0; ; i++ {
		if _, err := os.Stat(gate); errors.Is(err, os.ErrNotExist) {
			return
		}
		if i == 400 {
			t.Fatal("Create never reached the plugin")
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// alive reports whether pid is a live (non-zombie) process.
func alive(pid int) bool {
	st, err := procstat.Read(pid)
	return err == nil && st.State != 'Z'
}

// waitGone polls (bounded) until pid is no longer a live process. On
// failure it kills the process, so a failing test leaves no orphan.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	for range 200 {
		if !alive(pid) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Errorf("process %d still alive after 10s", pid)
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

func requireProc(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("checks processes through /proc")
	}
}

func getMem(t *testing.T, m *plugins.Manager) providers.Provider {
	t.Helper()
	p, err := m.Get(testCtx(t), providertest.MemName)
	if err != nil {
		t.Fatalf("Get mem: %v", err)
	}
	return p
}

// TestRestartMidCall SIGKILLs the plugin while it serves a slow Create: the
// call is retried once on a new process and succeeds.
func TestRestartMidCall(t *testing.T) {
	requireProc(t)
	m := providertest.NewPluginManager(t, []string{providertest.MemName}, nil)
	p := getMem(t, m)
	pid := m.PIDs()[providertest.MemName]
	if pid == 0 {
		t.Fatalf("no pid for the running plugin: %v", m.PIDs())
	}

	gate := filepath.Join(t.TempDir(), "block-once")
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(providertest.MemConfig{BlockOnceFile: gate})
	cfg := providers.Config{Fleet: "f", Raw: raw}
	type result struct {
		ins []providers.Instance
		err error
	}
	done := make(chan result, 1)
	go func() {
		ins, err := p.Create(testCtx(t), cfg, providers.LaunchRequest{Offering: memOffering(t), Count: 2, IdempotencyToken: "node-1"})
		done <- result{ins, err}
	}()
	waitForGate(t, gate)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Create did not return after the plugin was killed")
	}
	if r.err != nil {
		t.Fatalf("Create across a plugin crash: %v", r.err)
	}
	if len(r.ins) != 2 {
		t.Errorf("Create returned %d instances, want 2", len(r.ins))
	}
	newPID := m.PIDs()[providertest.MemName]
	if newPID == 0 || newPID == pid {
		t.Errorf("plugin pid after restart = %d, old %d", newPID, pid)
	}
	waitGone(t, pid)
}

// TestRestartAfterExit kills the plugin between calls: the next call
// notices the exit and starts a new process.
func TestRestartAfterExit(t *testing.T) {
	requireProc(t)
	m := providertest.NewPluginManager(t, []string{providertest.MemName}, nil)
	p := getMem(t, m)
	pid := m.PIDs()[providertest.MemName]
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)
	for _, call := range []func() error{
		func() error { _, err := p.Offerings(testCtx(t), providers.Config{}); return err },
		func() error { _, err := p.Info(testCtx(t)); return err },
	} {
		if err := call(); err != nil {
			t.Fatalf("call after the plugin died: %v", err)
		}
	}
	if got := m.PIDs()[providertest.MemName]; got == 0 || got == pid {
		t.Errorf("pid after restart %d (old %d)", got, pid)
	}
}

// TestCloseLeavesNoProcess starts a built-in and an external plugin and
// checks /proc after Close.
func TestCloseLeavesNoProcess(t *testing.T) {
	requireProc(t)
	dir, sum := buildExternal(t)
	m := providertest.NewPluginManager(t, []string{providertest.MemName}, func(o *plugins.ManagerOptions) {
		o.PluginDir = dir
		o.Checksums = map[string]string{"ext": sum}
	})
	mem := getMem(t, m)
	if _, err := m.Get(testCtx(t), "ext"); err != nil {
		t.Fatal(err)
	}
	pids := m.PIDs()
	if len(pids) != 2 {
		t.Fatalf("PIDs = %v, want mem and ext", pids)
	}
	for name, pid := range pids {
		if !alive(pid) {
			t.Fatalf("plugin %s (pid %d) is not running before Close", name, pid)
		}
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	for name, pid := range pids {
		if alive(pid) {
			t.Errorf("plugin %s (pid %d) survived Close", name, pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if len(m.PIDs()) != 0 {
		t.Errorf("PIDs after Close = %v", m.PIDs())
	}
	if _, err := m.Get(testCtx(t), providertest.MemName); !errors.Is(err, plugins.ErrManagerClosed) {
		t.Errorf("Get after Close: %v, want ErrManagerClosed", err)
	}
	if _, err := mem.Offerings(testCtx(t), providers.Config{}); !errors.Is(err, plugins.ErrManagerClosed) {
		t.Errorf("call after Close: %v, want ErrManagerClosed", err)
	}
	if len(m.PIDs()) != 0 {
		t.Errorf("a call after Close started a plugin: %v", m.PIDs())
	}
}

// TestKilledDaemonLeavesNoPlugin SIGKILLs a daemon process (no Close runs)
// and checks that its plugin dies with it (Pdeathsig).
func TestKilledDaemonLeavesNoPlugin(t *testing.T) {
	requireProc(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	// The killed plugin cannot remove its socket; keep it in our temp dir.
	cmd.Env = append(os.Environ(), daemonEnv+"=1", "TMPDIR="+t.TempDir())
	cmd.Stderr = t.Output()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("read the plugin pid from the daemon: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		t.Fatalf("daemon printed %q, want a pid", line)
	}
	if !alive(pid) {
		t.Fatalf("plugin %d is not running", pid)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	waitGone(t, pid)
}

var (
	buildOnce   sync.Once
	extBuildDir string // removed by TestMain
	extBinary   string
	buildErr    error
)

// buildExternal builds testdata/extprovider once per test run and installs
// a copy as fleetd-provider-ext in a fresh directory; it returns the
// directory and the file's sha256.
func buildExternal(t *testing.T) (dir, sum string) {
	t.Helper()
	buildOnce.Do(func() {
		goTool, err := exec.LookPath("go")
		if err != nil {
			goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		extBuildDir, buildErr = os.MkdirTemp("", "fleetd-ext-build-")
		if buildErr != nil {
			return
		}
		extBinary = filepath.Join(extBuildDir, "extprovider")
		cmd := exec.Command(goTool, "build", "-o", extBinary, "./testdata/extprovider")
		if b, err := cmd.CombinedOutput(); err != nil {
			buildErr = errors.New("go build ./testdata/extprovider: " + err.Error() + "\n" + string(b))
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	dir = t.TempDir()
	b, err := os.ReadFile(extBinary)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, plugins.ExternalPrefix+"ext"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(b)
	return dir, hex.EncodeToString(h[:])
}

func TestExternalPluginPinning(t *testing.T) {
	dir, sum := buildExternal(t)
	wrong := strings.Repeat("ab", 32)
	path := filepath.Join(dir, plugins.ExternalPrefix+"ext")

	t.Run("wrong sha256 is refused", func(t *testing.T) {
		m := providertest.NewPluginManager(t, nil, func(o *plugins.ManagerOptions) {
			o.PluginDir = dir
			o.Checksums = map[string]string{"ext": wrong}
		})
		_, err := m.Get(testCtx(t), "ext")
		var ce *plugins.ChecksumError
		if !errors.As(err, &ce) || !errors.Is(err, plugin.ErrChecksumsDoNotMatch) {
			t.Fatalf("Get with a wrong pin: %v, want a ChecksumError", err)
		}
		for _, want := range []string{path, "expected " + wrong, "actual " + sum} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
		}
		if len(m.PIDs()) != 0 {
			t.Errorf("a refused plugin runs: %v", m.PIDs())
		}
	})
	t.Run("missing pin is refused", func(t *testing.T) {
		m := providertest.NewPluginManager(t, nil, func(o *plugins.ManagerOptions) { o.PluginDir = dir })
		_, err := m.Get(testCtx(t), "ext")
		if !errors.Is(err, plugins.ErrNoChecksum) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), sum) {
			t.Fatalf("Get without a pin: %v, want ErrNoChecksum naming %s and its sha256", err, path)
		}
	})
	t.Run("missing plugin", func(t *testing.T) {
		m := providertest.NewPluginManager(t, []string{providertest.MemName}, func(o *plugins.ManagerOptions) { o.PluginDir = dir })
		_, err := m.Get(testCtx(t), "nope")
		if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "fleetd-provider-nope")) || !strings.Contains(err.Error(), "built in: mem") {
			t.Fatalf("Get of an absent provider: %v", err)
		}
		if _, err := m.Get(testCtx(t), "../ext"); err == nil {
			t.Fatal("Get accepted a path as a provider name")
		}
	})
	t.Run("plugin serving another name is refused", func(t *testing.T) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, plugins.ExternalPrefix+"other"), b, 0o755); err != nil {
			t.Fatal(err)
		}
		m := providertest.NewPluginManager(t, nil, func(o *plugins.ManagerOptions) {
			o.PluginDir = dir
			o.Checksums = map[string]string{"other": sum}
		})
		if _, err := m.Get(testCtx(t), "other"); err == nil || !strings.Contains(err.Error(), `serves provider "ext", not "other"`) {
			t.Fatalf("Get of a misnamed plugin: %v", err)
		}
	})
	t.Run("right sha256 works", func(t *testing.T) {
		var logs testutil.SyncBuffer
		m := providertest.NewPluginManager(t, nil, func(o *plugins.ManagerOptions) {
			o.PluginDir = dir
			o.Checksums = map[string]string{"ext": "sha256:" + strings.ToUpper(sum)}
			o.Logger = hclog.New(&hclog.LoggerOptions{Level: hclog.Info, Output: &logs})
		})
		p, err := m.Get(testCtx(t), "ext")
		if err != nil {
			t.Fatalf("Get with the right pin: %v", err)
		}
		offs, err := p.Offerings(testCtx(t), providers.Config{})
		if err != nil || len(offs) == 0 || offs[0].Provider != "ext" {
			t.Fatalf("Offerings: %v, %v", offs, err)
		}
		err = p.(providers.Interrupter).Interrupt(testCtx(t), providers.Config{}, "x", providers.InterruptionInfo{Kind: "preempted"})
		if !errors.Is(err, errors.ErrUnsupported) {
			t.Errorf("Interrupt on a provider without it: %v, want errors.ErrUnsupported", err)
		}
		// The plugin's JSON log line on stderr arrives in our logger.
		for i := 0; !strings.Contains(logs.String(), "ext provider serving"); i++ {
			if i == 100 {
				t.Fatalf("plugin log line not relayed; logs:\n%s", logs.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

// TestExternalPluginConformance runs the suite through a separately built
// binary that imports only providers and plugins.
func TestExternalPluginConformance(t *testing.T) {
	dir, sum := buildExternal(t)
	providertest.Run(t, func(t *testing.T) (providers.Provider, providers.Config) {
		m := providertest.NewPluginManager(t, nil, func(o *plugins.ManagerOptions) {
			o.PluginDir = dir
			o.Checksums = map[string]string{"ext": sum}
		})
		p, err := m.Get(testCtx(t), "ext")
		if err != nil {
			t.Fatal(err)
		}
		return p, providers.Config{Fleet: "ext-conformance"}
	}, providertest.Options{})
}

func TestPluginBinaryRefusesToRunByHand(t *testing.T) {
	dir, _ := buildExternal(t)
	cmd := exec.Command(filepath.Join(dir, plugins.ExternalPrefix+"ext"))
	cmd.Env = []string{} // no magic cookie
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.Stdout = io.Discard
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(stderr.String(), "This binary is a plugin") {
		t.Errorf("plugin run by hand: %v, stderr %q", err, stderr.String())
	}
}

// TestConcurrentCallsShareOneRestart: many calls in flight when the plugin
// dies all succeed, through one replacement process.
func TestConcurrentCallsShareOneRestart(t *testing.T) {
	requireProc(t)
	m := providertest.NewPluginManager(t, []string{providertest.MemName}, nil)
	p := getMem(t, m)
	pid := m.PIDs()[providertest.MemName]
	raw, _ := json.Marshal(providertest.MemConfig{CreateDelay: "300ms"})
	cfg := providers.Config{Fleet: "f", Raw: raw}
	const n = 8
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, err := p.Create(testCtx(t), cfg, providers.LaunchRequest{Offering: memOffering(t), Count: 1, IdempotencyToken: "c-" + strconv.Itoa(i)})
			errs <- err
		}()
	}
	time.Sleep(100 * time.Millisecond) // let the calls reach the plugin; correctness does not depend on it
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("Create: %v", err)
		}
	}
	waitGone(t, pid)
	if got := m.PIDs()[providertest.MemName]; got == 0 || got == pid {
		t.Errorf("pid after restart %d (old %d)", got, pid)
	}
}

// TestCloseDuringBlockedCall: Close does not wait for a provider call that
// never ends, and the call fails instead of restarting the plugin.
func TestCloseDuringBlockedCall(t *testing.T) {
	requireProc(t)
	m := providertest.NewPluginManager(t, []string{providertest.MemName}, nil)
	p := getMem(t, m)
	pid := m.PIDs()[providertest.MemName]
	gate := filepath.Join(t.TempDir(), "block-once")
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(providertest.MemConfig{BlockOnceFile: gate})
	done := make(chan error, 1)
	go func() {
		_, err := p.Create(testCtx(t), providers.Config{Raw: raw}, providers.LaunchRequest{Offering: memOffering(t), Count: 1})
		done <- err
	}()
	waitForGate(t, gate)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, plugins.ErrManagerClosed) {
			t.Errorf("Create during Close: %v, want ErrManagerClosed", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Create still blocked after Close")
	}
	if alive(pid) {
		t.Errorf("plugin %d survived Close", pid)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if len(m.PIDs()) != 0 {
		t.Errorf("plugin restarted after Close: %v", m.PIDs())
	}
}
