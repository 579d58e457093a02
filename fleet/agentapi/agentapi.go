// Package agentapi is the node-facing HTTP API: what a node's agent calls
// with its per-node token (register, interruption notices, worker logs, job
// done, checkpoint store access) and the agent binary download, with the
// node-token check they share with the rendezvous routes.
//
// It is served by the leader only: a follower forwards every agent call to
// the server that leads (fleet/ha.go), whose in-memory state (rendezvous
// rounds, notices, logs, checkpoint reports) is the current one. It
// reaches the daemon only through Deps.
package agentapi

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleetd/agentwire"
	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/bootstrap"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/interruption"
)

// Deps is what the agent API needs of the daemon.
type Deps interface {
	// View runs fn in a read transaction of the state store.
	View(ctx context.Context, fn func(state.Tx) error) error
	// Update runs fn in a durable transaction and wakes event followers.
	Update(ctx context.Context, fn func(state.Tx) error) error
	// AppendEvent records an event on its own; failures are logged.
	AppendEvent(ctx context.Context, e state.Event)
	// FleetSpec is the decoded spec of an applied fleet.
	FleetSpec(f state.Fleet) (*spec.Fleet, error)
	// URL is the base URL agents use (the rendezvous is under it).
	URL() string
	// Notice records an interruption notice for a node of a fleet.
	Notice(ctx context.Context, fleet string, n interruption.Notice) error
	// Joined records that a node's agent registered at (recovery stats).
	Joined(fleet, node string, at time.Time)
	// FinishRendezvous ends a fleet's rendezvous (the job is done); nil
	// when this server runs none.
	FinishRendezvous(ctx context.Context, fleet string, success bool) error
	// Kick wakes the reconcile loop.
	Kick()
	// AgentBinaries are the agent binaries nodes download.
	AgentBinaries() *bootstrap.AgentIndex
	// CacheDir is where derived files (the agents' gzip copies) are kept;
	// "" for none.
	CacheDir() string
	// Version is the daemon's version, the centre of the agent version
	// window (agentwire.CheckSkew).
	Version() string
	// VerifyScopedToken checks a scoped (read/operate/admin) token.
	VerifyScopedToken(ctx context.Context, tok string) (api.Role, error)
	// CheckpointRestored is told of each checkpoint restore a node
	// reports (bytes read from the store), to charge its egress.
	CheckpointRestored(ctx context.Context, fleet, node string, bytes int64)
}

// API serves the node-facing routes.
type API struct {
	deps Deps
	log  *slog.Logger
	now  func() time.Time
	// adminToken acts on any node; secret derives the node tokens
	// (NodeToken).
	adminToken string
	secret     []byte

	logs     logRing
	ckpts    ckptRegistry
	bins     binaryServer
	stagings stagingRegistry
}

// New returns the agent API of a daemon whose admin token is adminToken
// and whose node tokens derive from secret.
func New(deps Deps, log *slog.Logger, now func() time.Time, adminToken string, secret []byte) *API {
	return &API{deps: deps, log: log, now: now, adminToken: adminToken, secret: secret, bins: newBinaryServer(log)}
}

// Mount adds the routes agents call with their per-node tokens.
func (a *API) Mount(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/agent/{fleet}/{node}/register", a.nodeAuth(a.register))
	mux.HandleFunc("POST /v1/agent/{fleet}/{node}/notice", a.nodeAuth(a.notice))
	mux.HandleFunc("POST /v1/agent/{fleet}/{node}/logs", a.nodeAuth(a.agentLogs))
	mux.HandleFunc("POST /v1/agent/{fleet}/{node}/done", a.nodeAuth(a.done))
	mux.HandleFunc("POST /v1/agent/{fleet}/{node}/drained", a.nodeAuth(a.drained))
	mux.HandleFunc("POST /v1/agent/{fleet}/{node}/checkpoint/sign", a.nodeAuth(a.checkpointSign))
	mux.HandleFunc("POST /v1/agent/{fleet}/{node}/checkpoint/list", a.nodeAuth(a.checkpointList))
	mux.HandleFunc("POST /v1/agent/{fleet}/{node}/checkpoint/delete", a.nodeAuth(a.checkpointDelete))
	mux.HandleFunc("POST /v1/agent/{fleet}/{node}/checkpoint/report", a.nodeAuth(a.checkpointReport))
	mux.HandleFunc("POST /v1/agent/{fleet}/{node}/staging", a.nodeAuth(a.staging))
	mux.HandleFunc("POST /v1/agent/{fleet}/{node}/staging/peer", a.nodeAuth(a.stagingPeer))
	mux.HandleFunc("GET /v1/agent/binary", a.agentBinary)
}

