package fleet

// What the API and /metrics show of fleets: summaries from the store plus
// what lives in memory (the controller's views, the rendezvous, stats).

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/fleetd/fleetd/fleet/agentapi"
	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/controller"
	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/spend"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/fleet/stats"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/rendezvous"
)

// fleetViews builds the API's views of fleets (status, fleet detail,
// summaries in plans and applies) from the store and what lives in
// memory: the controller's views, the rendezvous, the stats, the agent
// API's checkpoints. It writes nothing.
type fleetViews struct {
	store    Store
	ctrl     *controller.Controller
	stats    *stats.Stats
	rdzv     *rdzvHost
	agentAPI *agentapi.API
	cl       *clusterState
	log      *slog.Logger
	now      func() time.Time
	spec     func(state.Fleet) (*spec.Fleet, error)
	moveCost func(*spec.Fleet) *placement.MoveCost

	version, daemonID string
	started           time.Time
}

// summary builds the API view of a fleet.
func (d *fleetViews) summary(tx state.Tx, f state.Fleet, fl *spec.Fleet) (api.FleetSummary, error) {
	s := api.FleetSummary{Name: f.Name, Generation: f.Generation, Incarnation: f.Incarnation, Destroying: f.Destroying, NodesByState: map[string]int{}, CreatedAt: f.CreatedAt, UpdatedAt: f.UpdatedAt}
	if fl != nil {
		s.Project = fl.ProjectName()
		s.MinNodes, s.MaxNodes, s.TargetNodes, s.Providers = fl.MinNodes, fl.MaxNodes, fl.TargetNodes(), providerNames(fl)
		s.Checkpoint = d.agentAPI.CheckpointStatus(f.Name, fl.Training.Checkpoint, d.now())
		if s.Checkpoint != nil {
			s.Checkpoint.Moves = checkpointMoves(d.moveCost(fl), fl.TargetNodes())
		}
	}
	if f.Destroying || f.Completed {
		s.TargetNodes = 0
	}
	s.Completed, s.Succeeded, s.CompletedDetail = f.Completed, f.Succeeded, f.CompletedDetail
	nodes, err := tx.Nodes(f.Name)
	if err != nil {
		return s, err
	}
	now := d.now()
	for _, n := range nodes {
		s.NodesByState[string(n.State)]++
		// Unknown on-demand prices count at the node's own price: savings
		// are never claimed without a price to compare with.
		od, ok := d.stats.OnDemandPrice(n.Offering)
		if !ok {
			od = n.Offering.PricePerHour
		}
		if n.State != state.NodeTerminated && n.State != state.NodeFailed && n.State != state.NodeRequested {
			s.CostPerHour += n.Offering.PricePerHour
			s.OnDemandCostPerHour += od
			notePriceAge(&s, n.Offering)
		}
		if n.InstanceID == "" {
			continue
		}
		end := now
		if n.State == state.NodeTerminated || n.State == state.NodeFailed {
			end = n.UpdatedAt
		}
		hours := end.Sub(n.CreatedAt).Hours()
		if hours > 0 {
			s.SpendUSD += hours * n.Offering.PricePerHour
			s.OnDemandEquivalentUSD += hours * od
		}
	}
	s.SavingsUSD = s.OnDemandEquivalentUSD - s.SpendUSD
	h, err := spend.ReadHistory(tx, f.Name)
	if err != nil {
		return s, err
	}
	forgotten, err := spend.ReadForgotten(tx, f.Name)
	if err != nil {
		return s, err
	}
	s.SpendNameTotalUSD = h.TotalUSD + forgotten + s.SpendUSD
	return s, nil
}

