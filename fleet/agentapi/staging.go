package agentapi

import (
	"errors"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/fleetd/fleetd/agentwire"
	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
)

// stagingRegistry keeps each node's latest staging report per data block,
// in memory: it matters while a node copies and for peers to find a
// finished copy; a restarted daemon learns it again from the agents'
// next reports (a finished node reports "disk" when its agent restarts).
type stagingRegistry struct {
	mu sync.Mutex
	// by fleet, node, mount path.
	m map[string]map[string]map[string]stagingEntry
}

type stagingEntry struct {
	r  api.StagingReport
	at time.Time
}

// staging takes an agent's staging report.
func (a *API) staging(w http.ResponseWriter, r *http.Request) {
	var req api.StagingReport
	if !api.DecodeBody(w, r, &req) {
		return
	}
	if req.MountPath == "" || len(req.Source) > 2048 || len(req.Error) > 4096 || req.Bytes < 0 || req.Total < 0 {
		api.WriteError(w, http.StatusBadRequest, errors.New("staging: mount_path required; bytes and total not negative"))
		return
	}
	fleetName, nodeID := r.PathValue("fleet"), r.PathValue("node")
	s := &a.stagings
	s.mu.Lock()
	if s.m == nil {
		s.m = map[string]map[string]map[string]stagingEntry{}
	}
	if s.m[fleetName] == nil {
		s.m[fleetName] = map[string]map[string]stagingEntry{}
	}
	if s.m[fleetName][nodeID] == nil {
		s.m[fleetName][nodeID] = map[string]stagingEntry{}
	}
	s.m[fleetName][nodeID][req.MountPath] = stagingEntry{r: req, at: a.now()}
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// Staging is a node's latest staging reports, by mount path; nil when it
// stages nothing.
func (a *API) Staging(fleetName, node string) []api.StagingReport {
	if a == nil {
		return nil
	}
	a.stagings.mu.Lock()
	defer a.stagings.mu.Unlock()
	var out []api.StagingReport
	for _, e := range a.stagings.m[fleetName][node] {
		out = append(out, e.r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].MountPath < out[j].MountPath })
	return out
}

// sourcePerGB is the transfer price per GB of reading the staged source
// (as reports name it, redacted) from node me's region: the egress table
// placement prices data with; 0 when the fleet's spec does not say.
func (a *API) sourcePerGB(f state.Fleet, src string, me state.Node) float64 {
	fl, err := a.deps.FleetSpec(f)
	if err != nil {
		return 0
	}
	d := placement.DataCostFor(fl)
	if d == nil {
		return 0
	}
	for _, s := range d.Sets {
		if redactStore(s.Data.Source) == src {
			perGB, _ := d.Egress.Rate(s.Location(), placement.Location{Cloud: me.Offering.Provider, Region: me.Offering.Region})
			return perGB
		}
	}
	return 0
}

// dataConfig is training.data as the agent needs it.
func dataConfig(data []spec.Data) []api.DataConfig {
	out := make([]api.DataConfig, 0, len(data))
	for _, d := range data {
		out = append(out, api.DataConfig{Source: d.Source, MountPath: d.MountPath, Mode: d.Mode, SizeGB: d.SizeGB})
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// peerGrantFor is how long a peer grant lasts: long enough for a large
// copy to list and open every file.
const peerGrantFor = 6 * time.Hour

// stagingPeer points a node at a peer of its zone with a finished copy of
// a staged source. Same zone only: a peer there is reached without a
// transfer charge (a bucket read from another region or cloud pays
// egress), and a peer's local disk and NIC outpace a bucket's per-client
// throughput; across zones the bucket is as cheap and needs no peer.
func (a *API) stagingPeer(w http.ResponseWriter, r *http.Request) {
	var req api.PeerStagingRequest
	if !api.DecodeBody(w, r, &req) {
		return
	}
	fleetName, nodeID := r.PathValue("fleet"), r.PathValue("node")
	var me state.Node
	var nodes []state.Node
	var f state.Fleet
	err := a.deps.View(r.Context(), func(tx state.Tx) error {
		var err error
		if f, err = tx.Fleet(fleetName); err != nil {
			return err
		}
		if me, err = tx.Node(fleetName, nodeID); err != nil {
			return err
		}
		nodes, err = tx.Nodes(fleetName)
		return err
	})
	if err != nil {
		a.fail(w, err)
		return
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].ID < nodes[j].ID })
	src := redactStore(req.Source)
	now := a.now()
	a.stagings.mu.Lock()
	defer a.stagings.mu.Unlock()
	for _, c := range nodes {
		if c.ID == me.ID || (c.State != state.NodeRunning && c.State != state.NodeJoined) ||
			c.Offering.Provider != me.Offering.Provider || c.Offering.Zone != me.Offering.Zone || c.Offering.Zone == "" {
			continue
		}
		e, ok := a.stagings.m[fleetName][c.ID][req.MountPath]
		if !ok || !e.r.Done || e.r.Error != "" || e.r.Source != src || e.r.PeerURL == "" {
			continue
		}
		// Peer or source: by the copy's expected cost at the rates the
		// fleet's nodes measured (the node's paid time while it copies,
		// and the source's transfer price to its region).
		var reports []api.StagingReport
		for _, blocks := range a.stagings.m[fleetName] {
			if b, ok := blocks[req.MountPath]; ok && b.r.Source == src {
				reports = append(reports, b.r)
			}
		}
		peer, why := preferPeer(float64(e.r.Total), me.Offering.PricePerHour, a.sourcePerGB(f, src, me), measuredRates(reports))
		if !peer {
			api.WriteError(w, http.StatusNotFound, fmt.Errorf("copy %s from the source, not from %s: it is expected to cost less (%s)", src, c.ID, why))
			return
		}
		exp := now.Add(peerGrantFor).Unix()
		mac := agentwire.PeerMAC(NodeToken(a.secret, fleetName, c.ID, c.CreatedAt), me.ID, exp)
		api.WriteJSON(w, http.StatusOK, api.PeerStaging{Node: c.ID, URL: e.r.PeerURL,
			Grant:  agentwire.PeerGrant{Requester: me.ID, Expires: exp, MAC: mac},
			Reason: fmt.Sprintf("%s has %s staged in zone %s, at no transfer charge: %s", c.ID, src, c.Offering.Zone, why)})
		return
	}
	api.WriteError(w, http.StatusNotFound, fmt.Errorf("no node in zone %s has a finished copy of %s", me.Offering.Zone, src))
}
