package fleet

import (
	"context"
	"time"

	"github.com/fleetd/fleetd/fleet/controller"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/providers"
)

// controllerDeps is the daemon as the plan's performer (fleet/controller,
// run only by the leader) sees it.
type controllerDeps struct{ d *Daemon }

var _ controller.Deps = controllerDeps{}

func (x controllerDeps) Update(ctx context.Context, fn func(state.Tx) error) error {
	return x.d.update(ctx, fn)
}

func (x controllerDeps) AppendEvent(ctx context.Context, e state.Event) { x.d.appendEvent(ctx, e) }

func (x controllerDeps) Provider(ctx context.Context, f state.Fleet, name string) (providers.Provider, providers.Config, error) {
	return x.d.providerFor(ctx, f, name)
}

func (x controllerDeps) CountProviderCall(provider, op, region string, cfg providers.Config, err error) {
	x.d.countProviderCallIn(provider, op, callRegion(err, region, cfg), err)
}

func (x controllerDeps) UserData(fleet string, fl *spec.Fleet, n state.Node) (string, error) {
	return x.d.userData(fleet, fl, n)
}

func (x controllerDeps) Exclude(ctx context.Context, fleet, node, reason string) error {
	if x.d.rz() == nil {
		return nil
	}
	return x.d.rz().Exclude(ctx, fleet, node, reason)
}

func (x controllerDeps) ForgetSpend(tx state.Tx, n state.Node, now time.Time) error {
	return addSpendForgotten(tx, n, now)
}

func (x controllerDeps) NodeRunning(fleet string, n state.Node) { x.d.noteRunning(fleet, n) }

func (x controllerDeps) LaunchRequested(fleet, node string, at time.Time) {
	x.d.noteLaunchRequested(fleet, node, at)
}

func (x controllerDeps) Now() time.Time { return x.d.now() }

func (x controllerDeps) DaemonID() string { return x.d.daemonID }

func (x controllerDeps) NoteOfferings(fleet, provider string, fl *spec.Fleet, o []providers.Offering) {
	x.d.noteOfferings(o)
	x.d.notePrices(fleet, provider, fl, o)
}

func (x controllerDeps) ServableOfferings(offs []providers.Offering) []providers.Offering {
	kept, _ := x.d.servableOfferings(offs)
	return kept
}

func (x controllerDeps) Notice(ctx context.Context, fleet string, n interruption.Notice) error {
	return x.d.HandleNotice(ctx, fleet, n)
}
