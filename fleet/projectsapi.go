package fleet

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/fleetd/fleetd/fleet/allocator"
	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/budget"
	"github.com/fleetd/fleetd/fleet/controller"
	"github.com/fleetd/fleetd/fleet/projects"
	"github.com/fleetd/fleetd/fleet/reconcile"
	"github.com/fleetd/fleetd/fleet/state"
)

// projectsAPI serves the projects, the queue and resume.
type projectsAPI struct{ d *Daemon }

// decision is the controller's last allocation, or one made of the
// projects alone (no pass yet, or none decided: no project and no
// budget).
func (pa projectsAPI) decision() allocator.Decision {
	d := pa.d
	if dec, ok := d.ctrl.Decision(); ok {
		return dec
	}
	projs := d.projects.Config()
	dec := allocator.Decision{Now: d.now(), PoolGPUs: projs.Pool()}
	for _, p := range projs.Projects {
		dec.Projects = append(dec.Projects, allocator.ProjectUse{Name: p.Name, QuotaGPUs: p.QuotaGPUs, MaxGPUs: p.MaxGPUs})
	}
	return dec
}

// projectsHandler is GET /v1/projects: each project's quota, use,
// borrowing, queue and budget. A project-limited token sees its own. A
// follower answering without a leader reads the use from the store.
func (pa projectsAPI) projectsHandler(w http.ResponseWriter, r *http.Request) {
	d := pa.d
	projs := d.projects.Config()
	unlimited, priority := map[string]bool{}, map[string]int{}
	dec := pa.decision()
	budgetOf := func(name string, lim budget.Limits) budget.Status { return d.ctrl.BudgetStatus("project", name, lim) }
	if d.cl != nil && !d.cl.isLeader() {
		stored, ledger, err := pa.storedUse(r.Context(), projs)
		if err != nil {
			d.apiFail(w, err)
			return
		}
		dec = stored
		budgetOf = func(name string, lim budget.Limits) budget.Status { return ledger.ProjectStatus(name, lim, d.now()) }
	}
	for _, u := range dec.Projects {
		p, _ := projs.Get(u.Name)
		unlimited[u.Name], priority[u.Name] = p.Unlimited, p.Priority
	}
	resp := api.ProjectsFrom(dec, unlimited, priority, func(name string) (budget.Status, bool) {
		p, ok := projs.Get(name)
		if !ok || p.Budget == nil {
			return budget.Status{}, false
		}
		return budgetOf(name, *p.Budget), true
	})
	// The settings are the projects' as of now: an admin's change shows
	// at once, before the next allocation pass uses it.
	shown := map[string]bool{}
	resp.Projects = slices.DeleteFunc(resp.Projects, func(p api.Project) bool {
		_, ok := projs.Get(p.Name)
		return !ok
	})
	for i := range resp.Projects {
		rp := &resp.Projects[i]
		shown[rp.Name] = true
		p, _ := projs.Get(rp.Name)
		if p.Unlimited {
			continue
		}
		rp.QuotaGPUs, rp.MaxGPUs, rp.Priority, rp.Source = p.QuotaGPUs, p.MaxGPUs, p.Priority, d.projects.Source(p.Name)
		if p.Budget == nil {
			rp.Budget = nil
		}
	}
	for _, p := range projs.Projects {
		if !shown[p.Name] {
			rp := api.Project{Name: p.Name, QuotaGPUs: p.QuotaGPUs, MaxGPUs: p.MaxGPUs, Priority: p.Priority, Source: d.projects.Source(p.Name), Fleets: []string{}}
			if p.Budget != nil {
				rp.Budget = api.BudgetFrom(budgetOf(p.Name, *p.Budget))
			}
			resp.Projects = append(resp.Projects, rp)
		}
	}
	if scope := api.ProjectScope(r.Context()); scope != "" {
		resp.Projects = slices.DeleteFunc(resp.Projects, func(p api.Project) bool { return p.Name != scope })
	}
	api.WriteJSON(w, http.StatusOK, resp)
}

