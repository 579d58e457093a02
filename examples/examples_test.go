package examples

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleetd/internal/freeport"
	"github.com/fleetd/fleetd/internal/testutil"
)

// event is one JSON line a script prints; fields not in a given event stay zero.
type event struct {
	Event         string    `json:"event"`
	Step          int       `json:"step"`
	WorldSize     int       `json:"world_size"`
	Rank          int       `json:"rank"`
	Loss          *float64  `json:"loss"`
	Weights       []float64 `json:"weights"`
	Bias          float64   `json:"bias"`
	ParamsSHA     string    `json:"params_sha256"`
	Reason        string    `json:"reason"`
	ExitCode      int       `json:"exit_code"`
	Already       bool      `json:"already"`
	FromWorldSize int       `json:"from_world_size"`
	Local         bool      `json:"local"`
	RunID         string    `json:"run_id"`
	RestartCount  int       `json:"restart_count"`
	Error         string    `json:"error"`
	// Checkpoint on notice (notice_test.go).
	Time         float64      `json:"time"`
	Request      *stopRequest `json:"request"`
	ExpectedStep *int         `json:"expected_step"`
	Message      string       `json:"message"`
}

// torchrun -t tees worker output with a "[default0]:" prefix.
var teePrefix = regexp.MustCompile(`^\[[^\]]*\]:`)

// proc is one real worker (or torchrun) process in its own process group,
// the way the agent runs workers.
type proc struct {
	name string
	cmd  *exec.Cmd

	mu     sync.Mutex
	events []event
	out    []string
	stderr bytes.Buffer
	done   chan struct{}
	code   int
}

func start(t *testing.T, name string, env []string, argv ...string) *proc {
	t.Helper()
	p := &proc{name: name, done: make(chan struct{})}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Env = env
	p.cmd.Stderr = &lockedWriter{mu: &p.mu, w: &p.stderr}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			line := teePrefix.ReplaceAllString(sc.Text(), "")
			var ev event
			ok := strings.HasPrefix(line, "{") && json.Unmarshal([]byte(line), &ev) == nil && ev.Event != ""
			p.mu.Lock()
			p.out = append(p.out, line)
			if ok {
				p.events = append(p.events, ev)
			}
			p.mu.Unlock()
		}
		_ = p.cmd.Wait()
		p.mu.Lock()
		p.code = p.cmd.ProcessState.ExitCode()
		p.mu.Unlock()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
		if t.Failed() {
			p.dump(t)
		}
	})
	return p
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

func (p *proc) dump(t *testing.T) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.out
	if len(out) > 15 {
		out = out[len(out)-15:]
	}
	errText := p.stderr.String()
	if len(errText) > 3000 {
		errText = errText[len(errText)-3000:]
	}
	t.Logf("--- %s stdout (tail):\n%s\n--- %s stderr (tail):\n%s", p.name, strings.Join(out, "\n"), p.name, errText)
}

func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(-p.cmd.Process.Pid, sig); err != nil {
		t.Fatalf("signal %s: %v", p.name, err)
	}
}

// wait returns the exit code, failing the test if the process is still
// running after d.
func (p *proc) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		t.Fatalf("%s still running after %v", p.name, d)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.code
}

func (p *proc) snapshot() []event {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.events)
}

