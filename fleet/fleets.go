package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/rendezvous"
)

type cachedSpec struct {
	generation int64
	fleet      *spec.Fleet
}

// parseRequest parses a spec sent by a client. Diagnostics become an
// *api.SpecError with positions and a rendered form.
func (d *Daemon) parseRequest(req api.ApplyRequest) (*spec.File, error) {
	if strings.TrimSpace(req.Source) == "" {
		return nil, &api.SpecError{Diagnostics: []api.Diagnostic{{Severity: "error", Summary: "Empty spec", Filename: req.Filename}}}
	}
	filename := req.Filename
	if filename == "" {
		filename = "fleet.hcl"
	}
	f, files, diags := d.parse(state.Fleet{Filename: filename, Source: []byte(req.Source), Vars: req.Vars, BaseDir: req.BaseDir, Files: req.Files, Env: req.Env})
	if diags.HasErrors() {
		return nil, specError(files, diags)
	}
	return f, nil
}

// parse parses a spec as the CLI did: with its variable values, its
// directory, the files it read and the env() values it used; never the
// daemon's own filesystem or environment.
func (d *Daemon) parse(in state.Fleet) (*spec.File, map[string]*hcl.File, hcl.Diagnostics) {
	env := make([]string, 0, len(in.Env))
	for k, v := range in.Env {
		env = append(env, k+"="+v)
	}
	readFile := func(path string) ([]byte, error) {
		if c, ok := in.Files[path]; ok {
			return []byte(c), nil
		}
		return nil, errors.New("not sent by the CLI (file() must name files readable where fleetd apply runs)")
	}
	f, diags := spec.Parse(in.Filename, in.Source, spec.Options{Vars: in.Vars, Schema: d.opts.Schema, Env: env, BaseDir: in.BaseDir, ReadFile: readFile})
	var files map[string]*hcl.File
	if f != nil {
		files = f.Files
	}
	return f, files, diags
}

func specError(files map[string]*hcl.File, diags hcl.Diagnostics) *api.SpecError {
	se := &api.SpecError{}
	for _, dg := range diags {
		ad := api.Diagnostic{Severity: "error", Summary: dg.Summary, Detail: dg.Detail}
		if dg.Severity == hcl.DiagWarning {
			ad.Severity = "warning"
		}
		if dg.Subject != nil {
			ad.Filename, ad.Line, ad.Column = dg.Subject.Filename, dg.Subject.Start.Line, dg.Subject.Start.Column
		}
		se.Diagnostics = append(se.Diagnostics, ad)
	}
	var buf bytes.Buffer
	_ = spec.WriteDiagnostics(&buf, files, diags, 100, false)
	se.Rendered = buf.String()
	return se
}

// fleetSpec returns the decoded spec of a stored fleet, cached per generation.
func (d *Daemon) fleetSpec(f state.Fleet) (*spec.Fleet, error) {
	d.specMu.Lock()
	c, ok := d.specCache[f.Name]
	d.specMu.Unlock()
	if ok && c.generation == f.Generation {
		return c.fleet, nil
	}
	file, files, diags := d.parse(f)
	if diags.HasErrors() {
		// A spec that was valid when applied can fail after an upgrade that
		// tightened validation; say so instead of silently dropping the fleet.
		return nil, fmt.Errorf("stored spec of fleet %q no longer parses: %w", f.Name, specError(files, diags))
	}
	for _, fl := range file.Fleets {
		if fl.Name == f.Name {
			d.specMu.Lock()
			d.specCache[f.Name] = cachedSpec{generation: f.Generation, fleet: fl}
			d.specMu.Unlock()
			return fl, nil
		}
	}
	return nil, fmt.Errorf("stored spec of fleet %q does not contain it", f.Name)
}

// sections is how a fleet spec is compared for plans: each named section
// rendered as canonical JSON without source positions.
func sections(f *spec.Fleet) map[string]string {
	enc := func(v any) string {
		b, _ := json.Marshal(v)
		return string(b)
	}
	provs := make([]string, 0, len(f.Providers))
	for _, p := range f.Providers {
		provs = append(provs, p.Name+"="+string(p.Config))
	}
	sort.Strings(provs)
	return map[string]string{
		"nodes":      fmt.Sprintf("min=%d max=%d desired=%d", f.MinNodes, f.MaxNodes, f.DesiredNodes),
		"node":       enc(f.Node),
		"placement":  enc(f.Placement),
		"deadline":   enc([]any{f.Deadline, f.Work}),
		"providers":  strings.Join(provs, "\n"),
		"training":   enc(f.Training),
		"rendezvous": enc(f.Rendezvous),
	}
}

