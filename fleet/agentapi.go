package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/bootstrap"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/providers"
)

// mountAgentAPI adds the routes agents (per-node tokens) and operators use
// beyond the core API.
func (d *Daemon) mountAgentAPI(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/agent/{fleet}/{node}/register", d.nodeAuth(d.agentRegister))
	mux.HandleFunc("POST /v1/agent/{fleet}/{node}/notice", d.nodeAuth(d.agentNotice))
	mux.HandleFunc("POST /v1/agent/{fleet}/{node}/logs", d.nodeAuth(d.agentLogs))
	mux.HandleFunc("POST /v1/agent/{fleet}/{node}/done", d.nodeAuth(d.agentDone))
	mux.HandleFunc("POST /v1/agent/{fleet}/{node}/checkpoint/sign", d.nodeAuth(d.agentCheckpointSign))
	mux.HandleFunc("POST /v1/agent/{fleet}/{node}/checkpoint/list", d.nodeAuth(d.agentCheckpointList))
	mux.HandleFunc("POST /v1/agent/{fleet}/{node}/checkpoint/delete", d.nodeAuth(d.agentCheckpointDelete))
	mux.HandleFunc("POST /v1/agent/{fleet}/{node}/checkpoint/report", d.nodeAuth(d.agentCheckpointReport))
	mux.HandleFunc("GET /v1/agent/binary", d.agentBinary)
	mux.Handle("GET /v1/fleets/{fleet}/logs", d.api.Require(api.RoleRead, d.fleetLogs))
	// Offerings is a POST that only reads, but it calls the providers with
	// the daemon's cloud credentials for any spec it is sent: not for
	// passive observers (a scraper's token).
	mux.Handle("POST /v1/offerings", d.api.Require(api.RoleOperate, d.offeringsHandler))
	mux.Handle("POST /v1/check", d.api.Require(api.RoleOperate, d.checkHandler))
	mux.Handle("GET /v1/cluster", d.api.Require(api.RoleRead, d.clusterInfo))
	mux.Handle("POST /v1/fleets/{fleet}/nodes/{node}/interrupt", d.api.Require(api.RoleOperate, d.interruptNode))
	mux.Handle("POST /v1/tokens", d.api.Require(api.RoleAdmin, d.createTokenHandler))
	mux.Handle("GET /v1/tokens", d.api.Require(api.RoleAdmin, d.listTokensHandler))
	mux.Handle("DELETE /v1/tokens/{id}", d.api.Require(api.RoleAdmin, d.revokeTokenHandler))
}

func (d *Daemon) nodeAuth(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := d.authorizeNode(r, r.PathValue("fleet"), r.PathValue("node")); err != nil {
			writeAuthError(w, err)
			return
		}
		h(w, r)
	}
}

// agentRegister records that a node's agent is up (booting → joined) and
// returns what it should run.
func (d *Daemon) agentRegister(w http.ResponseWriter, r *http.Request) {
	var req api.RegisterRequest
	if !api.DecodeBody(w, r, &req) {
		return
	}
	fleetName, nodeID := r.PathValue("fleet"), r.PathValue("node")
	var resp api.RegisterResponse
	err := d.update(r.Context(), func(tx state.Tx) error {
		f, err := tx.Fleet(fleetName)
		if err != nil {
			return err
		}
		n, err := tx.Node(fleetName, nodeID)
		if err != nil {
			return err
		}
		fl, err := d.fleetSpec(f)
		if err != nil {
			return err
		}
		changed := false
		if req.Address != "" && n.Address != req.Address {
			n.Address, changed = req.Address, true
		}
		if n.InstanceID == "" && req.InstanceID != "" {
			n.InstanceID, changed = req.InstanceID, true
		}
		switch n.State {
		case state.NodeRequested, state.NodeProvisioning, state.NodeBooting:
			d.noteJoined(fleetName, nodeID, d.now())
			from := n.State
			n.State, n.Reason, changed = state.NodeJoined, "agent registered", true
			if _, err := tx.AppendEvent(state.Event{Fleet: fleetName, Node: nodeID, Type: "node.transition",
				Message: fmt.Sprintf("%s → joined: agent registered from %s", from, req.Address),
				Data:    map[string]string{"from": string(from), "to": string(state.NodeJoined)}}); err != nil {
				return err
			}
		}
		n.LastHeartbeat = d.now()
		if changed || true {
			if err := tx.PutNode(n); err != nil {
				return err
			}
		}
		t := fl.Training
		resp = api.RegisterResponse{Fleet: fleetName, Node: nodeID, RendezvousURL: d.URL(), Training: api.TrainingConfig{
			Command: t.Command, Workdir: t.Workdir, NprocPerNode: t.NprocPerNode, MaxRestarts: t.MaxRestarts,
			MasterPort: t.MasterPort, DrainGrace: t.DrainGrace, CheckpointURI: t.CheckpointURI, Env: t.Env,
			Heartbeat: fl.Rendezvous.Heartbeat, WarmStart: t.WarmStart, Checkpoint: checkpointConfig(t.Checkpoint),
			Elastic: t.Elastic}}
		return nil
	})
	if err != nil {
		d.apiFail(w, err)
		return
	}
	d.kick()
	api.WriteJSON(w, http.StatusOK, resp)
}

