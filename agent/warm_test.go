package agent

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/rendezvous"
)

func TestPythonEntry(t *testing.T) {
	tests := []struct {
		cmd          []string
		flags, entry []string
		ok           bool
	}{
		{cmd: []string{"python3", "train.py", "--lr", "1"}, entry: []string{"train.py", "--lr", "1"}, ok: true},
		{cmd: []string{"/usr/bin/python3.11", "-u", "-X", "dev", "-Werror", "/a/t.py"}, flags: []string{"-u", "-X", "dev", "-Werror"}, entry: []string{"/a/t.py"}, ok: true},
		{cmd: []string{"python", "-uBW", "ignore", "t.py", "-m", "x"}, flags: []string{"-uBW", "ignore"}, entry: []string{"t.py", "-m", "x"}, ok: true},
		{cmd: []string{"python3", "-O", "-m", "pkg.train", "--steps", "3"}, flags: []string{"-O"}, entry: []string{"-m", "pkg.train", "--steps", "3"}, ok: true},
		{cmd: []string{"python3", "-c", "print(1)"}},
		{cmd: []string{"python3", "-i", "t.py"}},
		{cmd: []string{"python3", "-x", "t.py"}},
		{cmd: []string{"python3", "-"}},
		{cmd: []string{"python3", "--version"}},
		{cmd: []string{"python3", "app.zip"}},
		{cmd: []string{"python3", "-m"}},
		{cmd: []string{"python3", "-X"}},
		{cmd: []string{"torchrun", "t.py"}},
		{cmd: []string{"/usr/bin/env", "python3", "t.py"}},
		{cmd: []string{"python3"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.cmd, " "), func(t *testing.T) {
			flags, entry, ok := pythonEntry(tt.cmd)
			if ok != tt.ok || !slices.Equal(flags, tt.flags) || !slices.Equal(entry, tt.entry) {
				t.Errorf("pythonEntry = %q, %q, %v; want %q, %q, %v", flags, entry, ok, tt.flags, tt.entry, tt.ok)
			}
		})
	}
}

// torchPython is the interpreter with torch (Debian's python3-torch); the
// python3 first on PATH may have none.
func torchPython(t *testing.T) string {
	t.Helper()
	const py = "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import torch.distributed").Run(); err != nil {
		t.Skipf("%s cannot import torch (%v): warm starts are tested with real PyTorch", py, err)
	}
	return py
}

// supervisorLog is a supervisor's log file, read while it writes.
type supervisorLog string

func (l supervisorLog) String() string {
	b, _ := os.ReadFile(string(l))
	return string(b)
}

// testSupervisor is a node's supervisor without the rest of the agent.
func testSupervisor(t *testing.T, root string) (*supervisor, supervisorLog) {
	t.Helper()
	logs := supervisorLog(filepath.Join(t.TempDir(), "supervisor.log"))
	f, err := os.Create(string(logs))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	s := &supervisor{
		log: slog.New(slog.NewJSONHandler(f, nil)), logDir: filepath.Join(root, "logs"),
		drainFile: filepath.Join(root, "drain.json"), fleet: "f", node: "n",
		exits: make(chan workerExit, 16), quit: make(chan struct{}),
	}
	if s.warm, err = newWarmPool(root); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.closeWarm("test ends")
		close(s.quit)
		if t.Failed() {
			t.Logf("--- supervisor log:\n%s", logs.String())
		}
	})
	return s, logs
}

// runRound starts one round's workers and returns their exits and logs.
func runRound(t *testing.T, s *supervisor, a rendezvous.Assignment, tc TrainingConfig) ([]*worker, []string) {
	t.Helper()
	set := s.start(a, tc, 2, nil)
	for range set.workers {
		select {
		case <-s.exits:
		case <-time.After(60 * time.Second):
			set.stop(time.Second)
			t.Fatal("workers did not exit within 60s")
		}
	}
	var logs []string
	for _, w := range set.workers {
		b, _ := os.ReadFile(w.logFile)
		logs = append(logs, string(b))
	}
	return set.workers, logs
}

