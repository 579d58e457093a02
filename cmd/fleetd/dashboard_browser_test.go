package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/internal/testutil"
)

// chromiumPath is Debian's chromium package (apt-get install chromium).
const chromiumPath = "/usr/bin/chromium"

// requireChromium fails t without the browser: a dashboard check that
// cannot run must not pass (.ci/run installs chromium).
func requireChromium(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Fatalf("the dashboard check needs Debian's chromium at %s (apt-get install chromium; .ci/run installs it): %v", chromiumPath, err)
	}
}

// startDevDaemonIn runs `fleetd serve -dev` in dir ("" for the test's
// own) on a fixed data dir, reads the exported address and token from its
// output, waits for /healthz, and prints the daemon's log tail if the test
// fails. extra are more serve flags (-config).
func startDevDaemonIn(t *testing.T, bin, dir, dataDir, addr string, extra ...string) *devDaemon {
	t.Helper()
	logs := &testutil.SyncBuffer{}
	cmd, done, base, token, err := serveDev(bin, dir, addr, dataDir, logs, extra...)
	if cmd != nil {
		t.Cleanup(func() {
			if cmd.ProcessState == nil {
				_ = cmd.Process.Kill()
				<-done
			}
			// Killed, a dev daemon leaves its local nodes (a stop ends
			// them): they go now, after it, so nothing replaces them,
			// even after a failure half-way.
			if dataDir != "" {
				killAll("local-node", localNodeDir(dataDir))
			}
			if t.Failed() {
				t.Logf("daemon log (tail):\n%s", tail(logs.String(), 60))
			}
		})
	}
	if err != nil {
		t.Fatalf("%v\n%s", err, logs.String())
	}
	d := &devDaemon{cmd: cmd, done: done, addr: base, token: token}
	waitUntil(t, "daemon healthy", 10*time.Second, func() bool { return healthy(d.addr) })
	return d
}

// serveDev starts `bin serve -dev` on addr and dataDir (extra: more serve
// flags) in dir with its log on stderr, and waits 30 s for the address
// and token it exports. done yields the process's exit; cmd is nil when it
// did not start.
func serveDev(bin, dir, addr, dataDir string, stderr io.Writer, extra ...string) (cmd *exec.Cmd, done chan error, base, token string, err error) {
	cmd = exec.Command(bin, append([]string{"serve", "-dev", "-listen", addr, "-data-dir", dataDir}, extra...)...)
	cmd.Dir = dir
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, "", "", err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, "", "", err
	}
	done = make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	found := make(chan [2]string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if base, token := api.ScanDevExports(sc); token != "" {
			found <- [2]string{base, token}
		}
		for sc.Scan() {
		}
	}()
	select {
	case e := <-found:
		return cmd, done, e[0], e[1], nil
	case err := <-done:
		done <- err // for whoever waits on the process next
		return cmd, done, "", "", fmt.Errorf("daemon exited at start: %v", err)
	case <-time.After(30 * time.Second):
		return cmd, done, "", "", errors.New("daemon printed no token")
	}
}