// storedUse is the projects' use as the shared store has it, for a
// follower answering while no leader can be reached: the GPUs of each
// project's live nodes (borrowed and lent by the allocator's rule) and the
// spend in the ledger the leader last saved (at most 30 s old; an alert or
// an egress charge saves it at once). The queue is the fleets the
// leader's saved decisions left waiting (storedQueue).
func (pa projectsAPI) storedUse(ctx context.Context, projs *projects.Config) (allocator.Decision, *budget.Ledger, error) {
	d := pa.d
	dec := allocator.Decision{Now: d.now(), PoolGPUs: projs.Pool()}
	used := map[string]int{}
	var ledger *budget.Ledger
	var waiting []waiter
	err := d.store.View(ctx, func(tx state.Tx) error {
		var err error
		if ledger, err = budget.Load(tx); err != nil {
			return err
		}
		fleets, err := tx.Fleets()
		if err != nil {
			return err
		}
		for _, f := range fleets {
			fl, err := d.fleetSpec(f)
			if err != nil || f.Destroying || f.Completed {
				continue
			}
			nodes, err := tx.Nodes(f.Name)
			if err != nil {
				return err
			}
			live := 0
			for _, n := range nodes {
				if reconcile.Live(n.State) {
					live++
				}
			}
			proj := fl.ProjectName()
			used[proj] += live * max(fl.Node.GPUs, 0)
			dec.Fleets = append(dec.Fleets, allocator.Allocation{Fleet: f.Name, Project: proj, From: live})
			if p, ok := projs.Get(proj); live == 0 && ok && !p.Unlimited && (projs.Enabled() || fl.Budget != nil) {
				if w, ok := storedWaiter(tx, f, proj, p.Priority); ok {
					waiting = append(waiting, w)
				}
			}
		}
		return nil
	})
	dec.Queue = storedQueue(waiting, dec.Now)
	if err != nil {
		return dec, nil, err
	}
	if ledger == nil {
		ledger = &budget.Ledger{}
	}
	queued := map[string]int{}
	for _, q := range dec.Queue {
		queued[q.Project]++
	}
	names := projs.Names()
	borrowed := 0
	for _, name := range names {
		if p, _ := projs.Get(name); !p.Unlimited {
			borrowed += max(used[name]-p.QuotaGPUs, 0)
		}
	}
	for _, name := range names {
		p, _ := projs.Get(name)
		if p.Unlimited && used[name] == 0 && !slices.ContainsFunc(dec.Fleets, func(a allocator.Allocation) bool { return a.Project == name }) {
			continue
		}
		u := allocator.ProjectUse{Name: name, QuotaGPUs: p.QuotaGPUs, MaxGPUs: p.MaxGPUs, UsedGPUs: used[name], Queued: queued[name]}
		if !p.Unlimited {
			u.BorrowedGPUs, u.LentGPUs = allocator.Lending(p.QuotaGPUs, used[name], &borrowed)
			dec.UsedGPUs += used[name]
		}
		dec.Projects = append(dec.Projects, u)
	}
	return dec, ledger, nil
}

// waiter is a fleet waiting to start as the store has it.
type waiter struct {
	fleet, project string
	priority       int
	arrival        time.Time
}

// storedWaiter reports whether fleet f (no live node) waits in the queue
// by its saved runtime: the leader never admitted it, or a budget it no
// longer exceeds queued it again; a paused fleet does not wait.
func storedWaiter(tx state.Tx, f state.Fleet, project string, priority int) (waiter, bool) {
	var rt controller.SavedRuntime
	if b, err := tx.Meta(controller.RuntimeKey(f.Name)); err == nil && len(b) > 0 {
		if json.Unmarshal(b, &rt) != nil {
			return waiter{}, false
		}
	}
	if rt.Alloc.Admitted || rt.Alloc.Paused || rt.Alloc.Stopping {
		return waiter{}, false
	}
	arrival := rt.Alloc.Arrival
	if arrival.IsZero() {
		arrival = f.CreatedAt
	}
	return waiter{fleet: f.Name, project: project, priority: priority, arrival: arrival}, true
}

// storedQueue orders the stored waiters as the allocator starts them
// (priority, then arrival) without the leader's aging and reservations,
// which live in its memory.
func storedQueue(ws []waiter, now time.Time) []allocator.QueueEntry {
	slices.SortStableFunc(ws, func(a, b waiter) int {
		return cmp.Or(cmp.Compare(b.priority, a.priority), a.arrival.Compare(b.arrival), cmp.Compare(a.fleet, b.fleet))
	})
	out := make([]allocator.QueueEntry, 0, len(ws))
	for i, w := range ws {
		out = append(out, allocator.QueueEntry{Fleet: w.fleet, Project: w.project, Position: i + 1, Priority: w.priority,
			Waiting: now.Sub(w.arrival), Reason: "waits to start (as the leader last decided; no leader is reachable to say why now)"})
	}
	return out
}