// contractScript records what a worker sees of its start: the
// environment, argv, sys.path, __main__, fds, signals, process group and
// loaded modules. It imports torch first, as a trainer does.
const contractScript = `import torch, torch.distributed
import json, os, signal, sys
g = globals()
info = {
    "env": dict(os.environ), "argv": sys.argv, "orig_argv": sys.orig_argv, "path": sys.path,
    "executable": sys.executable, "flags": repr(sys.flags), "cwd": os.getcwd(),
    "name": __name__, "main_is_globals": sys.modules["__main__"].__dict__ is g,
    "main_keys": sorted(k for k in g if k.startswith("__")),
    "file": g.get("__file__"), "cached": g.get("__cached__"), "doc": g.get("__doc__"),
    "package": g.get("__package__"), "spec": getattr(g.get("__spec__"), "name", None),
    "loader": type(g.get("__loader__")).__name__, "annotations": g.get("__annotations__"),
    "leader": os.getpgid(0) == os.getpid(), "fds": sorted(os.listdir("/proc/self/fd")),
    "stdin": os.path.samestat(os.fstat(0), os.stat("/dev/null")),
    "signals": {s: str(signal.getsignal(getattr(signal, s))) for s in ("SIGTERM", "SIGINT", "SIGPIPE", "SIGCHLD")},
    "modules": sorted(m for m in sys.modules if m != "__mp_main__"),
    "rank_at_import": os.environ.get("RANK"),
}
out = os.environ["DUMP_OUT"]
with open(os.path.join(out, "info-%s.json" % os.environ["RANK"]), "w") as f:
    json.dump(info, f)
print("to stdout", os.environ["RANK"])
print("to stderr", os.environ["RANK"], file=sys.stderr)
sys.exit(int(os.environ.get("EXIT_CODE", "0")))
`

func TestWarmStartKeepsTheWorkerContract(t *testing.T) {
	py := torchPython(t)
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "contract.py"), []byte(contractScript), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(src, "contract.py"), filepath.Join(src, "linked.py")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		command []string
		workdir string
	}{
		{name: "script", command: []string{py, "contract.py", "--x", "${local_rank}"}, workdir: src},
		{name: "script via symlink, flags", command: []string{py, "-u", "-X", "utf8", "linked.py"}, workdir: src},
		{name: "absolute script, other workdir", command: []string{py, filepath.Join(src, "contract.py"), "a b"}},
		{name: "module", command: []string{py, "-m", "contract", "--y"}, workdir: src},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			a := rendezvous.Assignment{Round: 4, RunID: "run-1", GroupRank: 1, GroupWorldSize: 2, RankOffset: 2,
				LocalWorldSize: 2, WorldSize: 4, MasterAddr: "127.0.0.1", MasterPort: 29999}
			workdir := tt.workdir
			if workdir == "" {
				workdir = t.TempDir()
			}
			infos := map[bool][]map[string]any{}
			logs := map[bool][]string{}
			for _, warm := range []bool{false, true} {
				out := t.TempDir()
				tc := TrainingConfig{Command: tt.command, Workdir: workdir, NprocPerNode: 2, MaxRestarts: 3,
					Env: map[string]string{"DUMP_OUT": out, "EXIT_CODE": "7", "OMP_NUM_THREADS": "2"}, WarmStart: &warm}
				s, alog := testSupervisor(t, root) // the same paths: the environments must match exactly
				s.prepareWarm(tc)
				if n, ok := s.waitWarm(nil, 60*time.Second); !ok || n != map[bool]int{false: 0, true: 2}[warm] {
					t.Fatalf("warm=%v: %d warm interpreters, ready %v", warm, n, ok)
				}
				ws, l := runRound(t, s, a, tc)
				for _, w := range ws {
					if w.status.Code != 7 || w.status.Signal != 0 || w.status.Err != nil {
						t.Errorf("warm=%v rank %d: %s, want exit 7", warm, w.rank, w.status)
					}
					if w.warm != warm {
						t.Errorf("rank %d started warm=%v, want %v; log:\n%s", w.rank, w.warm, warm, alog.String())
					}
				}
				for i, w := range ws {
					b, err := os.ReadFile(filepath.Join(out, fmt.Sprintf("info-%d.json", w.rank)))
					if err != nil {
						t.Fatalf("warm=%v: %v; log:\n%s", warm, err, l[i])
					}
					var m map[string]any
					if err := json.Unmarshal(b, &m); err != nil {
						t.Fatal(err)
					}
					infos[warm] = append(infos[warm], m)
				}
				logs[warm] = l
				if err := os.RemoveAll(s.logDir); err != nil {
					t.Fatal(err)
				}
			}
			for i := range infos[false] {
				cold, warm := infos[false][i], infos[true][i]
				// DUMP_OUT is a directory per run.
				delete(cold["env"].(map[string]any), "DUMP_OUT")
				delete(warm["env"].(map[string]any), "DUMP_OUT")
				for k := range cold {
					if !reflect.DeepEqual(cold[k], warm[k]) {
						t.Errorf("rank %d: %s differs:\ncold %v\nwarm %v", i+2, k, cold[k], warm[k])
					}
				}
				if cold["name"] != "__main__" || cold["main_is_globals"] != true || cold["leader"] != true || cold["stdin"] != true {
					t.Errorf("cold start: %v", cold)
				}
				if env := warm["env"].(map[string]any); env["RANK"] != fmt.Sprint(i+2) || env["MASTER_PORT"] != "29999" || env["FLEETD_ROUND"] != "4" {
					t.Errorf("rank %d: per-round variables %v", i+2, env)
				}
			}
			for i := range logs[false] {
				if logs[false][i] != logs[true][i] {
					t.Errorf("rank %d: logs differ:\ncold %q\nwarm %q", i+2, logs[false][i], logs[true][i])
				}
				if !strings.Contains(logs[true][i], "to stdout") || !strings.Contains(logs[true][i], "to stderr") {
					t.Errorf("rank %d: log %q lacks stdout or stderr", i+2, logs[true][i])
				}
			}
		})
	}
}

