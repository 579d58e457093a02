package controller

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/fleetd/fleetd/fleet/reconcile"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/providers"
)

// offeringsTTL bounds how stale the market view may be; capacity errors
// reach placement through the unavailable cache at once anyway.
const offeringsTTL = 30 * time.Second

// Market is a fleet's market view between passes: each provider's
// offerings and when they were fetched. It lives in the fleet's Runtime; the
// zero value is empty.
type Market struct {
	offerings map[string][]providers.Offering
	at        map[string]time.Time
}

func (m *Market) set(provider string, o []providers.Offering, now time.Time) {
	if m.offerings == nil {
		m.offerings, m.at = map[string][]providers.Offering{}, map[string]time.Time{}
	}
	m.offerings[provider], m.at[provider] = o, now
}

// observe fills in the instances of every provider the fleet uses or its
// nodes (in.Nodes) still live on, in.ObservedOK for the providers that
// answered, and, for a live fleet, the offerings placement may pick from
// (fetched again when m's are older than offeringsTTL).
func (c *Controller) observe(ctx context.Context, f state.Fleet, m *Market, in *reconcile.Input) {
	fl, now := in.Fleet, in.Now
	provNames := map[string]bool{}
	for _, p := range fl.Providers {
		provNames[p.Name] = true
	}
	for _, n := range in.Nodes {
		if n.Offering.Provider != "" {
			provNames[n.Offering.Provider] = true
		}
	}
	for _, name := range slices.Sorted(maps.Keys(provNames)) {
		p, cfg, err := c.provider(ctx, f, name)
		if err != nil {
			c.log.Warn("provider unavailable", "fleet", f.Name, "provider", name, "err", err)
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		insts, err := p.List(lctx, cfg, map[string]string{providers.TagFleet: f.Name})
		cancel()
		c.countCall(name, "list", "", cfg, err)
		if err != nil {
			c.log.Warn("provider list failed", "fleet", f.Name, "provider", name, "err", err)
		} else {
			in.ObservedOK[name] = true
			if in.Instances == nil {
				in.Instances = insts // the common single provider: no copy
			} else {
				in.Instances = append(in.Instances, insts...)
			}
		}
		if f.Destroying || f.Completed {
			continue
		}
		offs := m.offerings[name]
		if now.Sub(m.at[name]) > offeringsTTL || offs == nil {
			octx, cancel := context.WithTimeout(ctx, 30*time.Second)
			o, err := p.Offerings(octx, cfg)
			cancel()
			c.countCall(name, "offerings", "", cfg, err)
			if err != nil {
				c.log.Warn("provider offerings failed", "fleet", f.Name, "provider", name, "err", err)
			} else {
				offs = o
				m.set(name, o, now)
				c.opts.Recorder.OfferingsListed(o)
				c.opts.Recorder.Prices(f.Name, name, fl, o)
			}
		}
		// Offerings whose architecture has no agent binary are not
		// placement's to pick (plan refuses a fleet left with none).
		offs = c.opts.Servable(offs)
		in.Offerings = append(in.Offerings, offs...)
	}
}

// noticeInterrupted turns the instances of a live fleet that the provider
// itself reports as interrupted or gone into notices (HandleNotice).
func (c *Controller) noticeInterrupted(ctx context.Context, f state.Fleet, in *reconcile.Input) {
	// The index of nodes by instance is built only when some
	// instance reports one: most passes have none.
	var byInstance map[string]state.Node
	for _, inst := range in.Instances {
		if inst.Interruption == nil || f.Completed || f.Destroying {
			// A finished job's agents exit on their own: not an interruption.
			continue
		}
		if byInstance == nil {
			byInstance = make(map[string]state.Node, len(in.Nodes))
			for _, n := range in.Nodes {
				if n.InstanceID != "" {
					byInstance[n.InstanceID] = n
				}
			}
		}
		n, ok := byInstance[inst.ID]
		if !ok {
			continue
		}
		kind, err := interruption.ParseKind(inst.Interruption.Kind)
		if err != nil {
			continue
		}
		if n.State == state.NodeTerminating || n.State == state.NodeTerminated || n.State == state.NodeFailed {
			continue
		}
		_ = c.HandleNotice(ctx, f.Name, interruption.Notice{Node: n.ID, Instance: inst.ID, Kind: kind, Deadline: inst.Interruption.Deadline, Source: "provider/" + inst.Offering.Provider})
	}
}
