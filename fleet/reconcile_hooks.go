package fleet

import (
	"context"
	"fmt"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
)

// kick wakes the reconcile loop after a change of desired state.
func (d *Daemon) kick() {
	select {
	case d.kickc <- struct{}{}:
	default:
	}
}

// planOfferings fills the offerings part of a plan. Without a market view
// (no reconciler yet) it leaves the plan as counts only.
func (d *Daemon) planOfferings(tx state.Tx, fl *spec.Fleet, fp *api.FleetPlan) {}

// reconcileLoop drives reconciliation: a periodic tick and kicks.
func (d *Daemon) reconcileLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.kickc:
		}
		if err := d.reconcileOnce(ctx); err != nil {
			d.log.Error("reconcile", "err", err)
		}
	}
}

// reconcileOnce deletes destroyed fleets that have no nodes left.
func (d *Daemon) reconcileOnce(ctx context.Context) error {
	return d.update(ctx, func(tx state.Tx) error {
		fleets, err := tx.Fleets()
		if err != nil {
			return err
		}
		for _, f := range fleets {
			if !f.Destroying {
				continue
			}
			nodes, err := tx.Nodes(f.Name)
			if err != nil {
				return err
			}
			alive := 0
			for _, n := range nodes {
				if n.State != state.NodeTerminated && n.State != state.NodeFailed {
					alive++
				}
			}
			if alive > 0 {
				continue
			}
			if err := tx.DeleteFleet(f.Name); err != nil {
				return err
			}
			if _, err := tx.AppendEvent(state.Event{Fleet: f.Name, Type: "fleet.destroyed", Message: fmt.Sprintf("fleet %s destroyed", f.Name)}); err != nil {
				return err
			}
		}
		return nil
	})
}