func TestWarmStartErrorsAreTheScripts(t *testing.T) {
	py := torchPython(t)
	src := t.TempDir()
	files := map[string]string{
		"raise.py":  "import torch\ndef f():\n    raise ValueError('boom')\nf()\n",
		"exit.py":   "import sys\nsys.exit('bye: ' + __name__)\n",
		"syntax.py": "import torch\ndef (:\n",
		// The same broken torch for the preload and the script.
		"broken/torch.py": "import os, time\ntime.sleep(float(os.environ.get('TORCH_SLEEP', '0')))\nraise ImportError('this torch is broken')\n",
		"usetorch.py":     "print('before', flush=True)\nimport torch\n",
	}
	for name, body := range files {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	broken := map[string]string{"PYTHONPATH": filepath.Join(src, "broken")}
	tests := []struct {
		name      string
		script    string
		env       map[string]string
		waitReady bool // false: hand over before the imports are done
		code      int
		want      string // in the log
		wantWarm  bool
		agentLog  string
	}{
		{name: "uncaught exception", script: "raise.py", waitReady: true, code: 1, want: "ValueError: boom", wantWarm: true},
		{name: "sys.exit message", script: "exit.py", waitReady: true, code: 1, want: "bye: __main__", wantWarm: true},
		{name: "syntax error", script: "syntax.py", waitReady: true, code: 1, want: "SyntaxError", wantWarm: true},
		{name: "missing script", script: "missing.py", waitReady: true, code: 2, want: "can't open file", wantWarm: true},
		{name: "failed import, known before the round", script: "usetorch.py", env: broken, waitReady: true, code: 1,
			want: "ImportError: this torch is broken", agentLog: "warm start unavailable"},
		{name: "failed import, after the handoff", script: "usetorch.py", env: map[string]string{"PYTHONPATH": broken["PYTHONPATH"], "TORCH_SLEEP": "1.5"},
			code: 1, want: "ImportError: this torch is broken", wantWarm: true, agentLog: "warm start unavailable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			a := rendezvous.Assignment{Round: 1, RunID: "r", LocalWorldSize: 1, WorldSize: 1, MasterAddr: "127.0.0.1", MasterPort: 29998}
			got := map[bool]string{}
			for _, warm := range []bool{false, true} {
				tc := TrainingConfig{Command: []string{py, tt.script}, Workdir: src, NprocPerNode: 1, Env: tt.env, WarmStart: &warm}
				s, alog := testSupervisor(t, root)
				s.prepareWarm(tc)
				if tt.waitReady {
					s.waitWarm(nil, 60*time.Second)
				}
				ws, l := runRound(t, s, a, tc)
				w := ws[0]
				if w.status.Code != tt.code || w.status.Err != nil || w.status.Signal != 0 {
					t.Errorf("warm=%v: %s, want exit %d; log:\n%s", warm, w.status, tt.code, l[0])
				}
				if !strings.Contains(l[0], tt.want) {
					t.Errorf("warm=%v: log lacks %q:\n%s", warm, tt.want, l[0])
				}
				if warm {
					if w.warm != tt.wantWarm {
						t.Errorf("started warm=%v, want %v", w.warm, tt.wantWarm)
					}
					if tt.agentLog != "" {
						waitFor(t, 30*time.Second, "the agent's log line", func() bool { return strings.Contains(alog.String(), tt.agentLog) })
					}
				}
				got[warm] = l[0]
				if err := os.RemoveAll(s.logDir); err != nil {
					t.Fatal(err)
				}
			}
			if got[false] != got[true] {
				t.Errorf("output differs:\ncold %q\nwarm %q", got[false], got[true])
			}
		})
	}
}