func (a *API) nodeAuth(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := a.AuthorizeNode(r, r.PathValue("fleet"), r.PathValue("node")); err != nil {
			writeAuthError(w, err)
			return
		}
		h(w, r)
	}
}

// register records that a node's agent is up (booting → joined) and
// returns what it should run.
func (a *API) register(w http.ResponseWriter, r *http.Request) {
	var req api.RegisterRequest
	if !api.DecodeBody(w, r, &req) {
		return
	}
	fleetName, nodeID := r.PathValue("fleet"), r.PathValue("node")
	daemonVersion := a.deps.Version()
	skew := agentwire.CheckSkew(daemonVersion, req.AgentVersion)
	var resp api.RegisterResponse
	var refused error
	err := a.deps.Update(r.Context(), func(tx state.Tx) error {
		f, err := tx.Fleet(fleetName)
		if err != nil {
			return err
		}
		n, err := tx.Node(fleetName, nodeID)
		if err != nil {
			return err
		}
		fl, err := a.deps.FleetSpec(f)
		if err != nil {
			return err
		}
		if skew == agentwire.TooOld || skew == agentwire.TooNew {
			msg := fmt.Sprintf("agent %s is %s for this daemon (%s accepts agents %s)", req.AgentVersion, skew, daemonVersion, agentwire.Window(daemonVersion))
			switch n.State {
			case state.NodeRequested, state.NodeProvisioning, state.NodeBooting:
				// A new node: refusing costs nothing yet, and running an
				// agent the daemon was not built for risks the job.
				refused = fmt.Errorf("%s; the node must run the agent this daemon serves (GET /v1/agent/binary)", msg)
				_, err := tx.AppendEvent(state.Event{Fleet: fleetName, Node: nodeID, Type: "agent.version_refused", Message: refused.Error(),
					Data: map[string]string{"agent_version": req.AgentVersion, "daemon_version": daemonVersion}})
				return err
			default:
				// A node already at work (the daemon was upgraded under it):
				// keep it and its workers; its replacement gets the new agent.
				if n.AgentVersion != req.AgentVersion {
					if _, err := tx.AppendEvent(state.Event{Fleet: fleetName, Node: nodeID, Type: "agent.version_skew",
						Message: msg + "; kept because the node is " + string(n.State) + ": its replacement downloads the current agent",
						Data:    map[string]string{"agent_version": req.AgentVersion, "daemon_version": daemonVersion}}); err != nil {
						return err
					}
				}
			}
		}
		if n.AgentVersion != req.AgentVersion {
			n.AgentVersion = req.AgentVersion
		}
		if req.Address != "" && n.Address != req.Address {
			n.Address = req.Address
		}
		if n.InstanceID == "" && req.InstanceID != "" {
			n.InstanceID = req.InstanceID
		}
		switch n.State {
		case state.NodeRequested, state.NodeProvisioning, state.NodeBooting:
			a.deps.Joined(fleetName, nodeID, a.now())
			from := n.State
			n.State, n.Reason = state.NodeJoined, "agent registered"
			if _, err := tx.AppendEvent(state.Event{Fleet: fleetName, Node: nodeID, Type: "node.transition",
				Message: fmt.Sprintf("%s → joined: agent registered from %s", from, req.Address),
				Data:    map[string]string{"from": string(from), "to": string(state.NodeJoined)}}); err != nil {
				return err
			}
		}
		// Always written: the registration is the node's first heartbeat.
		n.LastHeartbeat = a.now()
		if err := tx.PutNode(n); err != nil {
			return err
		}
		t := fl.Training
		resp = api.RegisterResponse{Fleet: fleetName, Node: nodeID, RendezvousURL: a.deps.URL(), Training: api.TrainingConfig{
			Command: t.Command, Workdir: t.Workdir, NprocPerNode: t.NprocPerNode, MaxRestarts: t.MaxRestarts,
			MasterPort: t.MasterPort, DrainGrace: t.DrainGrace, CheckpointURI: t.CheckpointURI, Env: t.Env,
			Heartbeat: fl.Rendezvous.Heartbeat, WarmStart: t.WarmStart, Checkpoint: checkpointConfig(t.Checkpoint),
			Elastic: t.Elastic, Network: networkConfig(n), Data: dataConfig(t.Data), PeerPort: t.PeerPort}}
		return nil
	})
	if err != nil {
		a.fail(w, err)
		return
	}
	if refused != nil {
		a.log.Warn("agent refused: version outside the window", "fleet", fleetName, "node", nodeID, "agent_version", req.AgentVersion, "daemon_version", daemonVersion)
		api.WriteError(w, http.StatusUpgradeRequired, refused)
		return
	}
	if skew != agentwire.InWindow {
		a.log.Warn("agent version outside the window or unknown", "fleet", fleetName, "node", nodeID, "agent_version", req.AgentVersion,
			"daemon_version", daemonVersion, "skew", skew.String(), "window", agentwire.Window(daemonVersion))
	}
	a.deps.Kick()
	api.WriteJSON(w, http.StatusOK, resp)
}