// healthy reports whether the daemon at base answers /healthz.
func healthy(base string) bool {
	resp, err := http.Get(base + "/healthz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func tail(s string, lines int) string {
	ls := strings.Split(s, "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}

// pageState is what the test reads from the dashboard's DOM.
type pageState struct {
	Fleets        []string          `json:"fleets"`
	Nodes         map[string]string `json:"nodes"`     // id → state
	Instances     map[string]string `json:"instances"` // id → instance cell
	Addresses     map[string]string `json:"addresses"` // id → address cell
	Timeline      int               `json:"timeline"`
	Interruptions string            `json:"interruptions"`
	Conn          string            `json:"conn"`
	Events        int               `json:"events"`
	LoginShown    bool              `json:"login_shown"`
}

const readPage = `(() => {
  const q = (s) => Array.from(document.querySelectorAll(s));
  const nodes = {};
  const instances = {}, addresses = {};
  for (const r of q('#nodes tbody tr[data-node]')) {
    nodes[r.dataset.node] = r.dataset.state;
    instances[r.dataset.node] = (r.querySelector('.node-instance') || {}).textContent || '';
    addresses[r.dataset.node] = (r.querySelector('.node-address') || {}).textContent || '';
  }
  const tl = document.getElementById('chart-interruptions');
  return {
    fleets: q('#fleets tbody tr[data-fleet]').map((r) => r.dataset.fleet),
    nodes, instances, addresses,
    timeline: Number(tl ? tl.getAttribute('data-count') : -1),
    interruptions: (document.getElementById('kpi-interruptions') || {}).textContent || '',
    conn: (document.getElementById('conn') || {}).textContent || '',
    events: q('#events tbody tr').length,
    login_shown: !document.getElementById('login').hidden,
  };
})()`

// TestDashboardInBrowser opens the dashboard of a real `fleetd serve -dev`
// in headless Chromium, sees the applied local fleet, injects a spot
// interruption with `fleetd debug interrupt`, and waits for the page to
// show it live (timeline marker, interruption count, the node draining),
// then saves a screenshot.
func TestDashboardInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binary, local nodes and a browser")
	}
	requireChromium(t)
	bin := fleetdBinary(t)
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	d := startDevDaemonIn(t, bin, root, dataDir, freeAddr(t))
	spec := filepath.Join(root, "configs", "examples", "local.hcl")
	if out, errOut, code := d.cli(t, bin, "apply", "-auto-approve", "-var", "steps=100000", "-var", "checkpoint_dir="+t.TempDir(), spec); code != 0 {
		t.Fatalf("apply: exit %d\n%s\n%s", code, out, errOut)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless,
		chromedp.NoSandbox, // the sandbox needs user namespaces root does not get here
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1300),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	browser, cancelBrowser := chromedp.NewContext(allocCtx)
	defer cancelBrowser()

	var jsErrs []string
	var jsMu sync.Mutex
	if err := chromedp.Listen(browser, func(ev any) {
		if e, ok := ev.(*runtime.EventExceptionThrown); ok {
			jsMu.Lock()
			msg := e.ExceptionDetails.Text
			if e.ExceptionDetails.Exception != nil {
				msg += " " + e.ExceptionDetails.Exception.Description
			}
			jsErrs = append(jsErrs, fmt.Sprintf("%s (%s:%d)", msg, e.ExceptionDetails.URL, e.ExceptionDetails.LineNumber+1))
			jsMu.Unlock()
		}
	}); err != nil {
		t.Fatalf("start chromium: %v", err)
	}

	// The token travels in the fragment, which never reaches the server.
	if err := chromedp.Do(browser, chromedp.Navigate(d.addr+"/#token="+d.token)); err != nil {
		t.Fatalf("open dashboard: %v", err)
	}
	var ps pageState
	read := func() pageState {
		s, err := chromedp.Run(browser, chromedp.Evaluate[pageState](readPage))
		if err != nil {
			t.Fatalf("read page: %v", err)
		}
		return s
	}
	waitPage := func(what string, cond func(pageState) bool) {
		t.Helper()
		deadline := time.Now().Add(45 * time.Second)
		for {
			ps = read()
			if cond(ps) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("page never showed %s; last state %+v", what, ps)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	waitPage("the demo fleet with 3 launched nodes and a live stream", func(s pageState) bool {
		live := 0
		for _, st := range s.Nodes {
			if st == "booting" || st == "joined" || st == "running" {
				live++
			}
		}
		return len(s.Fleets) == 1 && s.Fleets[0] == "demo" && live == 3 && s.Conn == "live" && !s.LoginShown
	})
	// The node table names each launched node's instance and, once its
	// agent registered, the address it gave: what an operator needs to
	// find the VM and ssh to it.
	waitPage("an instance id for each launched node and an address for each registered one", func(s pageState) bool {
		seen := map[string]bool{}
		for id, st := range s.Nodes {
			inst, addr := s.Instances[id], s.Addresses[id]
			switch st {
			case "booting", "joined", "running":
				if inst == "" || inst == "–" || seen[inst] {
					return false
				}
				seen[inst] = true
			}
			if (st == "joined" || st == "running") && (addr == "" || addr == "–") {
				return false
			}
		}
		return len(seen) == 3
	})
	if ps.Timeline != 0 || ps.Interruptions != "0" {
		t.Fatalf("interruptions before any was injected: %+v", ps)
	}
	before := filepath.Join(os.TempDir(), "fleetd-dashboard-before.png")
	saveScreenshot(t, browser, before)

	// A node with an instance gets a spot interruption through the local
	// provider's metadata emulator, as a cloud would deliver it.
	out, errOut, code := d.cli(t, bin, "status", "-json", "demo")
	if code != 0 {
		t.Fatalf("status: %s", errOut)
	}
	var det api.FleetDetail
	if err := json.Unmarshal([]byte(out), &det); err != nil {
		t.Fatal(err)
	}
	victim := ""
	for _, n := range det.Nodes {
		if n.InstanceID != "" && victim == "" {
			victim = n.ID
		}
	}
	if victim == "" {
		t.Fatalf("no node with an instance: %+v", det.Nodes)
	}
	eventsBefore := ps.Events
	if out, errOut, code := d.cli(t, bin, "debug", "interrupt", "-lead", "30s", "demo", victim); code != 0 {
		t.Fatalf("debug interrupt: exit %d\n%s\n%s", code, out, errOut)
	}
	// No reload: the page updates from the event stream.
	waitPage("the interruption (timeline marker, count, victim draining)", func(s pageState) bool {
		st := s.Nodes[victim]
		return s.Timeline >= 1 && s.Interruptions == "1" && (st == "draining" || st == "terminating" || st == "terminated") && s.Events > eventsBefore
	})
	shot := filepath.Join(os.TempDir(), "fleetd-dashboard.png")
	saveScreenshot(t, browser, shot)
	if dir := os.Getenv("FLEETD_SCREENSHOT_DIR"); dir != "" {
		for _, p := range []string{before, shot} {
			b, err := os.ReadFile(p)
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, filepath.Base(p)), b, 0o644)
			}
			if err != nil {
				t.Errorf("copy screenshot to FLEETD_SCREENSHOT_DIR: %v", err)
			}
		}
	}
	t.Logf("dashboard screenshots: %s (before) and %s (after the interruption of %s)", before, shot, victim)

	jsMu.Lock()
	defer jsMu.Unlock()
	if len(jsErrs) > 0 {
		t.Errorf("JavaScript exceptions on the page: %v", jsErrs)
	}
	d.stop(t)
}

