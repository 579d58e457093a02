package local

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/local/imdsfake"
)

// NodeCommand is the hidden fleetd subcommand that runs one node's
// supervisor: `fleetd local-node -dir <state>/instances/<id>`.
const NodeCommand = "local-node"

// Environment the node's agent receives.
const (
	EnvMetadataURL = "FLEETD_METADATA_URL"
	EnvNodeAddr    = "FLEETD_NODE_ADDR"
	// envListenFD tells the supervisor the metadata listener the provider
	// bound is inherited as this fd.
	envListenFD = "FLEETD_LOCAL_LISTEN_FD"
)

// The control endpoint lives on the metadata address under a path IMDS
// never uses, guarded by the per-node secret from the instance record.
const (
	controlInterruptPath = "/_fleetd/v1/interrupt"
	headerNodeSecret     = "X-Fleetd-Node-Secret"
)

type interruptRequest struct {
	Kind     string    `json:"kind"`
	Deadline time.Time `json:"deadline"`
}

// node is a running node supervisor: the "hypervisor" of one local VM. It
// serves the node's metadata, runs the agent as the VM's OS, and powers the
// VM off when the agent dies, when it is told to stop (SIGTERM from
// Delete), or when an interruption notice's deadline passes.
type node struct {
	log  *slog.Logger // to console.log
	st   store
	rec  record
	root string
	imds *imdsfake.Server

	mu     sync.Mutex
	status status
	timer  *time.Timer
	stopAt time.Time
	stop   chan stopReq // buffered(1): the first stop request wins
}

type stopReq struct {
	reason    string
	graceful  bool
	reclaimed bool
}

// RunNode runs the supervisor of the node whose directory is dir
// (<state>/instances/<id>) until the node powers off. Cancel ctx (SIGTERM)
// to shut the node down gracefully. It is the body of `fleetd local-node`.
func RunNode(ctx context.Context, dir string) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	st := store{dir: filepath.Dir(filepath.Dir(dir))}
	rec, err := st.load(filepath.Base(dir))
	if err != nil {
		return fmt.Errorf("local node: %w", err)
	}
	ln, err := nodeListener(rec)
	if err != nil {
		return fmt.Errorf("local node %s: metadata listener: %w", rec.ID, err)
	}
	userData, err := os.ReadFile(filepath.Join(dir, "user-data"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		ln.Close()
		return fmt.Errorf("local node %s: %w", rec.ID, err)
	}
	n := &node{
		log:  slog.New(slog.NewTextHandler(os.Stderr, nil)).With("instance", rec.ID),
		st:   st,
		rec:  rec,
		root: filepath.Join(dir, "root"),
		imds: imdsfake.New(identity(rec), userData),
		stop: make(chan stopReq, 1),
	}
	srv := imdsfake.Serve(ln, n.handler())
	n.log.Info("node booting", "metadata_url", rec.MetadataURL, "address", rec.Address, "pid", os.Getpid())
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Close(sctx)
	}()

	if os.Getenv(envListenFD) != "" { // started by Create, not by hand
		if err := awaitAdoption(ctx, st, rec.ID, adoptWait); err != nil {
			n.log.Error("node powers off before its agent starts", "err", err)
			n.exited(stopReq{reason: err.Error()})
			return fmt.Errorf("local node %s: %w", rec.ID, err)
		}
	}
	cmd, agentDone, err := n.startAgent()
	if err != nil {
		n.log.Error("agent failed to start", "err", err)
		n.exited(stopReq{reason: "agent failed to start: " + err.Error()})
		return fmt.Errorf("local node %s: %w", rec.ID, err)
	}

	var req stopReq
	select {
	case err := <-agentDone:
		// The agent is the VM's OS: when it dies, the VM is gone.
		req = stopReq{reason: "agent exited: " + describeExit(err)}
		agentDone = nil
	case <-ctx.Done():
		req = stopReq{reason: "shutdown", graceful: true}
	case req = <-n.stop:
	}
	n.log.Info("node stopping", "reason", req.reason, "graceful", req.graceful)
	n.stopping(req)
	n.powerOff(cmd, agentDone, req)
	n.exited(req)
	n.log.Info("node powered off")
	return nil
}

func describeExit(err error) string {
	if err == nil {
		return "status 0"
	}
	return err.Error()
}