// fail answers a failed call: 404 for what the state does not hold, 500
// (logged) for the rest.
func (a *API) fail(w http.ResponseWriter, err error) { api.WriteFailure(w, a.log, err) }

// notice takes a notice an agent saw in its metadata service.
func (a *API) notice(w http.ResponseWriter, r *http.Request) {
	var req api.NoticeRequest
	if !api.DecodeBody(w, r, &req) {
		return
	}
	kind, err := interruption.ParseKind(req.Kind)
	if err != nil {
		api.WriteError(w, http.StatusBadRequest, err)
		return
	}
	src := req.Source
	if src == "" {
		src = "agent"
	}
	n := interruption.Notice{Node: r.PathValue("node"), Kind: kind, Deadline: req.Deadline, Source: "agent/" + src, Detail: req.Detail, ID: req.ID}
	if err := a.deps.Notice(r.Context(), r.PathValue("fleet"), n); err != nil {
		a.fail(w, err)
		return
	}
	api.WriteJSON(w, http.StatusAccepted, map[string]string{"status": "accepted"})
}

// finishedMessage is the job.finished event's text; the agent's detail,
// when it gave one, follows after a colon.
func finishedMessage(outcome string, step int64, node, detail string) string {
	msg := fmt.Sprintf("training job %s at step %d (reported by %s)", outcome, step, node)
	if d := strings.TrimSpace(detail); d != "" {
		msg += ": " + d
	}
	return msg
}

// logRing keeps the newest worker log lines per fleet, in memory: logs are
// for looking at a run, not a record (the node keeps its full logs).
type logRing struct {
	mu    sync.Mutex
	lines map[string][]api.LogLine
}

const maxLogLines = 2000

func (l *logRing) add(fleet string, lines []api.LogLine) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lines == nil {
		l.lines = map[string][]api.LogLine{}
	}
	buf := append(l.lines[fleet], lines...)
	if len(buf) > maxLogLines {
		buf = append([]api.LogLine(nil), buf[len(buf)-maxLogLines:]...)
	}
	l.lines[fleet] = buf
}

// get returns the newest n lines of a fleet name's incarnation inc ("*":
// every incarnation), of one node or ("") of all. The ring is per fleet
// name, so a destroyed incarnation's lines stay reachable until newer
// lines push them out.
func (l *logRing) get(fleet, inc, node string, n int) []api.LogLine {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := []api.LogLine{}
	for _, ln := range l.lines[fleet] {
		if (node == "" || ln.Node == node) && (inc == "*" || ln.Incarnation == inc) {
			out = append(out, ln)
		}
	}
	if n > 0 && len(out) > n {
		out = out[len(out)-n:]
	}
	return out
}