// withLive adds what lives in memory (rendezvous, interruption tally,
// alerts) to a summary. It must run after the store transaction that built
// the summary has ended: those parts take locks that are held across store
// writes (the rendezvous saves under its fleet lock), so taking them inside
// a transaction can deadlock the daemon.
func (d *fleetViews) withLive(s api.FleetSummary) api.FleetSummary {
	if d.cl != nil && !d.cl.isLeader() {
		// A follower answering from etcd (no leader reachable): its
		// in-memory views are not current, so only stored state is shown.
		return s
	}
	if d.rdzv.rz() != nil {
		if st, err := d.rdzv.rz().Status(s.Name); err == nil {
			s.Rendezvous = &api.RendezvousInfo{Round: st.Round, State: string(st.State), Nodes: st.Nodes, WorldSize: st.WorldSize}
			if st.MasterAddr != "" {
				s.Rendezvous.Master = fmt.Sprintf("%s:%d", st.MasterAddr, st.MasterPort)
			}
		}
	}
	s.Interruptions, _ = d.stats.Tally.Interruptions(s.Name)
	s.AlertCount = len(d.alerts(s.Name))
	s.Allocation = d.allocationOf(s.Name)
	d.stats.CurrentPrices(&s)
	if !s.Completed && !s.Destroying {
		s.Training, s.Scaling = d.trainingInfo(s.Name, d.now())
		if s.Training != nil {
			s.Training.History = nil // FleetDetail only
		}
		if s.Scaling != nil {
			s.TargetNodes = s.Scaling.Target
			s.Scaling.Options, s.Scaling.Model = nil, nil
		}
	} else if s.Completed {
		// The finished job's last progress stays visible.
		s.Training, _ = d.trainingInfo(s.Name, d.now())
		if s.Training != nil {
			s.Training.History, s.Training.ETA, s.Training.ETASeconds = nil, nil, 0
		}
	}
	return s
}

// Status implements api.Backend.
func (d *fleetViews) Status(ctx context.Context) (api.Status, error) {
	st := api.Status{APIVersion: api.APIVersion, Version: d.version, DaemonID: d.daemonID, StartedAt: d.started, Time: d.now(), Fleets: []api.FleetSummary{}}
	// Read before the snapshot: an event after this seq may already be in
	// it (a harmless refetch for followers), but none is missed.
	stats, err := d.store.Stats(ctx)
	if err != nil {
		return st, err
	}
	st.LastEventSeq = stats.LastEventSeq
	if d.cl != nil {
		// Status is served by the leader (followers forward it), or by a
		// follower from etcd while no leader is reachable: then it names
		// no leader.
		st.Server = d.cl.cfg.Name
		if d.cl.isLeader() {
			st.Leader = d.cl.cfg.Name
		}
		if r, ok := ctx.Value(forwardedByKey{}).(string); ok && r != "" {
			st.Server = r
		}
	}
	err = d.store.View(ctx, func(tx state.Tx) error {
		fleets, err := tx.Fleets()
		if err != nil {
			return err
		}
		for _, f := range fleets {
			fl, err := d.spec(f)
			if err != nil {
				d.log.Warn("fleet spec unreadable", "fleet", f.Name, "err", err)
			}
			s, err := d.summary(tx, f, fl)
			if err != nil {
				return err
			}
			st.Fleets = append(st.Fleets, s)
		}
		return nil
	})
	for i := range st.Fleets {
		st.Fleets[i] = d.withLive(st.Fleets[i])
	}
	return st, err
}

// Fleet implements api.Backend.
func (d *fleetViews) Fleet(ctx context.Context, name string) (api.FleetDetail, error) {
	var det api.FleetDetail
	err := d.store.View(ctx, func(tx state.Tx) error {
		f, err := tx.Fleet(name)
		if err != nil {
			return fmt.Errorf("fleet %q: %w", name, err)
		}
		fl, _ := d.spec(f)
		if det.FleetSummary, err = d.summary(tx, f, fl); err != nil {
			return err
		}
		det.Filename, det.Source = f.Filename, string(f.Source)
		nodes, err := tx.Nodes(name)
		if err != nil {
			return err
		}
		det.Nodes = make([]api.NodeInfo, 0, len(nodes))
		now := d.now()
		for _, n := range nodes {
			det.Nodes = append(det.Nodes, nodeInfo(n, now))
		}
		return nil
	})
	if err != nil {
		return det, err
	}
	det.FleetSummary = d.withLive(det.FleetSummary)
	if det.Training != nil || det.Scaling != nil {
		// The detail carries the history, the options and the model.
		ti, si := d.trainingInfo(name, d.now())
		if det.Training != nil && ti != nil {
			det.Training.History = ti.History
		}
		if det.Scaling != nil && si != nil {
			det.Scaling.Options, det.Scaling.Model = si.Options, si.Model
		}
	}
	d.withMembers(name, det.Nodes)
	for i := range det.Nodes {
		det.Nodes[i].Staging = d.agentAPI.Staging(name, det.Nodes[i].ID)
	}
	det.Recoveries, det.Alerts = d.stats.Recoveries(name), d.alerts(name)
	_, det.RecentInterruptions = d.stats.Tally.Interruptions(name)
	return det, nil
}