// waitFor polls until an event matches, the process exits or d passes.
func (p *proc) waitFor(t *testing.T, d time.Duration, what string, match func(event) bool) event {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		for _, ev := range p.snapshot() {
			if match(ev) {
				return ev
			}
		}
		select {
		case <-p.done:
			for _, ev := range p.snapshot() { // lines read just before exit
				if match(ev) {
					return ev
				}
			}
			t.Fatalf("%s exited (code %d) before %s", p.name, p.code, what)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no %s within %v", p.name, what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *proc) all(kind string) []event {
	var r []event
	for _, ev := range p.snapshot() {
		if ev.Event == kind {
			r = append(r, ev)
		}
	}
	return r
}

func (p *proc) last(t *testing.T, kind string) event {
	t.Helper()
	evs := p.all(kind)
	if len(evs) == 0 {
		t.Fatalf("%s printed no %q event", p.name, kind)
	}
	return evs[len(evs)-1]
}

func freePort(t *testing.T) int {
	t.Helper()
	p, err := freeport.Pick()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// contractVar reports whether an inherited variable belongs to the worker
// contract and so must come from the test, never from the test's own env.
func contractVar(kv string) bool {
	k, _, _ := strings.Cut(kv, "=")
	switch k {
	case "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
		"ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS":
		return true
	}
	for _, p := range []string{"TORCHELASTIC_", "FLEETD_", "TRAIN_", "PET_"} {
		if strings.HasPrefix(k, p) {
			return true
		}
	}
	return false
}

func baseEnv() []string {
	env := slices.DeleteFunc(os.Environ(), contractVar)
	return append(env, "OMP_NUM_THREADS=1", "PYTHONUNBUFFERED=1")
}

// round describes one rendezvous round of workers on a single node, with
// exactly the variables fleetd's agent sets.
type round struct {
	world     int
	port      int
	restart   int
	ckpt      string // FLEETD_CHECKPOINT_URI
	drainDir  string // FLEETD_DRAIN_FILE is drainDir/drain-<rank>.json
	errorDir  string // TORCHELASTIC_ERROR_FILE is errorDir/<rank>/error.json
	runID     string
	extraEnv  []string
	extraArgs []string
}

func (r round) env(rank int) []string {
	env := append(baseEnv(),
		"RANK="+strconv.Itoa(rank), "LOCAL_RANK="+strconv.Itoa(rank),
		"WORLD_SIZE="+strconv.Itoa(r.world), "LOCAL_WORLD_SIZE="+strconv.Itoa(r.world),
		"GROUP_RANK=0", "GROUP_WORLD_SIZE=1",
		"ROLE_NAME=default", "ROLE_RANK="+strconv.Itoa(rank), "ROLE_WORLD_SIZE="+strconv.Itoa(r.world),
		"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(r.port),
		"TORCHELASTIC_RESTART_COUNT="+strconv.Itoa(r.restart), "TORCHELASTIC_MAX_RESTARTS=3",
		"TORCHELASTIC_RUN_ID="+r.runID, "TORCHELASTIC_USE_AGENT_STORE=False",
		"FLEETD_FLEET=examples-test", "FLEETD_NODE_ID=node-0",
		"FLEETD_CHECKPOINT_URI="+r.ckpt,
	)
	if r.drainDir != "" {
		env = append(env, "FLEETD_DRAIN_FILE="+filepath.Join(r.drainDir, fmt.Sprintf("drain-%d.json", rank)))
	}
	if r.errorDir != "" {
		env = append(env, "TORCHELASTIC_ERROR_FILE="+filepath.Join(r.errorDir, strconv.Itoa(rank), "error.json"))
	}
	return append(env, r.extraEnv...)
}

func (r round) start(t *testing.T, python, script string) []*proc {
	t.Helper()
	ps := make([]*proc, r.world)
	for rank := range ps {
		argv := append([]string{python, "-u", script}, r.extraArgs...)
		ps[rank] = start(t, fmt.Sprintf("rank %d (world %d)", rank, r.world), r.env(rank), argv...)
	}
	return ps
}

func script(t *testing.T, rel string) string {
	t.Helper()
	p, err := filepath.Abs(rel)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func stdPython(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 on PATH: the example trainer needs any Python 3")
	}
	return p
}

var torchCheck = sync.OnceValue(func() error {
	out, err := exec.Command("/usr/bin/python3", "-c", "import torch, torch.distributed as d; assert d.is_available()").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, bytes.TrimSpace(out))
	}
	return nil
})

func torchPython(t *testing.T) string {
	t.Helper()
	if err := torchCheck(); err != nil {
		t.Skipf("PyTorch is not importable by /usr/bin/python3 (install Debian's python3-torch; CI does): %v", err)
	}
	return "/usr/bin/python3"
}

type trainerCkpt struct {
	Format    string    `json:"format"`
	Step      int       `json:"step"`
	Weights   []float64 `json:"weights"`
	Bias      float64   `json:"bias"`
	WorldSize int       `json:"world_size"`
}

func readTrainerCkpt(t *testing.T, dir string) trainerCkpt {
	t.Helper()
	return testutil.ReadJSON[trainerCkpt](t, filepath.Join(dir, "checkpoint.json"))
}

