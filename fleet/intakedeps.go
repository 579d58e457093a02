package fleet

import (
	"context"
	"sort"

	"github.com/fleetd/fleetd/fleet/intake"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/interruption"
	gcpprov "github.com/fleetd/fleetd/providers/gcp"
)

// intakeDeps is the daemon as the interruption intake (fleet/intake, run
// only by the leader) sees it.
type intakeDeps struct{ d *Daemon }

var _ intake.Deps = intakeDeps{}

func (x intakeDeps) LiveFleets(ctx context.Context) ([]intake.Fleet, error) {
	fleets, err := state.Read(ctx, x.d.store, state.Tx.Fleets)
	if err != nil {
		return nil, err
	}
	out := make([]intake.Fleet, 0, len(fleets))
	for _, f := range fleets {
		if f.Destroying || f.Completed {
			continue
		}
		fl, err := x.d.fleetSpec(f)
		if err != nil {
			continue
		}
		in := intake.Fleet{Name: f.Name, Providers: map[string][]byte{}}
		for _, p := range fl.Providers {
			in.Providers[p.Name] = p.Config
		}
		out = append(out, in)
	}
	return out, nil
}

func (x intakeDeps) Notice(ctx context.Context, fleet string, n interruption.Notice) error {
	return x.d.ctrl.HandleNotice(ctx, fleet, n)
}

func (x intakeDeps) NodeByInstance(ctx context.Context, instanceID string) (string, string, bool, error) {
	var fleetName, nodeID string
	err := x.d.eachNode(ctx, func(f state.Fleet, n state.Node) bool {
		if n.InstanceID == instanceID {
			fleetName, nodeID = f.Name, n.ID
			return false
		}
		return true
	})
	return fleetName, nodeID, nodeID != "", err
}

func (x intakeDeps) GCEInUse(ctx context.Context, zones bool) []string {
	set := map[string]bool{}
	_ = x.d.eachNode(ctx, func(_ state.Fleet, n state.Node) bool {
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

// eachNode calls fn for every node of every fleet in one read
// transaction, until fn returns false.
func (d *Daemon) eachNode(ctx context.Context, fn func(f state.Fleet, n state.Node) bool) error {
	return d.store.View(ctx, func(tx state.Tx) error {
		fleets, err := tx.Fleets()
		if err != nil {
			return err
		}
		for _, f := range fleets {
			nodes, err := tx.Nodes(f.Name)
			if err != nil {
				return err
			}
			for _, n := range nodes {
				if !fn(f, n) {
					return nil
				}
			}
		}
		return nil
	})
}
