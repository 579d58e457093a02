package fleet

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/providers"
)

// mountRoutes adds the agent API (fleet/agentapi: per-node tokens) and
// the routes operators use beyond the core API.
func (d *Daemon) mountRoutes(mux *http.ServeMux) {
	d.agentAPI.Mount(mux)
	mux.Handle("GET /v1/fleets/{fleet}/logs", d.api.RequireFleet(api.RoleRead, "fleet", d.agentAPI.FleetLogs))
	// Offerings is a POST that only reads, but it calls the providers with
	// the daemon's cloud credentials for any spec it is sent: not for
	// passive observers (a scraper's token).
	mux.Handle("POST /v1/offerings", d.api.Require(api.RoleOperate, d.offeringsHandler))
	mux.Handle("POST /v1/check", d.api.Require(api.RoleOperate, d.check.checkHandler))
	mux.Handle("GET /v1/cluster", d.api.Require(api.RoleRead, d.clusterInfo))
	mux.Handle("POST /v1/fleets/{fleet}/nodes/{node}/interrupt", d.api.RequireFleet(api.RoleOperate, "fleet", d.interruptNode))
	pa := projectsAPI{d}
	mux.Handle("GET /v1/projects", d.api.RequireScoped(api.RoleRead, pa.projectsHandler))
	mux.Handle("PUT /v1/projects/{project}", d.api.Require(api.RoleAdmin, pa.setProjectHandler))
	mux.Handle("DELETE /v1/projects/{project}", d.api.Require(api.RoleAdmin, pa.deleteProjectHandler))
	mux.Handle("GET /v1/queue", d.api.RequireScoped(api.RoleRead, pa.queueHandler))
	mux.Handle("POST /v1/fleets/{fleet}/resume", d.api.RequireFleet(api.RoleOperate, "fleet", pa.resumeHandler))
	mux.Handle("POST /v1/tokens", d.api.Require(api.RoleAdmin, d.tokens.createTokenHandler))
	mux.Handle("GET /v1/tokens", d.api.Require(api.RoleAdmin, d.tokens.listTokensHandler))
	mux.Handle("DELETE /v1/tokens/{id}", d.api.Require(api.RoleAdmin, d.tokens.revokeTokenHandler))
}

func (d *Daemon) apiFail(w http.ResponseWriter, err error) { api.WriteFailure(w, d.log, err) }

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