func waitAll(t *testing.T, ps []*proc, d time.Duration) []int {
	t.Helper()
	codes := make([]int, len(ps))
	deadline := time.Now().Add(d)
	for i, p := range ps {
		codes[i] = p.wait(t, time.Until(deadline))
	}
	return codes
}

// checkSteps asserts each rank printed consecutive steps from..to at world size w.
func checkSteps(t *testing.T, p *proc, from, to, w int) {
	t.Helper()
	steps := p.all("step")
	if len(steps) != to-from+1 {
		t.Fatalf("%s printed %d steps, want %d..%d", p.name, len(steps), from, to)
	}
	for i, ev := range steps {
		if ev.Step != from+i || ev.WorldSize != w {
			t.Fatalf("%s step line %d = step %d world %d, want step %d world %d", p.name, i, ev.Step, ev.WorldSize, from+i, w)
		}
	}
}

// checkSameTrainerWeights asserts every rank ended with bit-identical
// weights and returns them.
func checkSameTrainerWeights(t *testing.T, ps []*proc, step int) event {
	t.Helper()
	d0 := ps[0].last(t, "done")
	for _, p := range ps {
		d := p.last(t, "done")
		if d.Step != step {
			t.Errorf("%s done at step %d, want %d", p.name, d.Step, step)
		}
		if !slices.Equal(d.Weights, d0.Weights) || d.Bias != d0.Bias || len(d.Weights) == 0 {
			t.Errorf("%s weights differ from rank 0's:\n%v %v\n%v %v", p.name, d.Weights, d.Bias, d0.Weights, d0.Bias)
		}
	}
	return d0
}

func TestTrainerRunsToCompletion(t *testing.T) {
	t.Parallel()
	py, train := stdPython(t), script(t, "trainer/train.py")
	for _, world := range []int{1, 3} {
		t.Run(fmt.Sprintf("world=%d", world), func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			r := round{world: world, port: freePort(t), ckpt: dir, runID: "complete",
				extraArgs: []string{"--steps", "20", "--step-time", "0.01", "--ckpt-every", "5"}}
			ps := r.start(t, py, train)
			for i, code := range waitAll(t, ps, 30*time.Second) {
				if code != 0 {
					t.Fatalf("rank %d exited %d", i, code)
				}
			}
			for _, p := range ps {
				checkSteps(t, p, 1, 20, world)
			}
			d := checkSameTrainerWeights(t, ps, 20)
			ck := readTrainerCkpt(t, dir)
			if ck.Step != 20 || !slices.Equal(ck.Weights, d.Weights) || ck.Bias != d.Bias || ck.WorldSize != world {
				t.Fatalf("checkpoint %+v does not hold the final state %v %v", ck, d.Weights, d.Bias)
			}
			if _, err := os.Stat(filepath.Join(dir, "DONE")); err != nil {
				t.Fatalf("done marker: %v", err)
			}
			steps := ps[0].all("step")
			if first, last := *steps[0].Loss, *steps[len(steps)-1].Loss; !(last < first/10) {
				t.Fatalf("loss went from %v to %v: the model is not learning", first, last)
			}
			for _, p := range ps {
				for _, ev := range p.all("step") {
					if *ev.Loss != *steps[ev.Step-1].Loss {
						t.Fatalf("%s reports loss %v at step %d, rank 0 %v", p.name, *ev.Loss, ev.Step, *steps[ev.Step-1].Loss)
					}
				}
			}

			// A new round after the run finished exits 0 at once: the agent
			// sees success, not a crash loop.
			r2 := round{world: 2, port: freePort(t), restart: 1, ckpt: "file://" + dir, runID: "complete",
				extraArgs: []string{"--steps", "20", "--step-time", "0.01"}}
			ps2 := r2.start(t, py, train)
			for i, code := range waitAll(t, ps2, 30*time.Second) {
				if code != 0 {
					t.Fatalf("rerun rank %d exited %d", i, code)
				}
				if d := ps2[i].last(t, "done"); !d.Already || d.Step != 20 || len(ps2[i].all("step")) != 0 {
					t.Fatalf("rerun rank %d: done %+v after %d steps, want already done at 20", i, d, len(ps2[i].all("step")))
				}
			}
		})
	}
}

