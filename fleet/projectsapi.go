package fleet

import (
	"fmt"
	"net/http"

	"github.com/fleetd/fleetd/fleet/allocator"
	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/budget"
	"github.com/fleetd/fleetd/fleet/state"
)

// projectsAPI serves the projects, the queue and resume.
type projectsAPI struct{ d *Daemon }

// decision is the controller's last allocation, or one made of the
// configured projects alone (no pass yet, or none decided: no project
// and no budget).
func (pa projectsAPI) decision() allocator.Decision {
	d := pa.d
	if dec, ok := d.ctrl.Decision(); ok {
		return dec
	}
	dec := allocator.Decision{Now: d.now(), PoolGPUs: d.cfg.Projects.Pool()}
	for _, p := range d.cfg.Projects.Projects {
		dec.Projects = append(dec.Projects, allocator.ProjectUse{Name: p.Name, QuotaGPUs: p.QuotaGPUs, MaxGPUs: p.MaxGPUs})
	}
	return dec
}

// projectsHandler is GET /v1/projects: each project's quota, use,
// borrowing, queue and budget.
func (pa projectsAPI) projectsHandler(w http.ResponseWriter, r *http.Request) {
	d := pa.d
	unlimited, priority := map[string]bool{}, map[string]int{}
	dec := pa.decision()
	for _, u := range dec.Projects {
		p, _ := d.cfg.Projects.Get(u.Name)
		unlimited[u.Name], priority[u.Name] = p.Unlimited, p.Priority
	}
	resp := api.ProjectsFrom(dec, unlimited, priority, func(name string) (budget.Status, bool) {
		p, ok := d.cfg.Projects.Get(name)
		if !ok || p.Budget == nil {
			return budget.Status{}, false
		}
		return d.ctrl.BudgetStatus("project", name, *p.Budget), true
	})
	api.WriteJSON(w, http.StatusOK, resp)
}

// queueHandler is GET /v1/queue: the waiting fleets in start order.
func (pa projectsAPI) queueHandler(w http.ResponseWriter, r *http.Request) {
	api.WriteJSON(w, http.StatusOK, api.QueueFrom(pa.decision()))
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
	return api.AllocationFrom(*v.Allocation, pos)
}