// withMembers adds what the rendezvous knows of the fleet's nodes: their
// place in it, the round they are assigned in, their agents' last
// heartbeat and what it said of the workers. The node records only hold
// the agent's last registration.
func (d *fleetViews) withMembers(fleet string, nodes []api.NodeInfo) {
	if d.rdzv.rz() == nil || (d.cl != nil && !d.cl.isLeader()) {
		return
	}
	st, err := d.rdzv.rz().Status(fleet)
	if err != nil {
		return
	}
	byID := make(map[string]*api.NodeInfo, len(nodes))
	for i := range nodes {
		byID[nodes[i].ID] = &nodes[i]
	}
	for _, m := range st.Members {
		n := byID[m.NodeID]
		if n == nil {
			continue
		}
		n.RendezvousState, n.Workers, n.WorkerRound = string(m.State), m.Workers, m.WorkerRound
		if hb := m.LastHeartbeat; !hb.IsZero() && (n.LastHeartbeat == nil || hb.After(*n.LastHeartbeat)) {
			n.LastHeartbeat = &hb
		}
		if m.State == rendezvous.NodeAssigned {
			n.Round = int64(st.Round)
		}
	}
	for _, ex := range st.Excluded {
		if n := byID[ex.NodeID]; n != nil {
			n.RendezvousState = string(rendezvous.NodeExcluded)
		}
	}
}

func nodeInfo(n state.Node, now time.Time) api.NodeInfo {
	ni := api.NodeInfo{ID: n.ID, State: n.State, Reason: n.Reason, Provider: n.Offering.Provider, Region: n.Offering.Region,
		Zone: n.Offering.Zone, InstanceType: n.Offering.InstanceType, CapacityType: string(n.Offering.CapacityType),
		PricePerHour: n.Offering.PricePerHour, InstanceID: n.InstanceID, Address: n.Address, Round: n.Round,
		AgeSeconds: now.Sub(n.CreatedAt).Seconds(), CreatedAt: n.CreatedAt, Network: nodeNetwork(n)}
	if !n.LastHeartbeat.IsZero() {
		hb := n.LastHeartbeat
		ni.LastHeartbeat = &hb
	}
	return ni
}

// nodeNetwork is the fast path a node's launch asked for, in the agent's
// words (agent.netPath.String) so status and FLEETD_NETWORK read alike.
func nodeNetwork(n state.Node) string {
	var parts []string
	if n.Network.Fabric && n.Offering.Network.Fast() {
		parts = append(parts, fmt.Sprintf("%s ×%d", n.Offering.Network.Fabric, n.Offering.Network.Interfaces))
	}
	if g := n.Network.GroupIn(n.Offering.Zone); g != "" {
		kind := "placement group "
		if n.Offering.Provider == "gcp" {
			kind = "compact placement policy "
		}
		parts = append(parts, kind+g)
	}
	return strings.Join(parts, ", ")
}

// notePriceAge folds a live node's price source and date into the
// summary: the oldest date, the distinct sources in order of appearance.
func notePriceAge(s *api.FleetSummary, o providers.Offering) {
	if o.PriceSource != "" && !slices.Contains(s.PriceSources, o.PriceSource) {
		s.PriceSources = append(s.PriceSources, o.PriceSource)
	}
	if !o.PriceAsOf.IsZero() && (s.PricesAsOf.IsZero() || o.PriceAsOf.Before(s.PricesAsOf)) {
		s.PricesAsOf = o.PriceAsOf
	}
}

// alerts returns a fleet's current alerts: the reconciler's, repeated
// boot failures from the event log, and the checkpoint store's.
func (d *fleetViews) alerts(fleet string) []api.AlertInfo {
	out := []api.AlertInfo{}
	if v, ok := d.ctrl.View(fleet); ok {
		for _, a := range v.Alerts {
			out = append(out, api.AlertInfo{Kind: a.Kind, Subject: a.Subject, Message: a.Message})
		}
	}
	if a, ok := d.stats.Tally.BootAlert(fleet, d.now()); ok {
		out = append(out, a)
	}
	out = append(out, d.agentAPI.CheckpointAlerts(fleet)...)
	return out
}