// warmSlots is a copy of local rank lr's warm interpreters.
func warmSlots(s *supervisor, lr int) []*warmProc {
	s.warm.mu.Lock()
	defer s.warm.mu.Unlock()
	return slices.Clone(s.warm.slots[lr])
}

func waitReaped(t *testing.T, what string, procs ...*warmProc) {
	t.Helper()
	for _, wp := range procs {
		select {
		case <-wp.p.done:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: interpreter %d is still alive", what, wp.p.pid)
		}
	}
}

func TestWarmInterpretersAreReplacedAndCleanedUp(t *testing.T) {
	py := torchPython(t)
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "ok.py"), []byte("import os\nprint(os.getpid())\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, _ := testSupervisor(t, t.TempDir())
	tc := TrainingConfig{Command: []string{py, "ok.py"}, Workdir: src, NprocPerNode: 1}
	a := rendezvous.Assignment{Round: 1, LocalWorldSize: 1, WorldSize: 1, MasterAddr: "127.0.0.1", MasterPort: 29997}
	s.prepareWarm(tc)
	if got := warmSlots(s, 0); len(got) != 1 {
		t.Fatalf("%d interpreters started at once, want 1 (the second starts once the first is ready)", len(got))
	}
	// The second interpreter starts when the first is ready.
	waitFor(t, 60*time.Second, "two ready interpreters", func() bool {
		got := warmSlots(s, 0)
		return len(got) == warmPerRank && got[0].isReady() && got[1].isReady()
	})
	before := warmSlots(s, 0)
	ws, _ := runRound(t, s, a, tc)
	if !ws[0].warm || ws[0].pid != before[0].p.pid {
		t.Fatalf("round 1 worker pid %d warm=%v, want the oldest warm interpreter %d", ws[0].pid, ws[0].warm, before[0].p.pid)
	}
	s.prepareWarm(tc) // what the agent does after every start
	after := warmSlots(s, 0)
	if len(after) != 2 || after[0] != before[1] || after[1] == before[1] {
		t.Fatalf("after a start: %v, want the spare %p and a new one", after, before[1])
	}
	// A changed spec replaces them; turning warm starts off removes them.
	tc.Env = map[string]string{"X": "1"}
	s.prepareWarm(tc)
	changed := warmSlots(s, 0)
	if len(changed) != 1 || slices.Contains(after, changed[0]) {
		t.Fatalf("after a spec change: %v", changed)
	}
	waitReaped(t, "stale", after...)
	off := false
	tc.WarmStart = &off
	s.prepareWarm(tc)
	if got := warmSlots(s, 0); len(got) != 0 {
		t.Fatalf("warm starts off, interpreters %v", got)
	}
	waitReaped(t, "warm starts off", changed...)
	tc.WarmStart = nil
	s.prepareWarm(tc)
	last := warmSlots(s, 0)
	s.closeWarm("test")
	for _, wp := range last {
		if !wp.p.exited() {
			t.Fatal("closeWarm returned with an interpreter alive")
		}
	}
}