func TestTrainerPeerLossThenResumeSmaller(t *testing.T) {
	t.Parallel()
	py, train := stdPython(t), script(t, "trainer/train.py")
	dir, errDir := t.TempDir(), t.TempDir()
	const steps = 60
	// A large op timeout proves a dead peer is noticed from the closed
	// connection, not by waiting out a timer.
	args := []string{"--steps", strconv.Itoa(steps), "--step-time", "0.03", "--op-timeout", "60"}
	r := round{world: 3, port: freePort(t), ckpt: "file://" + dir, errorDir: errDir, runID: "peerloss", extraArgs: args}
	ps := r.start(t, py, train)
	ps[0].waitFor(t, 20*time.Second, "step 5", func(ev event) bool { return ev.Event == "step" && ev.Step >= 5 })

	ps[2].signal(t, syscall.SIGKILL)
	killed := time.Now()
	for _, p := range ps[:2] {
		if code := p.wait(t, 6*time.Second); code != 3 {
			t.Fatalf("%s exited %d after its peer died, want 3 (peer lost)", p.name, code)
		}
		if e := p.last(t, "error"); e.ExitCode != 3 {
			t.Fatalf("%s error event %+v", p.name, e)
		}
	}
	t.Logf("survivors exited %v after the kill", time.Since(killed).Round(time.Millisecond))
	var ef struct {
		Message struct {
			Message string `json:"message"`
		} `json:"message"`
	}
	if b, err := os.ReadFile(filepath.Join(errDir, "1", "error.json")); err != nil || json.Unmarshal(b, &ef) != nil ||
		!strings.Contains(ef.Message.Message, "PeerLost") {
		t.Fatalf("rank 1 error file: %v %s", err, b)
	}
	ck := readTrainerCkpt(t, dir)
	if last := ps[0].last(t, "step").Step; ck.Step != last || ck.Step < 5 {
		t.Fatalf("checkpoint at step %d, rank 0 completed step %d", ck.Step, last)
	}

	// The next round has two workers and continues from the checkpoint.
	r2 := round{world: 2, port: freePort(t), restart: 1, ckpt: dir, runID: "peerloss", extraArgs: args}
	ps2 := r2.start(t, py, train)
	for i, code := range waitAll(t, ps2, 30*time.Second) {
		if code != 0 {
			t.Fatalf("resumed rank %d exited %d", i, code)
		}
	}
	for _, p := range ps2 {
		if rs := p.last(t, "resume"); rs.Step != ck.Step || rs.FromWorldSize != 3 {
			t.Fatalf("%s resumed %+v, want step %d from world size 3", p.name, rs, ck.Step)
		}
		checkSteps(t, p, ck.Step+1, steps, 2)
	}
	checkSameTrainerWeights(t, ps2, steps)
	if _, err := os.Stat(filepath.Join(dir, "DONE")); err != nil {
		t.Fatalf("done marker: %v", err)
	}
}

func TestTrainerSIGTERM(t *testing.T) {
	t.Parallel()
	py, train := stdPython(t), script(t, "trainer/train.py")
	tests := []struct {
		name      string
		signalled []int
		wantCodes []int
	}{
		// The agent stops every worker: all leave cleanly at the same step.
		{"all ranks", []int{0, 1}, []int{0, 0}},
		// Only one was told to stop: the other must not look finished.
		{"rank 1 only", []int{1}, []int{3, 0}},
		{"rank 0 only", []int{0}, []int{0, 3}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			// --ckpt-every is huge so the checkpoint can only come from the stop path.
			r := round{world: 2, port: freePort(t), ckpt: dir, runID: "term",
				extraArgs: []string{"--steps", "100000", "--step-time", "0.03", "--ckpt-every", "100000"}}
			ps := r.start(t, py, train)
			ps[0].waitFor(t, 20*time.Second, "step 3", func(ev event) bool { return ev.Event == "step" && ev.Step >= 3 })
			for _, i := range tc.signalled {
				ps[i].signal(t, syscall.SIGTERM)
			}
			for i, code := range waitAll(t, ps, 8*time.Second) {
				if code != tc.wantCodes[i] {
					t.Fatalf("rank %d exited %d, want %d", i, code, tc.wantCodes[i])
				}
			}
			ck := readTrainerCkpt(t, dir)
			s0, s1 := ps[0].last(t, "step"), ps[1].last(t, "step")
			if ck.Step != s0.Step || s0.Step != s1.Step {
				t.Fatalf("checkpoint at step %d; ranks stopped after steps %d and %d", ck.Step, s0.Step, s1.Step)
			}
			for _, i := range tc.signalled {
				if st := ps[i].last(t, "stop"); st.Step != ck.Step {
					t.Fatalf("rank %d stop event %+v", i, st)
				}
			}
		})
	}
}

