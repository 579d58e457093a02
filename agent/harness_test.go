package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleetd/agentwire"
	"github.com/fleetd/fleetd/internal/freeport"
	"github.com/fleetd/fleetd/internal/procstat"
	"github.com/fleetd/fleetd/internal/testutil"
	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/rendezvous"
)

// This file is the test harness of the elastic agent: a fake of the
// daemon's agent API around a real rendezvous.Service and its HTTP
// handler, and agents run in-process with agent.Run, each on its own
// 127.0.0.x address, supervising real worker processes.

const testFleet = "job"

// repoRoot locates the module root from this file's path.
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the test file")
	}
	return filepath.Dir(filepath.Dir(file))
}

func needPython(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not on PATH; the agent tests run real trainer processes")
	}
	return p
}

// loopbackAddrs returns n usable addresses 127.0.0.2, .3, …, skipping the
// test if the kernel refuses to bind them (not every OS routes 127/8).
func loopbackAddrs(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	for i := range n {
		a := fmt.Sprintf("127.0.0.%d", i+2)
		ln, err := net.Listen("tcp", a+":0")
		if err != nil {
			t.Skipf("cannot bind %s (%v): this system does not route all of 127.0.0.0/8", a, err)
		}
		ln.Close()
		out = append(out, a)
	}
	return out
}

// freePort returns the first of rendezvous.MasterPortSpan consecutive TCP
// ports (MASTER_PORT cycles through them round by round) that were free
// on every address just now.
func freePort(t *testing.T) int {
	t.Helper()
	p, err := freeport.Span(rendezvous.MasterPortSpan)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type doneReport struct {
	node string
	req  doneRequest
}

// fakeDaemon serves /v1/agent/{fleet}/{node}/{register,notice,logs,done}
// and a real rendezvous under /v1/rendezvous/. stop and start simulate a
// daemon restart: the rendezvous is restored from its store, on the same
// address.
type fakeDaemon struct {
	t     *testing.T
	cfg   rendezvous.Config
	tc    TrainingConfig
	store *rendezvous.MemoryStore
	addr  string

	mu        sync.Mutex
	svc       *rendezvous.Service
	srv       *http.Server
	registers map[string]int
	notices   []noticeRequest
	logLines  map[string]int
	dones     []doneReport
	drained   []drainedReport
	events    []string // the rendezvous' event log, for failure dumps
	stagings  []doneStaging
}

type doneStaging struct {
	node string
	r    agentwire.StagingReport
}

func newFakeDaemon(t *testing.T, cfg rendezvous.Config, tc TrainingConfig) *fakeDaemon {
	t.Helper()
	d := &fakeDaemon{t: t, cfg: cfg, tc: tc, store: rendezvous.NewMemoryStore(), addr: "127.0.0.1:0",
		registers: map[string]int{}, logLines: map[string]int{}}
	d.start()
	t.Cleanup(func() {
		d.stop()
		if t.Failed() {
			d.mu.Lock()
			t.Logf("--- rendezvous events:\n%s", strings.Join(d.events, "\n"))
			d.mu.Unlock()
		}
	})
	return d
}

func (d *fakeDaemon) url() string { return "http://" + d.addr }

func (d *fakeDaemon) service() *rendezvous.Service {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.svc
}

func (d *fakeDaemon) authorize(r *http.Request, fleet, node string) error {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		return fmt.Errorf("%w: missing bearer token", rendezvous.ErrUnauthenticated)
	}
	if tok != "tok-"+node || fleet != testFleet {
		return fmt.Errorf("%w: token does not act for %s/%s", rendezvous.ErrForbidden, fleet, node)
	}
	return nil
}

