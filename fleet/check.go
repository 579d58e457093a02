package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/bootstrap"
	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/providers"
)

// checker answers `fleetd check` and the preflight of plan and apply:
// can each provider block launch, can nodes reach the daemon, is there an
// agent binary for each offering's architecture.
type checker struct {
	providers ProviderSource
	agents    *agentBinaries
	// url is the daemon's URL as nodes are told it.
	url   func() string
	parse func(api.ApplyRequest) (*spec.File, error)
}

// admit parses a spec sent for plan or apply and makes the checks both
// answer before anything else: the caller's project scope, whether nodes
// can reach the daemon (checkReachable) and the agent binaries.
func (d *checker) admit(ctx context.Context, req api.ApplyRequest, scope fleetScope) (*spec.File, error) {
	file, err := d.parse(req)
	if err != nil {
		return nil, err
	}
	if err := scope.checkSpec(ctx, file); err != nil {
		return nil, err
	}
	if err := d.checkReachable(file); err != nil {
		return nil, err
	}
	if err := d.agents.checkAgentBinaries(ctx, file); err != nil {
		return nil, err
	}
	return file, nil
}

// checkTimeout bounds one provider block's preflight; a full AWS check is a
// few dozen calls per region.
const checkTimeout = 2 * time.Minute

// preflight runs the providers' checks for the fleets of a spec, one
// goroutine per provider block. Providers without a preflight get a note,
// not a failure: fleetd can still use them.
func (d *checker) preflight(ctx context.Context, fleets []*spec.Fleet, quick bool) api.CheckReport {
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

func (d *checker) checkProvider(ctx context.Context, fl *spec.Fleet, pb spec.Provider, quick bool) api.ProviderCheck {
	pc := api.ProviderCheck{Fleet: fl.Name, Provider: pb.Name}
	if d.providers == nil {
		pc.Note = "no providers configured in this daemon"
		return pc
	}
	p, err := d.providers.Get(ctx, pb.Name)
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
	rs, err := c.Check(cctx, providers.Config{Fleet: fl.Name, Raw: pb.Config}, providers.CheckOptions{Quick: quick, TargetNodes: fl.TargetNodes(),
		Network: fl.Node.NetworkMode() != spec.NetworkStandard, FileSystems: fileSystemChecks(fl, pb.Name)})
	switch {
	case errors.Is(err, errors.ErrUnsupported):
		pc.Note = "provider has no preflight check"
	case err != nil:
		pc.Results = []providers.CheckResult{{Check: "preflight", Status: providers.CheckFailed, Detail: err.Error(), Fix: "fix the provider block"}}
	default:
		pc.Results = rs
	}
	if !quick && err == nil {
		pc.Results = append(pc.Results, d.agentBinaryRows(cctx, fl, pb, p)...)
	}
	return pc
}

// fileSystemChecks are the file systems of fl's data blocks that live in
// provider's cloud, for its preflight to verify; nil when none.
func fileSystemChecks(fl *spec.Fleet, provider string) []providers.FileSystemCheck {
	var out []providers.FileSystemCheck
	for _, d := range fl.Training.Data {
		src, err := spec.ParseDataSource(d.Source)
		if err != nil || !src.FileSystem() || src.Cloud() != provider {
			continue
		}
		fc := providers.FileSystemCheck{Source: d.Source, Scheme: src.Scheme, Host: src.Host, Path: src.Path, Region: d.Region, Zone: d.Zone}
		if d.ZonePolicy == spec.ZoneRequired && d.Zone != "" {
			// Placement keeps the job in that zone only.
			fc.Zones = []string{d.Zone}
		}
		out = append(out, fc)
	}
	return out
}

// agentBinaryRows are the `fleetd check` rows of the agent binaries a
// provider block's nodes need: one per architecture of the block's
// offerings that fit the fleet's node, ok when the daemon has the binary
// (placement.Exclusion decides the fit, as placement does). A missing
// architecture fails when none of the block's offerings can be served (plan
// and apply refuse such a fleet), and is unavailable when others can
// (placement leaves its offerings out). Providers whose nodes do not
// download the agent (local, sim) get no row. The apply's quick preflight
// skips these rows: checkAgentBinaries refuses there.
func (d *checker) agentBinaryRows(ctx context.Context, fl *spec.Fleet, pb spec.Provider, p providers.Provider) []providers.CheckResult {
	if !downloadsAgent(pb.Name) {
		return nil
	}
	offs, err := p.Offerings(ctx, providers.Config{Fleet: fl.Name, Raw: pb.Config})
	if err != nil {
		return []providers.CheckResult{{Check: "agent binary", Status: providers.CheckUnavailable,
			Detail: "not checked: the offerings could not be listed, so the architectures needed are unknown: " + err.Error(),
			Fix:    "fix the rows above, then check again"}}
	}
	types := map[string][]string{} // arch → instance types that fit
	for _, o := range offs {
		if placement.Exclusion(fl, o) != "" {
			continue
		}
		arch := bootstrap.NormalizeArch(o.Arch)
		if !slices.Contains(types[arch], o.InstanceType) {
			types[arch] = append(types[arch], o.InstanceType)
		}
	}
	arches := make([]string, 0, len(types))
	servable := false
	for arch := range types {
		arches = append(arches, arch)
		if _, ok := d.agents.Lookup(arch); ok {
			servable = true
		}
	}
	sort.Strings(arches)
	looked := strings.Join(d.agents.Dirs, ", ")
	if looked == "" {
		looked = "no agent directory"
	}
	var out []providers.CheckResult
	for _, arch := range arches {
		sort.Strings(types[arch])
		r := providers.CheckResult{Check: "agent binary", Scope: "linux/" + arch}
		b, ok := d.agents.Lookup(arch)
		switch {
		case ok:
			where := b.Path
			if b.Self {
				where = "the daemon's own executable"
			}
			r.Status, r.Detail = providers.CheckOK, fmt.Sprintf("%s, for %s", where, strings.Join(types[arch], ", "))
			if b.Flavor == bootstrap.FlavorFull {
				// Works, but every node downloads the whole daemon; the
				// startup warning names the directories and the fix.
				r.Detail += fmt.Sprintf(" (the full fleetd: no slim %s; `make agents` or `make release` builds it)", bootstrap.AgentFlavorFileName(bootstrap.FlavorSlim, arch))
			}
		case servable:
			r.Status = providers.CheckUnavailable
			r.Detail = fmt.Sprintf("no %s in %s: offerings of %s are left out of placement", bootstrap.AgentFileName(arch), looked, strings.Join(types[arch], ", "))
			r.Fix = bootstrap.AgentFix(arch, d.agents.Dirs)
		default:
			r.Status = providers.CheckFailed
			r.Detail = fmt.Sprintf("no %s in %s, and %s need it: plan and apply refuse this fleet", bootstrap.AgentFileName(arch), looked, strings.Join(types[arch], ", "))
			r.Fix = bootstrap.AgentFix(arch, d.agents.Dirs)
		}
		out = append(out, r)
	}
	return out
}

// preflightApply runs the quick preflight for the fleets an apply creates
// or changes, and refuses the apply when any check fails.
func (d *checker) preflightApply(ctx context.Context, file *spec.File, plan api.Plan) error {
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
func (d *checker) checkHandler(w http.ResponseWriter, r *http.Request) {
	var req api.CheckRequest
	if !api.DecodeBody(w, r, &req) {
		return
	}
	file, err := d.parse(req.ApplyRequest)
	if err != nil {
		api.WriteSpecError(w, err)
		return
	}
	rep := d.preflight(r.Context(), file.Fleets, req.Quick)
	sort.SliceStable(rep.Providers, func(i, j int) bool {
		a, b := rep.Providers[i], rep.Providers[j]
		return fmt.Sprint(a.Fleet, "\x00", a.Provider) < fmt.Sprint(b.Fleet, "\x00", b.Provider)
	})
	api.WriteJSON(w, http.StatusOK, rep)
}