func (d *Daemon) apiFail(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, state.ErrNotFound):
		api.WriteError(w, http.StatusNotFound, err)
	default:
		d.log.Error("agent api", "err", err)
		api.WriteError(w, http.StatusInternalServerError, err)
	}
}

// agentNotice takes a notice an agent saw in its metadata service.
func (d *Daemon) agentNotice(w http.ResponseWriter, r *http.Request) {
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
	if err := d.HandleNotice(r.Context(), r.PathValue("fleet"), n); err != nil {
		d.apiFail(w, err)
		return
	}
	api.WriteJSON(w, http.StatusAccepted, map[string]string{"status": "accepted"})
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

func (l *logRing) get(fleet, node string, n int) []api.LogLine {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := []api.LogLine{}
	for _, ln := range l.lines[fleet] {
		if node == "" || ln.Node == node {
			out = append(out, ln)
		}
	}
	if n > 0 && len(out) > n {
		out = out[len(out)-n:]
	}
	return out
}

func (d *Daemon) agentLogs(w http.ResponseWriter, r *http.Request) {
	var req api.LogsRequest
	if !api.DecodeBody(w, r, &req) {
		return
	}
	now := d.now()
	lines := make([]api.LogLine, 0, len(req.Lines))
	for _, s := range req.Lines {
		if len(s) > 4096 {
			s = s[:4096]
		}
		lines = append(lines, api.LogLine{Node: r.PathValue("node"), Round: req.Round, Rank: req.Rank, Time: now, Line: s})
	}
	d.logs.add(r.PathValue("fleet"), lines)
	w.WriteHeader(http.StatusNoContent)
}

func (d *Daemon) fleetLogs(w http.ResponseWriter, r *http.Request) {
	n := 200
	if v := r.URL.Query().Get("tail"); v != "" {
		if x, err := strconv.Atoi(v); err == nil && x > 0 {
			n = x
		}
	}
	api.WriteJSON(w, http.StatusOK, d.logs.get(r.PathValue("fleet"), r.URL.Query().Get("node"), n))
}

// agentBinary serves the agent for the node's architecture (?arch=, ""
// is amd64; agentbinaries.go); its sha256 is in the user-data and checked
// before it is run.
func (d *Daemon) agentBinary(w http.ResponseWriter, r *http.Request) {
	// Only a node of this deployment (or the admin) may download it: the
	// URL in user-data names the node, and its token must match.
	q := r.URL.Query()
	if err := d.authorizeNode(r, q.Get("fleet"), q.Get("node")); err != nil {
		writeAuthError(w, err)
		return
	}
	arch := bootstrap.NormalizeArch(q.Get("arch"))
	b, ok := d.agents.Lookup(arch)
	if !ok {
		api.WriteError(w, http.StatusNotFound, fmt.Errorf("%w; fix: %s", &bootstrap.NoAgentError{Arch: arch, Dirs: d.agents.Dirs}, bootstrap.AgentFix(arch, d.agents.Dirs)))
		return
	}
	f, err := os.Open(b.Path)
	if err != nil {
		api.WriteError(w, http.StatusInternalServerError, err)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("X-Fleetd-Sha256", b.SHA256)
	http.ServeContent(w, r, bootstrap.AgentFileName(arch), time.Time{}, f)
}

// interruptNode injects an interruption through the node's provider (local,
// sim): the notice then reaches fleetd the way a real one would, through the
// node's metadata service and agent.
func (d *Daemon) interruptNode(w http.ResponseWriter, r *http.Request) {
	var req api.InterruptRequest
	if r.ContentLength != 0 && !api.DecodeBody(w, r, &req) {
		return
	}
	kind := interruption.SpotInterruption
	if req.Kind != "" {
		k, err := interruption.ParseKind(req.Kind)
		if err != nil {
			api.WriteError(w, http.StatusBadRequest, err)
			return
		}
		kind = k
	}
	fleetName, nodeID := r.PathValue("fleet"), r.PathValue("node")
	var n state.Node
	var f state.Fleet
	err := d.store.View(r.Context(), func(tx state.Tx) error {
		var err error
		if f, err = tx.Fleet(fleetName); err != nil {
			return err
		}
		n, err = tx.Node(fleetName, nodeID)
		return err
	})
	if err != nil {
		d.apiFail(w, err)
		return
	}
	if n.InstanceID == "" {
		api.WriteError(w, http.StatusConflict, fmt.Errorf("node %s has no instance yet (state %s)", nodeID, n.State))
		return
	}
	p, cfg, err := d.providerFor(r.Context(), f, n.Offering.Provider)
	if err != nil {
		api.WriteError(w, http.StatusBadGateway, err)
		return
	}
	in, ok := p.(providers.Interrupter)
	if !ok {
		api.WriteError(w, http.StatusNotImplemented, fmt.Errorf("provider %s cannot inject interruptions", n.Offering.Provider))
		return
	}
	info := providers.InterruptionInfo{Kind: string(kind)}
	if req.Lead > 0 {
		info.Deadline = d.now().Add(req.Lead)
	}
	if err := in.Interrupt(r.Context(), cfg, n.InstanceID, info); err != nil {
		if errors.Is(err, errors.ErrUnsupported) {
			api.WriteError(w, http.StatusNotImplemented, fmt.Errorf("provider %s cannot inject interruptions: %w", n.Offering.Provider, err))
			return
		}
		api.WriteError(w, http.StatusBadGateway, err)
		return
	}
	d.appendEvent(r.Context(), state.Event{Fleet: fleetName, Node: nodeID, Type: "interrupt.injected",
		Message: fmt.Sprintf("injected %s on %s (instance %s)", kind, nodeID, n.InstanceID)})
	api.WriteJSON(w, http.StatusAccepted, map[string]string{"status": "injected", "instance": n.InstanceID, "kind": string(kind)})
}

// appendEvent records an event on its own; failures are logged, not fatal.
func (d *Daemon) appendEvent(ctx context.Context, e state.Event) {
	if err := d.update(ctx, func(tx state.Tx) error {
		_, err := tx.AppendEvent(e)
		return err
	}); err != nil {
		d.log.Error("append event", "type", e.Type, "err", err)
	}
}

// agentDone records the end of the training job: the rendezvous finishes
// (every agent stops its workers) and the fleet scales to zero.
func (d *Daemon) agentDone(w http.ResponseWriter, r *http.Request) {
	var req api.DoneRequest
	if !api.DecodeBody(w, r, &req) {
		return
	}
	fleetName, nodeID := r.PathValue("fleet"), r.PathValue("node")
	first := false
	err := d.update(r.Context(), func(tx state.Tx) error {
		f, err := tx.Fleet(fleetName)
		if err != nil {
			return err
		}
		if f.Completed {
			return nil
		}
		first = true
		f.Completed, f.Succeeded, f.CompletedAt = true, req.Success, d.now()
		f.CompletedDetail = strings.TrimSpace(req.Detail)
		if _, err := tx.PutFleet(f); err != nil {
			return err
		}
		outcome := "succeeded"
		if !req.Success {
			outcome = "failed"
		}
		_, err = tx.AppendEvent(state.Event{Fleet: fleetName, Node: nodeID, Type: "job.finished",
			Message: fmt.Sprintf("training job %s at step %d (reported by %s)%s", outcome, req.Step, nodeID, strings.TrimSpace(" "+req.Detail)),
			Data:    map[string]string{"success": strconv.FormatBool(req.Success), "step": strconv.FormatInt(req.Step, 10)}})
		return err
	})
	if err != nil {
		d.apiFail(w, err)
		return
	}
	if first && d.rz() != nil {
		if err := d.rz().Finish(r.Context(), fleetName, req.Success); err != nil {
			d.log.Warn("rendezvous finish", "fleet", fleetName, "err", err)
		}
	}
	d.kick()
	api.WriteJSON(w, http.StatusOK, map[string]bool{"first": first})
}