func diffSpecs(old, new *spec.Fleet) []string {
	a, b := sections(old), sections(new)
	var out []string
	for k, v := range b {
		if a[k] != v {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

func providerNames(f *spec.Fleet) []string {
	out := make([]string, 0, len(f.Providers))
	for _, p := range f.Providers {
		out = append(out, p.Name)
	}
	return out
}

// plan computes what applying file would do, reading current state in tx.
func (d *Daemon) plan(tx state.Tx, file *spec.File) (api.Plan, error) {
	var p api.Plan
	for _, fl := range file.Fleets {
		fp := api.FleetPlan{Fleet: fl.Name, MinNodes: fl.MinNodes, MaxNodes: fl.MaxNodes, TargetNodes: fl.TargetNodes()}
		cur, err := tx.Fleet(fl.Name)
		switch {
		case errors.Is(err, state.ErrNotFound):
			fp.Action = api.ActionCreate
			if note, err := recreateNote(tx, fl); err != nil {
				return p, err
			} else if note != "" {
				fp.Notes = append(fp.Notes, note)
			}
		case err != nil:
			return p, err
		default:
			old, err := d.fleetSpec(cur)
			if err != nil {
				fp.Action, fp.Changes = api.ActionUpdate, []string{"stored spec unreadable: replaced"}
			} else if ch := diffSpecs(old, fl); len(ch) > 0 {
				fp.Action, fp.Changes = api.ActionUpdate, ch
			} else {
				fp.Action = api.ActionNoop
			}
			if cur.Destroying {
				fp.Action = api.ActionUpdate
				fp.Changes = append(fp.Changes, "cancel destroy")
			}
			nodes, err := tx.Nodes(fl.Name)
			if err != nil {
				return p, err
			}
			for _, n := range nodes {
				if live(n.State) {
					fp.CurrentNodes++
				}
			}
		}
		if fp.TargetNodes > fp.CurrentNodes {
			fp.Launch = fp.TargetNodes - fp.CurrentNodes
		} else {
			fp.Terminate = fp.CurrentNodes - fp.TargetNodes
		}
		p.Fleets = append(p.Fleets, fp)
	}
	return p, nil
}

// recreateNote tells the user applying a name that had earlier
// incarnations what carries over: nothing of the fleet (nodes, events,
// logs, spend start afresh) but the checkpoint store, which is theirs.
func recreateNote(tx state.Tx, fl *spec.Fleet) (string, error) {
	h, err := readSpendHistory(tx, fl.Name)
	if err != nil || len(h.Incarnations) == 0 {
		return "", err
	}
	last := h.Incarnations[len(h.Incarnations)-1]
	note := fmt.Sprintf("a new incarnation of %q (the last one, %s, was destroyed %s): nodes, events, logs and spend start afresh; the earlier ones stay under their ids (fleetd events -incarnation %s %s)",
		fl.Name, last.ID, last.DestroyedAt.UTC().Format(time.RFC3339), last.ID, fl.Name)
	switch ck := fl.Training.Checkpoint; {
	case ck != nil && ck.Store != "":
		note += fmt.Sprintf("; workers resume from the newest checkpoint in %s, which the store keeps across incarnations", ck.Store)
	case ck != nil:
		note += fmt.Sprintf("; with no checkpoint store, workers resume only if %s is storage the new nodes share with the old ones", ck.Dir)
	}
	return note, nil
}

// live reports whether a node in state s counts toward the fleet's size.
func live(s state.NodeState) bool {
	switch s {
	case state.NodeTerminated, state.NodeFailed, state.NodeTerminating, state.NodeDraining:
		return false
	}
	return true
}

// Plan implements api.Backend.
func (d *Daemon) Plan(ctx context.Context, req api.ApplyRequest) (api.Plan, error) {
	file, err := d.parseRequest(req)
	if err != nil {
		return api.Plan{}, err
	}
	if err := d.checkReachable(file); err != nil {
		return api.Plan{}, err
	}
	if err := d.checkAgentBinaries(ctx, file); err != nil {
		return api.Plan{}, err
	}
	var p api.Plan
	err = d.store.View(ctx, func(tx state.Tx) error {
		var err error
		p, err = d.plan(tx, file)
		return err
	})
	if err != nil {
		return p, err
	}
	// Provider calls happen outside the transaction: they can be slow.
	for i, fl := range file.Fleets {
		d.planScaling(fl, &p.Fleets[i]) // the autoscaler's target first: offerings are planned for it
		if err := d.planOfferings(ctx, fl, &p.Fleets[i]); err != nil {
			return api.Plan{}, err
		}
	}
	return p, nil
}

// planScaling adds the autoscaler's view to a fleet's plan: its current
// decision and model for a fleet that runs, how it will start otherwise.
func (d *Daemon) planScaling(fl *spec.Fleet, fp *api.FleetPlan) {
	if fp.Action != api.ActionCreate {
		if _, si := d.trainingInfo(fl.Name, d.now()); si != nil {
			fp.Scaling = si
			if fl.DesiredNodes == 0 && fl.Placement.ScalePolicy() == spec.ScaleGoodput && si.Target >= fl.MinNodes && si.Target <= fl.MaxNodes {
				fp.TargetNodes = si.Target
				fp.Launch, fp.Terminate = max(fp.TargetNodes-fp.CurrentNodes, 0), max(fp.CurrentNodes-fp.TargetNodes, 0)
			}
			return
		}
	}
	si := &api.ScalingInfo{Policy: string(fl.Placement.ScalePolicy()), Target: fl.TargetNodes()}
	switch {
	case fl.DesiredNodes > 0:
		si.Reason, si.Explain = "pinned", fmt.Sprintf("desired_nodes pins %d nodes", fl.DesiredNodes)
	case fl.Placement.ScalePolicy() == spec.ScaleMax:
		si.Reason, si.Explain = "max", fmt.Sprintf("placement.scale = \"max\": %d nodes (max_nodes)", fl.MaxNodes)
	case fl.MinNodes == fl.MaxNodes:
		si.Reason, si.Explain = "fixed", fmt.Sprintf("min_nodes = max_nodes = %d", fl.MaxNodes)
	default:
		si.Reason = "starting"
		si.Explain = fmt.Sprintf("starts at %d nodes (max_nodes), then sizes the fleet within [%d, %d] by the throughput its workers report (FLEETD_PROGRESS) and the price",
			fl.MaxNodes, fl.MinNodes, fl.MaxNodes)
	}
	fp.Scaling = si
}

// Apply implements api.Backend: store every fleet of the file (a new
// generation when changed) and record the change in the event log, in one
// durable transaction.
func (d *Daemon) Apply(ctx context.Context, req api.ApplyRequest) (api.ApplyResponse, error) {
	file, err := d.parseRequest(req)
	if err != nil {
		return api.ApplyResponse{}, err
	}
	// Before anything else: nodes that could not reach the daemon would
	// boot, never join, and be replaced in a loop at the cloud's prices.
	if err := d.checkReachable(file); err != nil {
		return api.ApplyResponse{}, err
	}
	if err := d.checkAgentBinaries(ctx, file); err != nil {
		return api.ApplyResponse{}, err
	}
	if !req.SkipCheck {
		// The cheap preflight first: a missing image or a denied launch
		// permission refuses the apply here, before anything is stored, with
		// the same rows `fleetd check` prints. It runs outside the
		// transaction (provider calls are slow), so it checks the plan as of now.
		var p api.Plan
		if err := d.store.View(ctx, func(tx state.Tx) error {
			var err error
			p, err = d.plan(tx, file)
			return err
		}); err != nil {
			return api.ApplyResponse{}, err
		}
		if err := d.preflightApply(ctx, file, p); err != nil {
			return api.ApplyResponse{}, err
		}
	}
	var resp api.ApplyResponse
	err = d.update(ctx, func(tx state.Tx) error {
		p, err := d.plan(tx, file)
		if err != nil {
			return err
		}
		resp.Plan = p
		for i, fl := range file.Fleets {
			fp := p.Fleets[i]
			var stored state.Fleet
			if fp.Action == api.ActionNoop {
				if stored, err = tx.Fleet(fl.Name); err != nil {
					return err
				}
			} else {
				stored, err = tx.PutFleet(state.Fleet{Name: fl.Name, Filename: req.Filename, Source: []byte(req.Source), Vars: req.Vars,
					BaseDir: req.BaseDir, Files: req.Files, Env: req.Env})
				if err != nil {
					return err
				}
				msg := fmt.Sprintf("fleet %s %sd (generation %d, target %d nodes)", fl.Name, fp.Action, stored.Generation, fl.TargetNodes())
				if len(fp.Changes) > 0 {
					msg += ": changed " + strings.Join(fp.Changes, ", ")
				}
				if _, err := tx.AppendEvent(state.Event{Fleet: fl.Name, Type: "fleet.applied", Message: msg,
					Data: map[string]string{"action": string(fp.Action), "generation": fmt.Sprint(stored.Generation)}}); err != nil {
					return err
				}
			}
			sum, err := d.summary(tx, stored, fl)
			if err != nil {
				return err
			}
			resp.Fleets = append(resp.Fleets, sum)
		}
		return nil
	})
	if err != nil {
		return api.ApplyResponse{}, err
	}
	for i := range resp.Fleets {
		resp.Fleets[i] = d.withLive(resp.Fleets[i])
	}
	d.kick()
	d.intake.Kick()
	return resp, nil
}

// summary builds the API view of a fleet.
func (d *Daemon) summary(tx state.Tx, f state.Fleet, fl *spec.Fleet) (api.FleetSummary, error) {
	s := api.FleetSummary{Name: f.Name, Generation: f.Generation, Incarnation: f.Incarnation, Destroying: f.Destroying, NodesByState: map[string]int{}, CreatedAt: f.CreatedAt, UpdatedAt: f.UpdatedAt}
	if fl != nil {
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
		od, ok := d.onDemandPrice(n.Offering)
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
	h, err := readSpendHistory(tx, f.Name)
	if err != nil {
		return s, err
	}
	forgotten, err := readSpendForgotten(tx, f.Name)
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
func (d *Daemon) withLive(s api.FleetSummary) api.FleetSummary {
	if d.cl != nil && !d.cl.isLeader() {
		// A follower answering from etcd (no leader reachable): its
		// in-memory views are not current, so only stored state is shown.
		return s
	}
	if d.rz() != nil {
		if st, err := d.rz().Status(s.Name); err == nil {
			s.Rendezvous = &api.RendezvousInfo{Round: st.Round, State: string(st.State), Nodes: st.Nodes, WorldSize: st.WorldSize}
			if st.MasterAddr != "" {
				s.Rendezvous.Master = fmt.Sprintf("%s:%d", st.MasterAddr, st.MasterPort)
			}
		}
	}
	s.Interruptions, _ = d.tally.interruptions(s.Name)
	s.AlertCount = len(d.alerts(s.Name))
	d.currentPrices(&s)
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
func (d *Daemon) Status(ctx context.Context) (api.Status, error) {
	st := api.Status{APIVersion: api.APIVersion, Version: d.opts.Version, DaemonID: d.daemonID, StartedAt: d.started, Time: d.now(), Fleets: []api.FleetSummary{}}
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
			fl, err := d.fleetSpec(f)
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
func (d *Daemon) Fleet(ctx context.Context, name string) (api.FleetDetail, error) {
	var det api.FleetDetail
	err := d.store.View(ctx, func(tx state.Tx) error {
		f, err := tx.Fleet(name)
		if err != nil {
			return fmt.Errorf("fleet %q: %w", name, err)
		}
		fl, _ := d.fleetSpec(f)
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
	det.Recoveries, det.Alerts = d.recoveries(name), d.alerts(name)
	_, det.RecentInterruptions = d.tally.interruptions(name)
	return det, nil
}

// withMembers adds what the rendezvous knows of the fleet's nodes: their
// place in it, the round they are assigned in, their agents' last
// heartbeat and what it said of the workers. The node records only hold
// the agent's last registration.
func (d *Daemon) withMembers(fleet string, nodes []api.NodeInfo) {
	if d.rz() == nil || (d.cl != nil && !d.cl.isLeader()) {
		return
	}
	st, err := d.rz().Status(fleet)
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
		AgeSeconds: now.Sub(n.CreatedAt).Seconds(), CreatedAt: n.CreatedAt}
	if !n.LastHeartbeat.IsZero() {
		hb := n.LastHeartbeat
		ni.LastHeartbeat = &hb
	}
	return ni
}

// Destroy implements api.Backend: the fleet is marked destroying; the
// reconciler terminates its nodes and deletes the record when none is left.
func (d *Daemon) Destroy(ctx context.Context, name string) (api.FleetSummary, error) {
	var sum api.FleetSummary
	err := d.update(ctx, func(tx state.Tx) error {
		f, err := tx.Fleet(name)
		if err != nil {
			return fmt.Errorf("fleet %q: %w", name, err)
		}
		if !f.Destroying {
			f.Destroying = true
			if f, err = tx.PutFleet(f); err != nil {
				return err
			}
			if _, err := tx.AppendEvent(state.Event{Fleet: name, Type: "fleet.destroying", Message: fmt.Sprintf("fleet %s: destroy requested", name)}); err != nil {
				return err
			}
		}
		fl, _ := d.fleetSpec(f)
		sum, err = d.summary(tx, f, fl)
		return err
	})
	if err != nil {
		return sum, err
	}
	d.kick()
	return d.withLive(sum), nil
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
