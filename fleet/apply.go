package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/spend"
	"github.com/fleetd/fleetd/fleet/state"
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
	// A new spec is checked against the daemon's projects; a stored one
	// (Spec) is not: a project deleted while its fleets run must not
	// stop their passes.
	f, files, diags := d.parse(state.Fleet{Filename: filename, Source: []byte(req.Source), Vars: req.Vars, BaseDir: req.BaseDir, Files: req.Files, Env: req.Env}, d.projects.Config())
	if diags.HasErrors() {
		return nil, specError(files, diags)
	}
	return f, nil
}

// parse parses a spec as the CLI did: with its variable values, its
// directory, the files it read and the env() values it used; never the
// daemon's own filesystem or environment.
func (d *Daemon) parse(in state.Fleet, projects spec.ProjectSet) (*spec.File, map[string]*hcl.File, hcl.Diagnostics) {
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
	f, diags := spec.Parse(in.Filename, in.Source, spec.Options{Vars: in.Vars, Schema: d.opts.Schema, Env: env, BaseDir: in.BaseDir, ReadFile: readFile, Projects: projects})
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
	file, files, diags := d.parse(f, nil)
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
		// A raised budget or a move to another project is an update.
		"project": f.ProjectName(),
		"budget":  enc(f.Budget),
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

// planFile computes what applying file would do, reading current state in tx.
func (d *Daemon) planFile(tx state.Tx, file *spec.File) (api.Plan, error) {
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
	h, err := spend.ReadHistory(tx, fl.Name)
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
	file, err := d.check.admit(ctx, req, d.scope)
	if err != nil {
		return api.Plan{}, err
	}
	p, err := state.Read(ctx, d.store, func(tx state.Tx) (api.Plan, error) { return d.planFile(tx, file) })
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
	file, err := d.check.admit(ctx, req, d.scope)
	if err != nil {
		return api.ApplyResponse{}, err
	}
	if !req.SkipCheck {
		// The cheap preflight first: a missing image or a denied launch
		// permission refuses the apply here, before anything is stored, with
		// the same rows `fleetd check` prints. It runs outside the
		// transaction (provider calls are slow), so it checks the plan as of now.
		p, err := state.Read(ctx, d.store, func(tx state.Tx) (api.Plan, error) { return d.planFile(tx, file) })
		if err != nil {
			return api.ApplyResponse{}, err
		}
		if err := d.check.preflightApply(ctx, file, p); err != nil {
			return api.ApplyResponse{}, err
		}
	}
	var resp api.ApplyResponse
	err = d.store.Update(ctx, func(tx state.Tx) error {
		p, err := d.planFile(tx, file)
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
	d.ctrl.Kick()
	d.intake.Kick()
	return resp, nil
}

// Destroy implements api.Backend: the fleet is marked destroying; the
// reconciler terminates its nodes and deletes the record when none is left.
func (d *Daemon) Destroy(ctx context.Context, name string) (api.FleetSummary, error) {
	var sum api.FleetSummary
	err := d.store.Update(ctx, func(tx state.Tx) error {
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
	d.ctrl.Kick()
	return d.withLive(sum), nil
}