func (d *fakeDaemon) start() {
	d.t.Helper()
	svc, err := rendezvous.NewService(context.Background(), rendezvous.Options{Store: d.store,
		OnChange: func(_ string, ev rendezvous.Event) {
			d.mu.Lock()
			d.events = append(d.events, ev.At.Format("15:04:05.000")+" "+ev.String())
			d.mu.Unlock()
		}})
	if err != nil {
		d.t.Fatal(err)
	}
	if err := svc.Configure(context.Background(), testFleet, d.cfg); err != nil {
		d.t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/rendezvous/", svc.Handler(rendezvous.AuthorizerFunc(d.authorize)))
	mux.HandleFunc("POST /v1/agent/{fleet}/{node}/{op}", d.agentAPI)
	ln, err := net.Listen("tcp", d.addr)
	if err != nil {
		d.t.Fatalf("fake daemon listen on %s: %v", d.addr, err)
	}
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	d.mu.Lock()
	d.addr, d.svc, d.srv = ln.Addr().String(), svc, srv
	d.mu.Unlock()
}

// stop closes every connection at once (in-flight long-polls included),
// like a daemon that died.
func (d *fakeDaemon) stop() {
	d.mu.Lock()
	srv, svc := d.srv, d.svc
	d.srv = nil
	d.mu.Unlock()
	if srv == nil {
		return
	}
	_ = srv.Close()
	svc.Close()
}

func (d *fakeDaemon) agentAPI(w http.ResponseWriter, r *http.Request) {
	fleet, node, op := r.PathValue("fleet"), r.PathValue("node"), r.PathValue("op")
	if err := d.authorize(r, fleet, node); err != nil {
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	bad := func(err error) { http.Error(w, err.Error(), http.StatusBadRequest) }
	// decoded reads the request into req, answering 400 when it does not
	// decode strictly, as the daemon does.
	decoded := func(req any) bool {
		if err := dec.Decode(req); err != nil {
			bad(err)
			return false
		}
		return true
	}
	switch op {
	case "register":
		var req registerRequest
		if !decoded(&req) {
			return
		}
		if net.ParseIP(req.Address) == nil {
			bad(fmt.Errorf("address %q is not an IP", req.Address))
			return
		}
		d.mu.Lock()
		d.registers[node]++
		d.mu.Unlock()
		writeTestJSON(w, registerResponse{Fleet: fleet, Node: node, Training: d.tc, RendezvousURL: d.url()})
	case "notice":
		var req noticeRequest
		if !decoded(&req) {
			return
		}
		d.mu.Lock()
		d.notices = append(d.notices, req)
		svc := d.svc
		d.mu.Unlock()
		// Like the daemon: a terminal notice excludes the node at once,
		// and the round change carries its deadline.
		if interruption.Kind(req.Kind).Terminal() {
			if err := svc.ExcludeUntil(r.Context(), fleet, node, req.Kind+" notice from "+req.Source, req.Deadline); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		w.WriteHeader(http.StatusAccepted)
	case "staging":
		var req agentwire.StagingReport
		if !decoded(&req) {
			return
		}
		d.mu.Lock()
		d.stagings = append(d.stagings, doneStaging{node, req})
		d.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	case "logs":
		var req logsRequest
		if !decoded(&req) {
			return
		}
		d.mu.Lock()
		d.logLines[node] += len(req.Lines)
		d.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	case "drained":
		var req agentwire.DrainedRequest
		if !decoded(&req) {
			return
		}
		d.mu.Lock()
		d.drained = append(d.drained, drainedReport{node, req})
		d.mu.Unlock()
		writeTestJSON(w, map[string]bool{"ended": true})
	case "done":
		var req doneRequest
		if !decoded(&req) {
			return
		}
		d.mu.Lock()
		d.dones = append(d.dones, doneReport{node: node, req: req})
		first := len(d.dones) == 1
		svc := d.svc
		d.mu.Unlock()
		if first {
			if err := svc.Finish(r.Context(), testFleet, req.Success); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		writeTestJSON(w, map[string]bool{"first": first})
	default:
		http.NotFound(w, r)
	}
}

func writeTestJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

type drainedReport struct {
	node string
	req  agentwire.DrainedRequest
}

func (d *fakeDaemon) drainedReports() []drainedReport {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.drained)
}

func (d *fakeDaemon) doneReports() []doneReport {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]doneReport(nil), d.dones...)
}

func (d *fakeDaemon) noticesSeen() []noticeRequest {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]noticeRequest(nil), d.notices...)
}

func (d *fakeDaemon) registerCount(node string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.registers[node]
}

func (d *fakeDaemon) shippedLines(node string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.logLines[node]
}

// cutTransport simulates a network partition of one node: once cut, every
// request fails at once and in-flight ones (long-polls) are aborted.
type cutTransport struct {
	base   http.RoundTripper
	ctx    context.Context
	cancel context.CancelFunc
}