// agentLogLines returns the agent's log lines with msg.
func agentLogLines(t *testing.T, a *testAgent, msg string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(a.paths().LogFile)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for line := range strings.Lines(string(b)) {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// TestWarmWorkersWaitForTheMasterStore: after a restart, the other node's
// warm workers start once the master reported its store listening (not
// before, when their first connect would be refused).
func TestWarmWorkersWaitForTheMasterStore(t *testing.T) {
	py := torchPython(t)
	addrs := loopbackAddrs(t, 2)
	dir, ckpt := t.TempDir(), t.TempDir()
	script := filepath.Join(dir, "flaky.py")
	if err := os.WriteFile(script, []byte(flakyScript), 0o644); err != nil {
		t.Fatal(err)
	}
	// The failure comes once the spare interpreters imported torch, so
	// that the master's round-2 worker starts warm and listens at once.
	tc := flakyJob(t, py, script, ckpt, 1, map[string]string{"FAIL_AFTER": "8"})
	d := newFakeDaemon(t, rdzvConfig(t, 2, 2), tc)
	// The wait is long here so that a slow (loaded CI) master still
	// reports within it: the test is about waiting for the report, not
	// about the default 1 s bound.
	slowMaster := func(o *Options) { o.MasterListenWait = 20 * time.Second }
	agents := []*testAgent{startAgent(t, d, "a", addrs[0], slowMaster), startAgent(t, d, "b", addrs[1], slowMaster)}
	waitAll(t, 90*time.Second, agents...)
	wantDone(t, d, true)
	st, err := d.service().Status(testFleet)
	if err != nil {
		t.Fatal(err)
	}
	master, other := agents[0], agents[1]
	if st.Members[0].NodeID == "b" {
		master, other = agents[1], agents[0]
	}
	listens := map[float64]bool{}
	for _, l := range agentLogLines(t, master, "the master's store listens") {
		listens[l["round"].(float64)] = true
	}
	if !listens[1] || !listens[2] {
		t.Errorf("master %s reported its store in rounds %v, want 1 and 2", master.id, listens)
	}
	var waited []map[string]any
	for _, l := range agentLogLines(t, other, "waited for the master's store") {
		if l["round"].(float64) == 2 {
			waited = append(waited, l)
		}
	}
	if len(waited) != 1 || waited[0]["reason"] != "the master's store listens" {
		t.Errorf("%s in round 2: %v, want one start after the master's report", other.id, waited)
	}
	for _, l := range agentLogLines(t, other, "worker started") {
		if l["round"].(float64) == 2 && l["warm"] != true {
			t.Errorf("round 2 worker of %s started cold: %v", other.id, l)
		}
	}
}

func TestPortListening(t *testing.T) {
	for _, network := range []string{"tcp4", "tcp6"} {
		t.Run(network, func(t *testing.T) {
			addr := "127.0.0.1:0"
			if network == "tcp6" {
				addr = "[::1]:0"
			}
			ln, err := net.Listen(network, addr)
			if err != nil {
				t.Skipf("%s: %v", network, err)
			}
			port := ln.Addr().(*net.TCPAddr).Port
			if !portListening(port) {
				t.Fatalf("port %d listens, not seen", port)
			}
			// An established connection on the port is not a listener.
			c, err := net.Dial(network, ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ln.Close()
			if portListening(port) {
				t.Fatalf("port %d seen listening after the listener closed", port)
			}
		})
	}
}

func BenchmarkPortListening(b *testing.B) {
	for b.Loop() {
		portListening(1)
	}
}