func TestTrainerDrainFile(t *testing.T) {
	t.Parallel()
	py, train := stdPython(t), script(t, "trainer/train.py")
	dir, drains := t.TempDir(), t.TempDir()
	r := round{world: 2, port: freePort(t), ckpt: dir, drainDir: drains, runID: "drain",
		extraArgs: []string{"--steps", "100000", "--step-time", "0.03", "--ckpt-every", "100000"}}
	ps := r.start(t, py, train)
	ps[0].waitFor(t, 20*time.Second, "step 3", func(ev event) bool { return ev.Event == "step" && ev.Step >= 3 })

	// Only rank 1's node got the notice; rank 0 is the one that must save.
	notice := fmt.Sprintf(`{"deadline":%q,"reason":"spot interruption"}`, time.Now().Add(2*time.Minute).UTC().Format(time.RFC3339))
	tmp := filepath.Join(drains, ".tmp")
	if err := os.WriteFile(tmp, []byte(notice), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(drains, "drain-1.json")); err != nil {
		t.Fatal(err)
	}
	saved := ps[0].waitFor(t, 5*time.Second, "drain checkpoint", func(ev event) bool { return ev.Event == "checkpoint" && ev.Reason == "drain" })
	for i, p := range ps {
		d := p.waitFor(t, 5*time.Second, "drain event", func(ev event) bool { return ev.Event == "drain" })
		if d.Step != saved.Step || d.Local != (i == 1) {
			t.Fatalf("%s drain event %+v, checkpoint at %d", p.name, d, saved.Step)
		}
	}
	if ck := readTrainerCkpt(t, dir); ck.Step < saved.Step {
		t.Fatalf("checkpoint step %d < drain step %d", ck.Step, saved.Step)
	}
	// Training goes on until the agent's SIGTERM.
	ps[1].waitFor(t, 5*time.Second, "a step after the drain", func(ev event) bool { return ev.Event == "step" && ev.Step >= saved.Step+3 })
	for _, p := range ps {
		p.signal(t, syscall.SIGTERM)
	}
	for i, code := range waitAll(t, ps, 8*time.Second) {
		if code != 0 {
			t.Fatalf("rank %d exited %d after SIGTERM", i, code)
		}
	}
	if n := len(ps[0].all("drain")); n != 1 {
		t.Fatalf("rank 0 reported the drain %d times", n)
	}
}

// TestTrainerBusyMasterPort: the previous round's rank 0 (here, a listener
// that accepts nothing) still holds MASTER_PORT when the new round starts.
// Rank 0 must retry the bind and rank 1 must give up on the silent listener
// and dial again, instead of failing the round or hanging.
func TestTrainerBusyMasterPort(t *testing.T) {
	t.Parallel()
	py, train := stdPython(t), script(t, "trainer/train.py")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	release := time.AfterFunc(1500*time.Millisecond, func() { l.Close() })
	t.Cleanup(func() { release.Stop(); l.Close() })
	r := round{world: 2, port: l.Addr().(*net.TCPAddr).Port, ckpt: t.TempDir(), runID: "busy",
		extraArgs: []string{"--steps", "5", "--step-time", "0", "--bind-retry", "10", "--connect-timeout", "20"}}
	ps := r.start(t, py, train)
	for i, code := range waitAll(t, ps, 20*time.Second) {
		if code != 0 {
			t.Fatalf("rank %d exited %d", i, code)
		}
	}
	checkSameTrainerWeights(t, ps, 5)
}