func newCutTransport() *cutTransport {
	ctx, cancel := context.WithCancel(context.Background())
	return &cutTransport{base: http.DefaultTransport.(*http.Transport).Clone(), ctx: ctx, cancel: cancel}
}

func (c *cutTransport) cut() { c.cancel() }

func (c *cutTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if c.ctx.Err() != nil {
		return nil, errors.New("test: network cut")
	}
	ctx, cancel := context.WithCancel(req.Context())
	stop := context.AfterFunc(c.ctx, cancel)
	resp, err := c.base.RoundTrip(req.WithContext(ctx))
	if err != nil {
		stop()
		cancel()
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, done: func() { stop(); cancel() }}
	return resp, nil
}

type cancelOnClose struct {
	io.ReadCloser
	done func()
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.done()
	return err
}

// testAgent is one in-process agent.
type testAgent struct {
	id, addr, root string
	cfg            Config
	cancel         context.CancelFunc
	done           chan error
	result         *error
	transport      *cutTransport
}

func (a *testAgent) paths() Paths { return PathsFor(a.cfg, a.root) }

type agentOpt func(*Options)

func withCuttableNetwork(ct *cutTransport) agentOpt {
	return func(o *Options) { o.HTTPClient = &http.Client{Transport: ct} }
}

func startAgent(t *testing.T, d *fakeDaemon, id, addr string, extra ...agentOpt) *testAgent {
	t.Helper()
	cfg, err := ParseConfig(fmt.Appendf(nil, `{"fleet":%q,"node_id":%q,"daemon_url":%q,"token":%q}`, testFleet, id, d.url(), "tok-"+id))
	if err != nil {
		t.Fatal(err)
	}
	a := &testAgent{id: id, addr: addr, root: t.TempDir(), cfg: cfg, done: make(chan error, 1)}
	opts := Options{
		Config: cfg, Root: a.root, NodeAddr: addr, Stderr: io.Discard, Version: "test",
		PeerLostWindow: 10 * time.Second, RestartGrace: 3 * time.Second, DoneMarkerWait: 5 * time.Second,
		LeaveTimeout: time.Second, MaxBackoff: 500 * time.Millisecond,
	}
	for _, f := range extra {
		f(&opts)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	go func() { a.done <- Run(ctx, opts) }()
	t.Cleanup(func() { a.stop(t) })
	return a
}

// wait returns Run's result, failing the test after limit.
func (a *testAgent) wait(t *testing.T, limit time.Duration) error {
	t.Helper()
	if a.result != nil {
		return *a.result
	}
	select {
	case err := <-a.done:
		a.result = &err
		return err
	case <-time.After(limit):
		t.Fatalf("agent %s still running after %v", a.id, limit)
		return nil
	}
}

// stop cancels the agent (SIGTERM), waits for it, and makes sure no
// worker it started is left.
func (a *testAgent) stop(t *testing.T) {
	a.cancel()
	if a.result == nil {
		select {
		case err := <-a.done:
			a.result = &err
		case <-time.After(30 * time.Second):
			t.Errorf("agent %s did not stop within 30s of cancel", a.id)
		}
	}
	if t.Failed() {
		dumpAgent(t, a)
	}
	for _, ev := range a.events(t) {
		if ev.Event == "start" && ev.PID > 0 {
			if alive(ev.PID) {
				t.Errorf("agent %s left worker pid %d running", a.id, ev.PID)
				_ = syscall.Kill(-ev.PID, syscall.SIGKILL)
			}
		}
	}
}

// alive reports whether pid is a live (non-zombie) process still running
// a python worker.
func alive(pid int) bool {
	if st, err := procstat.Read(pid); err != nil || st.State == 'Z' {
		return false
	}
	cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.Contains(string(cmd), "python")
}

func dumpAgent(t *testing.T, a *testAgent) {
	p := a.paths()
	if b, err := os.ReadFile(p.LogFile); err == nil {
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) > 60 {
			lines = lines[len(lines)-60:]
		}
		t.Logf("--- agent %s log:\n%s", a.id, strings.Join(lines, "\n"))
	}
	files, _ := filepath.Glob(filepath.Join(p.LogDir, "round-*", "rank-*.log"))
	for _, f := range files {
		b, _ := os.ReadFile(f)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) > 8 {
			lines = append(lines[:3], append([]string{"…"}, lines[len(lines)-5:]...)...)
		}
		t.Logf("--- %s %s:\n%s", a.id, strings.TrimPrefix(f, p.LogDir), strings.Join(lines, "\n"))
	}
}