// nodeListener takes over the listener the provider bound (so the metadata
// URL works from the moment Create returns), or binds the recorded address
// when run by hand.
func nodeListener(rec record) (net.Listener, error) {
	if fd := os.Getenv(envListenFD); fd != "" {
		n, err := strconv.Atoi(fd)
		if err != nil {
			return nil, fmt.Errorf("%s=%q", envListenFD, fd)
		}
		f := os.NewFile(uintptr(n), "metadata-listener")
		defer f.Close() // FileListener dups it
		return net.FileListener(f)
	}
	u, err := url.Parse(rec.MetadataURL)
	if err != nil {
		return nil, err
	}
	return net.Listen("tcp", u.Host)
}

// adoptWait bounds how long a supervisor waits for Create to record it.
const adoptWait = 60 * time.Second

// awaitAdoption returns once Create has recorded this process as the
// node's supervisor. Create can only write the pid after the start (and
// the write ends in an fsync, seconds long on a busy disk); if the
// launching process dies in between, the record keeps pid 0 and nothing
// would ever stop this node, so it powers off instead: as soon as the
// provider's next look marks the pid-less record terminated, or after
// wait at the latest.
func awaitAdoption(ctx context.Context, st store, id string, wait time.Duration) error {
	me := os.Getpid()
	deadline := time.Now().Add(wait)
	for {
		rec, err := st.load(id)
		switch {
		case err != nil:
			return fmt.Errorf("reading its record: %w", err)
		case rec.PID == me:
			return nil
		case !rec.TerminatedAt.IsZero() || rec.Deleted:
			return errors.New("the instance was terminated before its launch was recorded (the launching process died)")
		case rec.PID != 0:
			return fmt.Errorf("the record names another supervisor (pid %d)", rec.PID)
		case time.Now().After(deadline):
			return fmt.Errorf("its launch was not recorded within %s (the launching process died)", wait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func identity(rec record) imdsfake.Identity {
	life := "on-demand"
	if rec.Offering.CapacityType == providers.Spot {
		life = "spot"
	}
	return imdsfake.Identity{
		InstanceID:       rec.ID,
		InstanceType:     rec.Offering.InstanceType,
		AvailabilityZone: rec.Offering.Zone,
		Region:           rec.Offering.Region,
		LifeCycle:        life,
		LocalIPv4:        rec.Address,
		AccountID:        "000000000000",
		ImageID:          "ami-fleetd-local",
		PendingTime:      rec.LaunchedAt,
	}
}

func (n *node) startAgent() (*exec.Cmd, chan error, error) {
	console, err := os.OpenFile(filepath.Join(n.st.instanceDir(n.rec.ID), "agent.console.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, err
	}
	defer console.Close() // the child has its own copy
	cmd := exec.Command(n.rec.AgentBinary, "agent",
		"-config", filepath.Join(n.root, filepath.FromSlash(AgentConfigPath)),
		"-root", n.root)
	cmd.Dir = n.root
	cmd.Env = append(nodeEnv(),
		EnvMetadataURL+"="+n.rec.MetadataURL,
		EnvNodeAddr+"="+n.rec.Address)
	cmd.Stdout, cmd.Stderr = console, console
	// No Setpgid: the agent stays in the node's process group and session,
	// so Delete's signal to the group reaches it.
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	start, err := startTime(cmd.Process.Pid)
	if err != nil {
		start = 0 // exited already; Wait below reports it
	}
	n.log.Info("agent started", "pid", cmd.Process.Pid)
	n.mu.Lock()
	n.status.AgentPID, n.status.AgentStart = cmd.Process.Pid, start
	n.saveStatusLocked()
	n.mu.Unlock()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	return cmd, done, nil
}

// powerOff stops everything in the node's session. A graceful stop gives
// the processes the record's grace after SIGTERM, like an ACPI shutdown;
// otherwise it is a hard power-off.
func (n *node) powerOff(cmd *exec.Cmd, agentDone chan error, req stopReq) {
	me := os.Getpid()
	sid := me // the supervisor leads the node's session (Setsid)
	if req.graceful {
		if agentDone != nil {
			_ = cmd.Process.Signal(syscall.SIGTERM)
		}
		signalSession(sid, me, syscall.SIGTERM)
		grace := n.rec.StopGrace
		if grace <= 0 {
			grace = DefaultStopGrace
		}
		deadline := time.After(grace)
	wait:
		for agentDone != nil || len(sessionMembers(sid, me)) > 0 {
			select {
			case <-agentDone:
				agentDone = nil
			case <-deadline:
				break wait
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	for i := 0; i < 100 && signalSession(sid, me, syscall.SIGKILL) > 0; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if agentDone != nil {
		<-agentDone // SIGKILLed above: returns at once
	}
}

// stopping records why the node is going down before anything is killed:
// an observer that sees the agent gone must already find the reason, or it
// would take a reclaim for an unannounced loss.
func (n *node) stopping(req stopReq) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.status.ExitReason, n.status.Reclaimed = req.reason, req.reclaimed
	n.saveStatusLocked()
}

func (n *node) exited(req stopReq) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.timer != nil {
		n.timer.Stop()
	}
	n.status.Exited, n.status.ExitedAt = true, time.Now().UTC()
	n.status.ExitReason, n.status.Reclaimed = req.reason, req.reclaimed
	n.saveStatusLocked()
}

func (n *node) saveStatusLocked() {
	if err := n.st.writeStatus(n.rec.ID, n.status); err != nil {
		n.log.Error("writing status", "err", err)
	}
}

func (n *node) requestStop(r stopReq) {
	select {
	case n.stop <- r:
	default: // a stop is already under way
	}
}

func (n *node) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+controlInterruptPath, n.serveInterrupt)
	mux.Handle("/", n.imds)
	return mux
}

func (n *node) serveInterrupt(w http.ResponseWriter, r *http.Request) {
	got := r.Header.Get(headerNodeSecret)
	if got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(n.rec.Secret)) != 1 {
		http.Error(w, "forbidden", http.StatusForbidden)
		return
	}
	var req interruptRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 4096)).Decode(&req); err != nil {
		http.Error(w, "bad request: "+err.Error(), http.StatusBadRequest)
		return
	}
	n.log.Info("interruption injected", "kind", req.Kind, "deadline", req.Deadline)
	if err := n.interrupt(req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// interrupt injects a notice. Spot and maintenance notices are published
// on the metadata service and end the node at their deadline, whether or
// not anyone calls Delete, as a cloud reclaim does.
func (n *node) interrupt(req interruptRequest) error {
	kind, err := interruption.ParseKind(req.Kind)
	if err != nil {
		return err
	}
	now := time.Now()
	deadline := req.Deadline
	if deadline.IsZero() {
		deadline = now
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	switch kind {
	case interruption.Lost:
		n.status.Notice = &providers.InterruptionInfo{Kind: string(kind), Deadline: now.UTC()}
		n.saveStatusLocked()
		n.requestStop(stopReq{reason: "lost (injected)", reclaimed: true})
		return nil
	case interruption.Rebalance:
		n.imds.SetRebalance(now)
		if n.status.Notice == nil {
			n.status.Notice = &providers.InterruptionInfo{Kind: string(kind)}
		}
		n.saveStatusLocked()
		return nil
	}
	if !n.stopAt.IsZero() && !deadline.Before(n.stopAt) {
		return nil // an earlier reclaim is already scheduled
	}
	switch kind {
	case interruption.SpotInterruption, interruption.Preempted:
		n.imds.SetSpotAction("terminate", deadline)
	case interruption.Maintenance:
		n.imds.SetScheduledEvents([]imdsfake.ScheduledEvent{{
			Code: "instance-retirement", Description: "injected by fleetd local provider",
			EventID: "instance-event-" + n.rec.ID[2:], State: "active",
			NotBefore: deadline, NotAfter: deadline.Add(2 * time.Hour),
		}})
	}
	n.status.Notice = &providers.InterruptionInfo{Kind: string(kind), Deadline: deadline.UTC()}
	n.saveStatusLocked()
	n.stopAt = deadline
	if n.timer != nil {
		n.timer.Stop()
	}
	reason := string(kind) + " deadline reached"
	n.timer = time.AfterFunc(time.Until(deadline), func() {
		n.requestStop(stopReq{reason: reason, graceful: true, reclaimed: true})
	})
	return nil
}

// nodeEnv is the environment a node starts with: a fresh VM inherits none
// of the daemon's variables (credentials, tokens), only the basics.
func nodeEnv() []string {
	var env []string
	for _, k := range []string{"PATH", "HOME", "LANG", "TMPDIR", "TZ", "GOCOVERDIR"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}
