package fleet

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/controller"
	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

// The market as plans and `fleetd offerings` see it: the providers' live
// offerings for a spec, ranked by placement.

// planOfferings fills the offerings part of a plan: where the fleet would
// launch and what it would cost per hour, from the providers' live market.
func (d *Daemon) planOfferings(ctx context.Context, fl *spec.Fleet, fp *api.FleetPlan) error {
	if d.opts.Providers == nil || fp.Action == api.ActionDestroy {
		return nil
	}
	records := map[string]state.OfferingRecord{}
	_ = d.store.View(ctx, func(tx state.Tx) error {
		recs, err := tx.Offerings()
		for _, r := range recs {
			records[r.Key] = r
		}
		return err
	})
	var offs []providers.Offering
	for _, pb := range fl.Providers {
		p, err := d.opts.Providers.Get(ctx, pb.Name)
		if err != nil {
			fp.Notes = append(fp.Notes, fmt.Sprintf("provider %s unavailable: %v", pb.Name, err))
			continue
		}
		octx, cancel := context.WithTimeout(ctx, 30*time.Second)
		o, err := p.Offerings(octx, providers.Config{Fleet: fl.Name, Raw: pb.Config})
		cancel()
		if providers.IsAuth(err) {
			// Bad credentials are not a market condition to plan around:
			// the plan fails and says which provider block to fix.
			return fmt.Errorf("fleet %q, provider %s: %w (fix the credentials, then check with `fleetd check`)", fl.Name, pb.Name, err)
		}
		if err != nil {
			fp.Notes = append(fp.Notes, fmt.Sprintf("provider %s offerings: %v", pb.Name, err))
			continue
		}
		d.stats.OfferingsListed(o)
		o, excluded := d.agents.servableOfferings(o)
		fp.Notes = append(fp.Notes, excludedNotes(excluded)...)
		offs = append(offs, o...)
	}
	if len(offs) == 0 {
		fp.Notes = append(fp.Notes, "no offerings from any provider")
		return nil
	}
	capDec := placement.Decision{Spot: fl.Node.Spot, OnDemand: !fl.Node.Spot, OnDemandLimit: -1}
	ch := placement.Choose(placement.ChooseInput{Fleet: fl, Offerings: offs, Records: records, Now: d.now(),
		Need: fp.TargetNodes, Target: fp.TargetNodes, Capacity: capDec, AtBoundary: true, Outlook: controller.SpotOutlook(ctx, d.store, d.now()),
		Move: d.moveCost(fl)})
	if ch.Group == "" {
		fp.Notes = append(fp.Notes, "no offering group can hold min_nodes now: "+ch.Reason)
		return nil
	}
	byKey := map[string]*api.PlannedOffering{}
	var order []string
	for _, o := range ch.Launch {
		po, ok := byKey[o.Key()]
		if !ok {
			po = &api.PlannedOffering{Key: o.Key(), Provider: o.Provider, Region: o.Region, Zone: o.Zone, InstanceType: o.InstanceType,
				CapacityType: string(o.CapacityType), PricePerHour: o.PricePerHour}
			byKey[o.Key()] = po
			order = append(order, o.Key())
		}
		po.Nodes++
		fp.CostPerHour += o.PricePerHour
	}
	sort.Strings(order)
	for _, k := range order {
		fp.Offerings = append(fp.Offerings, *byKey[k])
	}
	if ch.Reason != "" {
		fp.Notes = append(fp.Notes, "placement: "+ch.Reason)
	}
	fp.Notes = append(fp.Notes, placement.ExplainLaunch(ch)...)
	if ch.Move != nil {
		fp.Notes = append(fp.Notes, fmt.Sprintf("moving the job here: %s; $%.2f in all, $%.3f per GPU-hour over the move horizon (egress prices: %s, as of %s)",
			ch.Move, ch.Move.TotalUSD(), ch.Move.PerGPUHour, d.moveCost(fl).Egress.Source, placement.DefaultEgress.AsOf))
	}
	// Where the data is and what reading it from here costs (data.go).
	fp.Notes = append(fp.Notes, placement.DataNotes(fl, ch.Launch)...)
	if n := placement.DataTradeoff(fl, offs, ch.Launch); n != "" {
		fp.Notes = append(fp.Notes, n)
	}
	return nil
}

// signalNotes lists, once each, why a provider's capacity signals are
// missing (e.g. spot placement scores denied), so `fleetd offerings` says
// placement runs without them.
func signalNotes(provider string, offs []providers.Offering) []string {
	var out []string
	seen := map[string]bool{}
	for _, o := range offs {
		if n := o.PlacementScoreNote; n != "" && !seen[n] {
			seen[n] = true
			out = append(out, fmt.Sprintf("provider %s: %s", provider, n))
		}
	}
	return out
}

// OfferingsView is one fleet's ranked market view (fleetd offerings).
type OfferingsView struct {
	Fleet     string             `json:"fleet"`
	Offerings []placement.Ranked `json:"offerings"`
	Notes     []string           `json:"notes,omitempty"`
}

// offeringsHandler serves POST /v1/offerings: the ranked market view for
// each fleet of a spec, with why each excluded offering is excluded.
func (d *Daemon) offeringsHandler(w http.ResponseWriter, r *http.Request) {
	var req api.ApplyRequest
	if !api.DecodeBody(w, r, &req) {
		return
	}
	file, err := d.parseRequest(req)
	if err != nil {
		api.WriteSpecError(w, err)
		return
	}
	records := map[string]state.OfferingRecord{}
	_ = d.store.View(r.Context(), func(tx state.Tx) error {
		recs, err := tx.Offerings()
		for _, rec := range recs {
			records[rec.Key] = rec
		}
		return err
	})
	out := []OfferingsView{}
	for _, fl := range file.Fleets {
		v := OfferingsView{Fleet: fl.Name}
		var offs []providers.Offering
		for _, pb := range fl.Providers {
			p, err := d.opts.Providers.Get(r.Context(), pb.Name)
			if err != nil {
				v.Notes = append(v.Notes, fmt.Sprintf("provider %s: %v", pb.Name, err))
				continue
			}
			o, err := p.Offerings(r.Context(), providers.Config{Fleet: fl.Name, Raw: pb.Config})
			if err != nil {
				v.Notes = append(v.Notes, fmt.Sprintf("provider %s offerings: %v", pb.Name, err))
				continue
			}
			if len(o) == 0 {
				v.Notes = append(v.Notes, fmt.Sprintf("provider %s: no offerings: none of its instance types is offered (with a known price) in its regions and zones; check instance_types, regions/zones and subnets", pb.Name))
			}
			v.Notes = append(v.Notes, signalNotes(pb.Name, o)...)
			offs = append(offs, o...)
		}
		v.Offerings = d.agents.markNoAgent(placement.RankIn(fl, offs, records, controller.SpotOutlook(r.Context(), d.store, d.now()), placement.DefaultModel()))
		out = append(out, v)
	}
	api.WriteJSON(w, http.StatusOK, out)
}