// event is one JSON line of the example trainer.
type event struct {
	Event        string    `json:"event"`
	Time         float64   `json:"time"`
	Step         int64     `json:"step"`
	WorldSize    int       `json:"world_size"`
	Rank         int       `json:"rank"`
	GroupRank    int       `json:"group_rank"`
	RestartCount int       `json:"restart_count"`
	RunID        string    `json:"run_id"`
	PID          int       `json:"pid"`
	Signal       string    `json:"signal"`
	Weights      []float64 `json:"weights"`
	Bias         float64   `json:"bias"`
	Round        int       `json:"-"` // from the log file's directory
	// Checkpoint on notice.
	Request      *CheckpointRequest `json:"request"`
	ResumeStep   *int64             `json:"resume_step"`
	ExpectedStep *int64             `json:"expected_step"`
}

// events parses every worker log of the agent, in round order.
func (a *testAgent) events(t *testing.T) []event {
	t.Helper()
	var out []event
	a.workerLines(func(round int, line []byte) {
		var ev event
		if json.Unmarshal(line, &ev) == nil && ev.Event != "" {
			ev.Round = round
			out = append(out, ev)
		}
	})
	return out
}

// workerLines calls fn with every JSON line of the agent's worker logs
// and its round.
func (a *testAgent) workerLines(fn func(round int, line []byte)) {
	files, _ := filepath.Glob(filepath.Join(a.paths().LogDir, "round-*", "rank-*.log"))
	for _, f := range files {
		round, _ := strconv.Atoi(strings.TrimPrefix(filepath.Base(filepath.Dir(f)), "round-"))
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "{") {
				fn(round, sc.Bytes())
			}
		}
		fh.Close()
	}
}

// stoppedBy reports whether a worker of the agent logged a stop by signal
// sig.
func (a *testAgent) stoppedBy(t *testing.T, sig string) bool {
	for _, ev := range a.events(t) {
		if ev.Event == "stop" && ev.Signal == sig {
			return true
		}
	}
	return false
}

// maxStep is the highest step the agent's workers printed.
func (a *testAgent) maxStep(t *testing.T) int64 {
	var m int64
	for _, ev := range a.events(t) {
		if ev.Event == "step" && ev.Step > m {
			m = ev.Step
		}
	}
	return m
}

func (a *testAgent) rounds(t *testing.T) []int {
	seen := map[int]bool{}
	var out []int
	for _, ev := range a.events(t) {
		if ev.Event == "start" && !seen[ev.Round] {
			seen[ev.Round] = true
			out = append(out, ev.Round)
		}
	}
	return out
}

type checkpoint struct {
	Step      int64 `json:"step"`
	WorldSize int   `json:"world_size"`
}

func readCheckpoint(t *testing.T, dir string) checkpoint {
	t.Helper()
	return testutil.ReadJSON[checkpoint](t, filepath.Join(dir, "checkpoint.json"))
}

// trainerJob is the training config of the stdlib example trainer. It
// checkpoints every step (the lost-node test counts on it) unless extra
// says otherwise: the last --ckpt-every wins.
func trainerJob(t *testing.T, steps int, ckpt string, extra ...string) TrainingConfig {
	py := needPython(t)
	cmd := append([]string{py, filepath.Join(repoRoot(t), "examples", "trainer", "train.py"),
		"--steps", strconv.Itoa(steps), "--step-time", "0.02", "--op-timeout", "3", "--connect-timeout", "20",
		"--ckpt-every", "1"}, extra...)
	return TrainingConfig{Command: cmd, NprocPerNode: 1, MaxRestarts: 3, DrainGrace: 5 * time.Second, CheckpointURI: ckpt}
}

// rdzvConfig is a fast rendezvous; dead_after is generous so a loaded
// machine does not drop live nodes (the lost-node test lowers it).
func rdzvConfig(t *testing.T, minNodes, maxNodes int) rendezvous.Config {
	return rendezvous.Config{MinNodes: minNodes, MaxNodes: maxNodes, LastCall: 2 * time.Second,
		Heartbeat: 250 * time.Millisecond, DeadAfter: 5 * time.Second, MasterPort: freePort(t)}
}
