package fleet

import (
	"context"
	"path/filepath"
	"time"

	"github.com/fleetd/fleetd/fleet/agentapi"
	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/bootstrap"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/interruption"
)

// agentDeps is the daemon as the agent API (fleet/agentapi, served by the
// leader) sees it.
type agentDeps struct{ d *Daemon }

var _ agentapi.Deps = agentDeps{}

func (x agentDeps) View(ctx context.Context, fn func(state.Tx) error) error {
	return x.d.store.View(ctx, fn)
}

func (x agentDeps) Update(ctx context.Context, fn func(state.Tx) error) error {
	return x.d.store.Update(ctx, fn)
}

func (x agentDeps) AppendEvent(ctx context.Context, e state.Event) { x.d.appendEvent(ctx, e) }

func (x agentDeps) FleetSpec(f state.Fleet) (*spec.Fleet, error) { return x.d.fleetSpec(f) }

func (x agentDeps) URL() string { return x.d.URL() }

func (x agentDeps) Notice(ctx context.Context, fleet string, n interruption.Notice) error {
	return x.d.ctrl.HandleNotice(ctx, fleet, n)
}

func (x agentDeps) Joined(fleet, node string, at time.Time) { x.d.stats.Joined(fleet, node, at) }

func (x agentDeps) FinishRendezvous(ctx context.Context, fleet string, success bool) error {
	if x.d.rdzv.rz() == nil {
		return nil
	}
	return x.d.rdzv.rz().Finish(ctx, fleet, success)
}

func (x agentDeps) Kick() { x.d.ctrl.Kick() }

func (x agentDeps) AgentBinaries() *bootstrap.AgentIndex { return x.d.agents.AgentIndex }

func (x agentDeps) VerifyScopedToken(ctx context.Context, tok string) (api.Role, error) {
	p, err := x.d.tokens.verifyScopedToken(ctx, tok)
	return p.Role, err
}

func (x agentDeps) Version() string { return x.d.opts.Version }

func (x agentDeps) CacheDir() string {
	if x.d.cfg.DataDir == "" {
		return ""
	}
	return filepath.Join(x.d.cfg.DataDir, "cache", "agents")
}