// waitDashboard evaluates js (returning a T) in the page until cond holds
// or timeout passes, and returns the last state read.
func waitDashboard[T any](t *testing.T, browser context.Context, js string, timeout time.Duration, what string, cond func(T) bool) T {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		s, err := chromedp.Run(browser, chromedp.Evaluate[T](js))
		if err != nil {
			t.Fatalf("read page: %v", err)
		}
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("page never showed %s; last state %+v", what, s)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func saveScreenshot(t *testing.T, browser context.Context, path string) {
	t.Helper()
	// Quality 100 makes chromedp capture PNG.
	png, err := chromedp.Run(browser, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Fatalf("screenshot is not a PNG (%d bytes)", len(png))
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "dashboard screenshot: %s\n", path)
}

// openDashboard starts headless Chromium (window 1400×height) and opens
// d's dashboard with its token. The browser ends when ctx does.
func openDashboard(t *testing.T, ctx context.Context, d *devDaemon, height int) context.Context {
	t.Helper()
	return openDashboardAs(t, ctx, d.addr, d.token, height)
}

// openDashboardAs is openDashboard presenting token.
func openDashboardAs(t *testing.T, ctx context.Context, addr, token string, height int) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1400, height))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	browser, cancelBrowser := chromedp.NewContext(allocCtx)
	t.Cleanup(func() { cancelBrowser(); cancelAlloc() })
	if err := chromedp.Do(browser, chromedp.Navigate(addr+"/#token="+token)); err != nil {
		t.Fatalf("open dashboard: %v", err)
	}
	return browser
}