func TestTrainerRejectsBadSetup(t *testing.T) {
	t.Parallel()
	py, train := stdPython(t), script(t, "trainer/train.py")
	badCkpt := t.TempDir()
	if err := os.WriteFile(filepath.Join(badCkpt, "checkpoint.json"),
		[]byte(`{"format":"fleetd-example-trainer/1","step":3,"weights":[1,2],"bias":0}`), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		env      []string
		args     []string
		wantCode int
		wantErr  string
	}{
		{"object storage URI", []string{"FLEETD_CHECKPOINT_URI=s3://bucket/run"}, nil, 2, "only writes local paths"},
		{"relative file URL", []string{"FLEETD_CHECKPOINT_URI=file://ckpt"}, nil, 2, "absolute path"},
		{"rank outside world", []string{"RANK=2", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=1"}, nil, 2, "outside WORLD_SIZE"},
		{"no master port", []string{"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1"}, nil, 2, "MASTER_PORT is required"},
		{"bad world size", []string{"RANK=0", "WORLD_SIZE=two"}, nil, 2, "not an integer"},
		{"checkpoint of another model", []string{"FLEETD_CHECKPOINT_URI=" + badCkpt}, []string{"--dim", "16"}, 2, "has 2 weights"},
		// The group never forms: fail in bounded time, as a peer problem.
		{"rank 0 alone", []string{"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", fmt.Sprintf("MASTER_PORT=%d", freePort(t))},
			[]string{"--connect-timeout", "1"}, 3, "waiting for ranks [1]"},
		{"no rank 0", []string{"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", fmt.Sprintf("MASTER_PORT=%d", freePort(t))},
			[]string{"--connect-timeout", "1"}, 3, "connecting to rank 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			errFile := filepath.Join(t.TempDir(), "error.json")
			env := append(baseEnv(), "TORCHELASTIC_ERROR_FILE="+errFile)
			p := start(t, tc.name, append(env, tc.env...), append([]string{py, "-u", train, "--steps", "3", "--step-time", "0"}, tc.args...)...)
			if code := p.wait(t, 15*time.Second); code != tc.wantCode {
				t.Fatalf("exit %d, want %d", code, tc.wantCode)
			}
			if e := p.last(t, "error"); !strings.Contains(e.Error, tc.wantErr) || e.ExitCode != tc.wantCode {
				t.Fatalf("error event %+v, want %q", e, tc.wantErr)
			}
			if b, err := os.ReadFile(errFile); err != nil || !bytes.Contains(b, []byte(`"py_callstack"`)) {
				t.Fatalf("error file: %v %s", err, b)
			}
		})
	}
}

func TestDDPPeerLossStopAndResume(t *testing.T) {
	py, ddp := torchPython(t), script(t, "pytorch/ddp_train.py")
	dir := t.TempDir()
	const steps = 40
	// The process-group timeout is long on purpose: a killed peer must be
	// noticed from the closed connection, well before it.
	args := []string{"--steps", strconv.Itoa(steps), "--step-time", "0.05", "--timeout", "60"}
	ckptStep := func(p *proc) int { return p.last(t, "checkpoint").Step }

	// Round 0: three workers; one dies.
	r := round{world: 3, port: freePort(t), ckpt: dir, runID: "ddp", extraArgs: args}
	ps := r.start(t, py, ddp)
	ps[0].waitFor(t, 60*time.Second, "step 3", func(ev event) bool { return ev.Event == "step" && ev.Step >= 3 })
	ps[2].signal(t, syscall.SIGKILL)
	for _, p := range ps[:2] {
		if code := p.wait(t, 10*time.Second); code != 3 {
			t.Fatalf("%s exited %d after its peer died, want 3", p.name, code)
		}
	}
	s1 := ckptStep(ps[0])
	if last := ps[0].last(t, "step").Step; s1 != last {
		t.Fatalf("rank 0 checkpointed step %d but completed %d", s1, last)
	}

	// Round 1: two workers resume, then the agent stops them (SIGTERM).
	r1 := round{world: 2, port: freePort(t), restart: 1, ckpt: "file://" + dir, runID: "ddp", extraArgs: args}
	ps1 := r1.start(t, py, ddp)
	for _, p := range ps1 {
		if rs := p.waitFor(t, 60*time.Second, "resume", func(ev event) bool { return ev.Event == "resume" }); rs.Step != s1 || rs.FromWorldSize != 3 {
			t.Fatalf("%s resumed %+v, want step %d from world size 3", p.name, rs, s1)
		}
	}
	ps1[0].waitFor(t, 30*time.Second, "two more steps", func(ev event) bool { return ev.Event == "step" && ev.Step >= s1+2 })
	for _, p := range ps1 {
		p.signal(t, syscall.SIGTERM)
	}
	for i, code := range waitAll(t, ps1, 10*time.Second) {
		if code != 0 {
			t.Fatalf("round 1 rank %d exited %d after SIGTERM, want 0", i, code)
		}
	}
	s2 := ckptStep(ps1[0])
	if a, b := ps1[0].last(t, "step").Step, ps1[1].last(t, "step").Step; s2 != a || a != b || s2 <= s1 {
		t.Fatalf("checkpoint at %d; ranks stopped after %d and %d (resumed at %d)", s2, a, b, s1)
	}
	for _, p := range ps1 {
		checkSteps(t, p, s1+1, s2, 2)
		if st := p.last(t, "stop"); st.Step != s2 || s2 >= steps {
			t.Fatalf("%s stop event %+v; the run must stop early at the checkpointed step %d", p.name, st, s2)
		}
	}

	// Round 2: two workers again finish the run from the SIGTERM checkpoint.
	r2 := round{world: 2, port: freePort(t), restart: 2, ckpt: dir, runID: "ddp", extraArgs: args}
	ps2 := r2.start(t, py, ddp)
	for i, code := range waitAll(t, ps2, 60*time.Second) {
		if code != 0 {
			t.Fatalf("round 2 rank %d exited %d", i, code)
		}
	}
	d0 := ps2[0].last(t, "done")
	for _, p := range ps2 {
		if rs := p.last(t, "resume"); rs.Step != s2 {
			t.Fatalf("%s resumed at %d, want %d", p.name, rs.Step, s2)
		}
		checkSteps(t, p, s2+1, steps, 2)
		if d := p.last(t, "done"); d.Step != steps || d.ParamsSHA != d0.ParamsSHA || d.ParamsSHA == "" {
			t.Fatalf("%s done %+v; rank 0 %+v", p.name, d, d0)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "DONE")); err != nil {
		t.Fatalf("done marker: %v", err)
	}
}

// TestUnderTorchrun runs the scripts under the real torchrun 1.13: the
// reference that they honour torchrun's worker contract, which fleetd's
// agent reproduces.
func TestUnderTorchrun(t *testing.T) {
	py := torchPython(t)
	tests := []struct {
		script string
		same   func(a, b event) bool // did both ranks end with the same model?
	}{
		{"pytorch/ddp_train.py", func(a, b event) bool { return a.ParamsSHA != "" && a.ParamsSHA == b.ParamsSHA }},
		{"trainer/train.py", func(a, b event) bool { return len(a.Weights) > 0 && slices.Equal(a.Weights, b.Weights) }},
	}
	for _, tc := range tests {
		t.Run(filepath.Base(tc.script), func(t *testing.T) {
			dir := t.TempDir()
			// Debian's torchrun 1.13 crashes on Python 3.11 unless -r/-t are
			// given; 1.13 spells its flags with underscores.
			argv := []string{py, "-m", "torch.distributed.run", "-r", "1", "-t", "1",
				"--nnodes=1", "--nproc_per_node=2", "--monitor_interval=1", "--rdzv_backend=c10d",
				fmt.Sprintf("--rdzv_endpoint=127.0.0.1:%d", freePort(t)), "--rdzv_id=examples-test",
				"--log_dir=" + filepath.Join(t.TempDir(), "logs"),
				script(t, tc.script), "--steps", "10", "--step-time", "0", "--ckpt", dir}
			p := start(t, "torchrun", baseEnv(), argv...)
			if code := p.wait(t, 60*time.Second); code != 0 {
				t.Fatalf("torchrun exited %d", code)
			}
			done := map[int]event{}
			for _, ev := range p.all("done") {
				done[ev.Rank] = ev
			}
			starts := p.all("start")
			if len(done) != 2 || len(starts) != 2 {
				t.Fatalf("want 2 workers started and done, got %d and %d", len(starts), len(done))
			}
			for _, s := range starts {
				if s.RunID != "examples-test" || s.WorldSize != 2 || s.RestartCount != 0 {
					t.Fatalf("worker saw %+v, not torchrun's environment", s)
				}
			}
			if done[0].Step != 10 || done[1].Step != 10 || !tc.same(done[0], done[1]) {
				t.Fatalf("done events %+v %+v", done[0], done[1])
			}
			if _, err := os.Stat(filepath.Join(dir, "DONE")); err != nil {
				t.Fatalf("done marker: %v", err)
			}
		})
	}
}