// queueHandler is GET /v1/queue: the waiting fleets in start order (a
// project-limited token sees its project's, positions unchanged). A
// follower answering without a leader reads it from the store.
func (pa projectsAPI) queueHandler(w http.ResponseWriter, r *http.Request) {
	dec := pa.decision()
	if d := pa.d; d.cl != nil && !d.cl.isLeader() {
		stored, _, err := pa.storedUse(r.Context(), d.projects.Config())
		if err != nil {
			d.apiFail(w, err)
			return
		}
		dec = stored
	}
	q := api.QueueFrom(dec)
	if scope := api.ProjectScope(r.Context()); scope != "" {
		q.Queue = slices.DeleteFunc(q.Queue, func(e api.QueueEntry) bool { return e.Project != scope })
	}
	api.WriteJSON(w, http.StatusOK, q)
}

// setProjectHandler is PUT /v1/projects/{project}: create or replace a
// project, stored (admin only).
func (pa projectsAPI) setProjectHandler(w http.ResponseWriter, r *http.Request) {
	d := pa.d
	var req api.ProjectRequest
	if !api.DecodeBody(w, r, &req) {
		return
	}
	p := projects.Project{Name: r.PathValue("project"), QuotaGPUs: req.QuotaGPUs, MaxGPUs: req.MaxGPUs, Priority: req.Priority, Budget: req.Budget}
	created, err := d.projects.Set(r.Context(), p)
	if errors.Is(err, state.ErrInvalid) {
		api.WriteError(w, http.StatusBadRequest, err)
		return
	}
	if err != nil {
		d.apiFail(w, err)
		return
	}
	d.ctrl.Kick()
	got, _ := d.projects.Config().Get(p.Name)
	resp := api.ProjectChanged{Name: got.Name, Action: "updated", QuotaGPUs: got.QuotaGPUs, MaxGPUs: got.MaxGPUs, Priority: got.Priority, Budget: got.Budget}
	code := http.StatusOK
	if created {
		resp.Action, code = "created", http.StatusCreated
	}
	api.WriteJSON(w, code, resp)
}

// deleteProjectHandler is DELETE /v1/projects/{project} (admin only): 409
// naming the fleets while any of the project's fleets still runs.
func (pa projectsAPI) deleteProjectHandler(w http.ResponseWriter, r *http.Request) {
	d := pa.d
	name := r.PathValue("project")
	err := d.projects.Delete(r.Context(), name, pa.liveFleetsOf)
	switch {
	case errors.Is(err, errProjectBusy):
		api.WriteError(w, http.StatusConflict, err)
		return
	case err != nil:
		d.apiFail(w, err)
		return
	}
	d.ctrl.Kick()
	api.WriteJSON(w, http.StatusOK, api.ProjectChanged{Name: name, Action: "deleted"})
}

// liveFleetsOf names the stored fleets of project that are neither being
// destroyed nor completed (paused ones count: they keep their
// checkpoints and resume).
func (pa projectsAPI) liveFleetsOf(tx state.Tx, project string) ([]string, error) {
	fleets, err := tx.Fleets()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, f := range fleets {
		if f.Destroying || f.Completed {
			continue
		}
		fl, err := pa.d.fleetSpec(f)
		if err != nil {
			continue
		}
		if fl.ProjectName() == project {
			out = append(out, f.Name)
		}
	}
	return out, nil
}

// resumeHandler is POST /v1/fleets/{fleet}/resume: a paused fleet queues
// to start again (a budget still exhausted pauses it again).
func (pa projectsAPI) resumeHandler(w http.ResponseWriter, r *http.Request) {
	d := pa.d
	name := r.PathValue("fleet")
	if err := d.store.View(r.Context(), func(tx state.Tx) error {
		_, err := tx.Fleet(name)
		return err
	}); err != nil {
		d.apiFail(w, err)
		return
	}
	ok, err := d.ctrl.Resume(r.Context(), name)
	if err != nil {
		d.apiFail(w, err)
		return
	}
	if !ok {
		api.WriteError(w, http.StatusConflict, fmt.Errorf("fleet %s is not paused", name))
		return
	}
	api.WriteJSON(w, http.StatusOK, map[string]string{"status": "resumed", "fleet": name})
}

// allocationOf is a fleet's allocation for its summary, with its place in
// the queue; nil when the allocator does not size it.
func (d *fleetViews) allocationOf(name string) *api.AllocationInfo {
	v, ok := d.ctrl.View(name)
	if !ok || v.Allocation == nil {
		return nil
	}
	pos := 0
	if dec, ok := d.ctrl.Decision(); ok {
		for _, q := range dec.Queue {
			if q.Fleet == name {
				pos = q.Position
			}
		}
	}
	info := api.AllocationFrom(*v.Allocation, pos)
	info.Waiting = v.Waiting
	return info
}
