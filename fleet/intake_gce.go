package fleet

import (
	"context"
	"encoding/json"
	"sort"

	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/interruption/gceops"
	gcpprov "github.com/fleetd/fleetd/providers/gcp"
)

// GCE preemption detection: one zone-operations poller per (project,
// endpoint) any fleet's `provider "gcp"` block names, polling the zones
// where fleetd has instances. Preemptions become notices for the node whose
// instance id ("ZONE/NAME") matches.

type gceKey struct{ project, endpoint string }

type gceBlock struct {
	Project  string `json:"project"`
	Endpoint string `json:"endpoint"`
}

func (d *Daemon) syncGCEIntake(ctx context.Context, fleets []state.Fleet) {
	want := map[gceKey]bool{}
	for _, f := range fleets {
		fl, err := d.fleetSpec(f)
		if err != nil || f.Destroying || f.Completed {
			continue
		}
		pb, ok := fl.Provider(gcpprov.Name)
		if !ok {
			continue
		}
		var b gceBlock
		if json.Unmarshal(pb.Config, &b) != nil || b.Project == "" {
			continue
		}
		want[gceKey{b.Project, b.Endpoint}] = true
	}
	d.intake.mu.Lock()
	defer d.intake.mu.Unlock()
	if d.intake.gce == nil {
		d.intake.gce = map[gceKey]context.CancelFunc{}
	}
	for k, cancel := range d.intake.gce {
		if !want[k] {
			cancel()
			delete(d.intake.gce, k)
		}
	}
	for k := range want {
		if _, ok := d.intake.gce[k]; ok {
			continue
		}
		clients, err := gceops.NewClients(ctx, k.endpoint)
		if err != nil {
			d.log.Warn("gce operations client", "project", k.project, "err", err)
			continue
		}
		pctx, cancel := context.WithCancel(ctx)
		d.intake.gce[k] = cancel
		p := &gceops.Poller{Project: k.project, Lister: clients, Status: clients, Interval: d.opts.PollInterval,
			Zones:   func() []string { return d.gceInUse(pctx, true) },
			Watched: func() []string { return d.gceInUse(pctx, false) },
			OnError: func(err error) { d.log.Debug("gce operations poll", "project", k.project, "err", err) }}
		go func() {
			defer clients.Close()
			d.log.Info("interruption intake: polling GCE zone operations", "project", k.project)
			_ = p.Run(pctx, func(n interruption.Notice) {
				fleetName, node, ok, err := d.nodeByInstance(pctx, n.Instance)
				if err != nil || !ok {
					return
				}
				n.Node = node
				if err := d.HandleNotice(pctx, fleetName, n); err != nil {
					d.log.Warn("gce notice", "instance", n.Instance, "err", err)
				}
			})
		}()
	}
}

// gceInUse lists the zones (zones=true) or the live instance ids of GCP
// nodes that fleetd expects to be running.
func (d *Daemon) gceInUse(ctx context.Context, zones bool) []string {
	set := map[string]bool{}
	_ = d.eachNode(ctx, func(_ state.Fleet, n state.Node) bool {
		if n.Offering.Provider != gcpprov.Name || n.InstanceID == "" {
			return true
		}
		switch n.State {
		case state.NodeBooting, state.NodeJoined, state.NodeRunning, state.NodeDraining:
			if zones {
				set[n.Offering.Zone] = true
			} else {
				set[n.InstanceID] = true
			}
		}
		return true
	})
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
