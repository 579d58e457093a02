package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/providers"
)

// checkTimeout bounds one provider block's preflight; a full AWS check is a
// few dozen calls per region.
const checkTimeout = 2 * time.Minute

// preflight runs the providers' checks for the fleets of a spec, one
// goroutine per provider block. Providers without a preflight get a note,
// not a failure: fleetd can still use them.
func (d *Daemon) preflight(ctx context.Context, fleets []*spec.Fleet, quick bool) api.CheckReport {
	type job struct {
		i  int
		fl *spec.Fleet
		pb spec.Provider
	}
	var jobs []job
	for _, fl := range fleets {
		for _, pb := range fl.Providers {
			jobs = append(jobs, job{len(jobs), fl, pb})
		}
	}
	out := make([]api.ProviderCheck, len(jobs))
	var wg sync.WaitGroup
	for _, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[j.i] = d.checkProvider(ctx, j.fl, j.pb, quick)
			if r, bad := d.reachabilityCheck(j.pb); bad {
				out[j.i].Results = append([]providers.CheckResult{r}, out[j.i].Results...)
			}
		}()
	}
	wg.Wait()
	rep := api.CheckReport{OK: true, Providers: out}
	for _, pc := range out {
		if !providers.CheckPassed(pc.Results) {
			rep.OK = false
		}
	}
	return rep
}

func (d *Daemon) checkProvider(ctx context.Context, fl *spec.Fleet, pb spec.Provider, quick bool) api.ProviderCheck {
	pc := api.ProviderCheck{Fleet: fl.Name, Provider: pb.Name}
	if d.opts.Providers == nil {
		pc.Note = "no providers configured in this daemon"
		return pc
	}
	p, err := d.opts.Providers.Get(ctx, pb.Name)
	if err != nil {
		pc.Results = []providers.CheckResult{{Check: "provider plugin", Status: providers.CheckFailed, Detail: err.Error(),
			Fix: "check the daemon's plugin configuration (docs/plugins.md)"}}
		return pc
	}
	c, ok := p.(providers.Checker)
	if !ok {
		pc.Note = "provider has no preflight check"
		return pc
	}
	cctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	rs, err := c.Check(cctx, providers.Config{Fleet: fl.Name, Raw: pb.Config}, providers.CheckOptions{Quick: quick, TargetNodes: fl.TargetNodes()})
	switch {
	case errors.Is(err, errors.ErrUnsupported):
		pc.Note = "provider has no preflight check"
	case err != nil:
		pc.Results = []providers.CheckResult{{Check: "preflight", Status: providers.CheckFailed, Detail: err.Error(), Fix: "fix the provider block"}}
	default:
		pc.Results = rs
	}
	return pc
}

// preflightApply runs the quick preflight for the fleets an apply creates
// or changes, and refuses the apply when any check fails.
func (d *Daemon) preflightApply(ctx context.Context, file *spec.File, plan api.Plan) error {
	var fleets []*spec.Fleet
	for i, fl := range file.Fleets {
		if i < len(plan.Fleets) && (plan.Fleets[i].Action == api.ActionCreate || plan.Fleets[i].Action == api.ActionUpdate) {
			fleets = append(fleets, fl)
		}
	}
	if len(fleets) == 0 {
		return nil
	}
	rep := d.preflight(ctx, fleets, true)
	if !rep.OK {
		return &api.PreflightError{Report: rep}
	}
	return nil
}

// checkHandler serves POST /v1/check: the preflight of every provider
// block of a spec's fleets, without launching anything.
func (d *Daemon) checkHandler(w http.ResponseWriter, r *http.Request) {
	var req api.CheckRequest
	if !api.DecodeBody(w, r, &req) {
		return
	}
	file, err := d.parseRequest(req.ApplyRequest)
	if err != nil {
		var se *api.SpecError
		if errors.As(err, &se) {
			api.WriteJSON(w, http.StatusUnprocessableEntity, api.Error{Error: se.Error(), Diagnostics: se.Diagnostics, Rendered: se.Rendered})
			return
		}
		api.WriteError(w, http.StatusBadRequest, err)
		return
	}
	rep := d.preflight(r.Context(), file.Fleets, req.Quick)
	sort.SliceStable(rep.Providers, func(i, j int) bool {
		a, b := rep.Providers[i], rep.Providers[j]
		return fmt.Sprint(a.Fleet, "\x00", a.Provider) < fmt.Sprint(b.Fleet, "\x00", b.Provider)
	})
	api.WriteJSON(w, http.StatusOK, rep)
}