// Logs returns the newest n (0: all) kept log lines of a fleet's current
// incarnation, of one node or ("") of all.
func (a *API) Logs(fleet, node string, n int) []api.LogLine {
	return a.logs.get(fleet, a.incarnation(context.Background(), fleet), node, n)
}

// incarnation is fleet's current incarnation, "" if there is none.
func (a *API) incarnation(ctx context.Context, fleet string) string {
	f, err := state.Read(ctx, a.deps, func(tx state.Tx) (state.Fleet, error) { return tx.Fleet(fleet) })
	if err != nil {
		return ""
	}
	return f.Incarnation
}

func (a *API) agentLogs(w http.ResponseWriter, r *http.Request) {
	var req api.LogsRequest
	if !api.DecodeBody(w, r, &req) {
		return
	}
	now := a.now()
	// The node authenticated with its own record's token, so it belongs
	// to the fleet's current incarnation.
	inc := a.incarnation(r.Context(), r.PathValue("fleet"))
	lines := make([]api.LogLine, 0, len(req.Lines))
	for _, s := range req.Lines {
		if len(s) > 4096 {
			s = s[:4096]
		}
		lines = append(lines, api.LogLine{Incarnation: inc, Node: r.PathValue("node"), Round: req.Round, Rank: req.Rank, Time: now, Line: s})
	}
	a.logs.add(r.PathValue("fleet"), lines)
	w.WriteHeader(http.StatusNoContent)
}

// FleetLogs serves GET /v1/fleets/{fleet}/logs (an operator's route: the
// caller mounts it behind a read token). ?incarnation= picks another
// incarnation of the name (a destroyed one's id, or "*" for all); the
// default is the current one, or nothing for a name with no fleet.
func (a *API) FleetLogs(w http.ResponseWriter, r *http.Request) {
	n := 200
	if v := r.URL.Query().Get("tail"); v != "" {
		if x, err := strconv.Atoi(v); err == nil && x > 0 {
			n = x
		}
	}
	inc := r.URL.Query().Get("incarnation")
	if inc == "" {
		if inc = a.incarnation(r.Context(), r.PathValue("fleet")); inc == "" {
			api.WriteJSON(w, http.StatusOK, []api.LogLine{})
			return
		}
	}
	api.WriteJSON(w, http.StatusOK, a.logs.get(r.PathValue("fleet"), inc, r.URL.Query().Get("node"), n))
}

// done records the end of the training job: the rendezvous finishes
// (every agent stops its workers) and the fleet scales to zero.
func (a *API) done(w http.ResponseWriter, r *http.Request) {
	var req api.DoneRequest
	if !api.DecodeBody(w, r, &req) {
		return
	}
	fleetName, nodeID := r.PathValue("fleet"), r.PathValue("node")
	first := false
	err := a.deps.Update(r.Context(), func(tx state.Tx) error {
		f, err := tx.Fleet(fleetName)
		if err != nil {
			return err
		}
		if f.Completed {
			return nil
		}
		first = true
		f.Completed, f.Succeeded, f.CompletedAt = true, req.Success, a.now()
		f.CompletedDetail = strings.TrimSpace(req.Detail)
		if _, err := tx.PutFleet(f); err != nil {
			return err
		}
		outcome := "succeeded"
		if !req.Success {
			outcome = "failed"
		}
		_, err = tx.AppendEvent(state.Event{Fleet: fleetName, Node: nodeID, Type: "job.finished",
			Message: finishedMessage(outcome, req.Step, nodeID, req.Detail),
			Data:    map[string]string{"success": strconv.FormatBool(req.Success), "step": strconv.FormatInt(req.Step, 10)}})
		return err
	})
	if err != nil {
		a.fail(w, err)
		return
	}
	if first {
		if err := a.deps.FinishRendezvous(r.Context(), fleetName, req.Success); err != nil {
			a.log.Warn("rendezvous finish", "fleet", fleetName, "err", err)
		}
	}
	a.deps.Kick()
	api.WriteJSON(w, http.StatusOK, map[string]bool{"first": first})
}
