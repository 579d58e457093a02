package fleet

import (
	"context"
	"errors"
	"fmt"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
)

// Tokens limited to a project (docs/security.md): the API routes that
// name a fleet ask fleetProject; apply and plan check every fleet of the
// spec with checkSpec.
type fleetScope struct {
	store Store
	spec  func(state.Fleet) (*spec.Fleet, error)
}

// fleetProject implements api.Server.FleetProject: the project of a
// stored fleet, from its stored spec. An unreadable spec is in no
// project (""), so a project-limited token never reaches it.
func (d fleetScope) fleetProject(ctx context.Context, name string) (string, error) {
	f, err := state.Read(ctx, d.store, func(tx state.Tx) (state.Fleet, error) { return tx.Fleet(name) })
	if err != nil {
		return "", fmt.Errorf("fleet %q: %w", name, err)
	}
	fl, err := d.spec(f)
	if err != nil {
		return "", nil
	}
	return fl.ProjectName(), nil
}

// checkSpec refuses a spec a project-limited token may not plan or
// apply: a fleet of another project, or one whose name a fleet of
// another project already holds (applying it would move that fleet).
func (d fleetScope) checkSpec(ctx context.Context, file *spec.File) error {
	proj := api.ProjectScope(ctx)
	if proj == "" {
		return nil
	}
	for _, fl := range file.Fleets {
		if fl.ProjectName() != proj {
			return api.ScopeError(proj, fmt.Sprintf("the spec's fleet %q is in project %q", fl.Name, fl.ProjectName()))
		}
		cur, err := d.fleetProject(ctx, fl.Name)
		switch {
		case errors.Is(err, state.ErrNotFound):
		case err != nil:
			return err
		case cur != proj:
			return api.ScopeError(proj, fmt.Sprintf("fleet %q already exists in project %q", fl.Name, cur))
		}
	}
	return nil
}
