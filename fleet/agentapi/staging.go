package agentapi

import (
	"context"
	"encoding/json"
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

// stagingRegistry keeps each node's latest staging report per data block.
// The map is the hot copy status and peer lookups read; the state store
// holds a copy (state.StagingRecord) so status still shows a copy's
// progress and its peer-vs-bucket bytes after a daemon restart
// (LoadStaging). Agents report every second while copying, so a report is
// written through at most every stagingPersistEvery per block, and always
// when it starts, finishes, fails or changes where it copies from: what a
// restart loses is a few seconds of progress the agent reports again.
type stagingRegistry struct {
	mu sync.Mutex
	// by fleet, node, mount path.
	m map[string]map[string]map[string]stagingEntry
}

type stagingEntry struct {
	r  api.StagingReport
	at time.Time
	// persisted is when r's block was last written to the store.
	persisted time.Time
}

// stagingPersistEvery bounds how often one block's progress is written to
// the store while it copies.
const stagingPersistEvery = 10 * time.Second

// put records e (the caller holds mu).
func (s *stagingRegistry) put(fleetName, nodeID string, e stagingEntry) {
	if s.m == nil {
		s.m = map[string]map[string]map[string]stagingEntry{}
	}
	if s.m[fleetName] == nil {
		s.m[fleetName] = map[string]map[string]stagingEntry{}
	}
	if s.m[fleetName][nodeID] == nil {
		s.m[fleetName][nodeID] = map[string]stagingEntry{}
	}
	s.m[fleetName][nodeID][e.r.MountPath] = e
}

// persistDue: the store's copy of prev should be replaced by r.
func persistDue(prev stagingEntry, ok bool, r api.StagingReport, now time.Time) bool {
	return !ok || prev.persisted.IsZero() || r.Done != prev.r.Done || r.Error != prev.r.Error ||
		r.From != prev.r.From || r.Source != prev.r.Source || now.Sub(prev.persisted) >= stagingPersistEvery
}

// staging takes an agent's staging report.
func (a *API) staging(w http.ResponseWriter, r *http.Request) {
	var req api.StagingReport
	if !api.DecodeBody(w, r, &req) {
		return
	}
	if req.MountPath == "" || len(req.MountPath) > 1024 || len(req.Source) > 2048 || len(req.Error) > 4096 || req.Bytes < 0 || req.Total < 0 {
		api.WriteError(w, http.StatusBadRequest, errors.New("staging: mount_path required; bytes and total not negative"))
		return
	}
	fleetName, nodeID := r.PathValue("fleet"), r.PathValue("node")
	now := a.now()
	s := &a.stagings
	s.mu.Lock()
	prev, ok := s.m[fleetName][nodeID][req.MountPath]
	e := stagingEntry{r: req, at: now, persisted: prev.persisted}
	due := persistDue(prev, ok, req, now)
	if due {
		// Claimed now, so concurrent reports of the block do not all
		// write; a failed write clears it below.
		e.persisted = now
	}
	s.put(fleetName, nodeID, e)
	s.mu.Unlock()
	if due {
		if err := a.persistStaging(r.Context(), fleetName, nodeID, req); err != nil {
			s.mu.Lock()
			if cur, ok := s.m[fleetName][nodeID][req.MountPath]; ok && cur.persisted.Equal(now) {
				cur.persisted = time.Time{}
				s.m[fleetName][nodeID][req.MountPath] = cur
			}
			if errors.Is(err, state.ErrNotFound) {
				// The node is gone: so are its reports.
				delete(s.m[fleetName], nodeID)
			}
			s.mu.Unlock()
			a.fail(w, err)
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// persistStaging writes r to the store and drops the reports of the
// fleet's nodes that are gone from the hot copy (the store dropped its own
// with each node).
func (a *API) persistStaging(ctx context.Context, fleetName, nodeID string, r api.StagingReport) error {
	raw, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode staging report: %w", err)
	}
	var live map[string]bool
	start := a.now()
	err = a.deps.Update(ctx, func(tx state.Tx) error {
		if err := tx.PutStaging(state.StagingRecord{Fleet: fleetName, Node: nodeID, MountPath: r.MountPath, Report: raw}); err != nil {
			return err
		}
		nodes, err := tx.SharedNodes(fleetName)
		if err != nil {
			return err
		}
		live = make(map[string]bool, len(nodes))
		for _, n := range nodes {
			live[n.ID] = true
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store staging report of %s: %w", nodeID, err)
	}
	a.stagings.mu.Lock()
	for id, blocks := range a.stagings.m[fleetName] {
		// A node that reported after the read may be newer than it.
		if !live[id] && !reportedSince(blocks, start) {
			delete(a.stagings.m[fleetName], id)
		}
	}
	a.stagings.mu.Unlock()
	return nil
}

func reportedSince(blocks map[string]stagingEntry, t time.Time) bool {
	for _, e := range blocks {
		if !e.at.Before(t) {
			return true
		}
	}
	return false
}

// LoadStaging reads the staging reports the store kept into the hot copy,
// so a restarted daemon shows where each node's copy stood. A report the
// agent sent since wins over the stored one.
func (a *API) LoadStaging(ctx context.Context) error {
	recs, err := state.Read(ctx, a.deps, func(tx state.Tx) ([]state.StagingRecord, error) {
		fleets, err := tx.Fleets()
		if err != nil {
			return nil, err
		}
		var recs []state.StagingRecord
		for _, f := range fleets {
			rs, err := tx.Stagings(f.Name)
			if err != nil {
				return nil, err
			}
			recs = append(recs, rs...)
		}
		return recs, nil
	})
	if err != nil {
		return fmt.Errorf("load staging reports: %w", err)
	}
	s := &a.stagings
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rec := range recs {
		var r api.StagingReport
		if err := json.Unmarshal(rec.Report, &r); err != nil {
			a.log.Warn("skipping an unreadable stored staging report", "fleet", rec.Fleet, "node", rec.Node, "mount_path", rec.MountPath, "err", err)
			continue
		}
		if _, ok := s.m[rec.Fleet][rec.Node][r.MountPath]; ok {
			continue
		}
		s.put(rec.Fleet, rec.Node, stagingEntry{r: r, at: rec.UpdatedAt, persisted: rec.UpdatedAt})
	}
	return nil
}

// ForgetStaging drops a destroyed fleet's reports from the hot copy (the
// store dropped them with the fleet).
func (a *API) ForgetStaging(fleetName string) {
	a.stagings.mu.Lock()
	delete(a.stagings.m, fleetName)
	a.stagings.mu.Unlock()
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
	perGB := a.sourcePerGB(f, src, me) // parses the spec: not under the lock
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
		peer, why := preferPeer(float64(e.r.Total), me.Offering.PricePerHour, perGB, measuredRates(reports))
		if !peer {
			api.WriteError(w, http.StatusNotFound, fmt.Errorf("copy %s from the source, not from %s: the source is expected to cost less (%s)", src, c.ID, why))
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
