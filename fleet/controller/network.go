package controller

import (
	"context"
	"errors"
	"fmt"

	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/reconcile"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

// ReleaseNetwork deletes the placement groups and resource policies a
// destroyed fleet incarnation's launches created (node.network "auto" or
// "fast"), once none of its instances is left: a group with members
// cannot be deleted. A failure is recorded as an event and does not hold
// the destroy up — an empty group costs nothing, and an account whose
// policy lacks the delete permission must still be able to destroy.
func (c *Controller) ReleaseNetwork(ctx context.Context, f state.Fleet, in reconcile.Input) {
	if in.Fleet == nil || in.Fleet.Node.NetworkMode() == spec.NetworkStandard {
		return
	}
	who := in.Identity()
	for _, inst := range in.Instances {
		if inst.State != providers.StateTerminated && who.Of(inst) == reconcile.Ours {
			return
		}
	}
	group := placement.GroupName(who.Fleet, who.Incarnation)
	for _, ps := range in.Fleet.Providers {
		err := c.releaseNetwork(ctx, f, ps.Name, group)
		if err == nil {
			continue
		}
		c.log.Warn("release network", "fleet", f.Name, "provider", ps.Name, "group", group, "err", err)
		c.appendEvent(ctx, state.Event{Fleet: f.Name, Type: "network.release-failed",
			Message: fmt.Sprintf("placement groups %s-* on %s not deleted: %v", group, ps.Name, err),
			Data:    map[string]string{"provider": ps.Name, "group": group}})
	}
}

func (c *Controller) releaseNetwork(ctx context.Context, f state.Fleet, provider, group string) error {
	p, cfg, err := c.provider(ctx, f, provider)
	if err != nil {
		return err
	}
	nr, ok := p.(providers.NetworkReleaser)
	if !ok {
		return nil
	}
	if err := nr.ReleaseNetwork(ctx, cfg, group); err != nil && !errors.Is(err, errors.ErrUnsupported) {
		return err
	}
	return nil
}
