package fleet

import (
	"context"

	"github.com/fleetd/fleetd/fleet/state"
)

// Store is what the daemon needs from its state: the transactional store
// plus batched event appends and counts. *state.BoltStore (one server) and
// *state.Etcd (a cluster) implement it.
type Store interface {
	state.Store
	AppendEvents(ctx context.Context, events []state.Event) ([]state.Event, error)
	Stats(ctx context.Context) (state.Stats, error)
}

var (
	_ Store = (*state.BoltStore)(nil)
	_ Store = (*state.Etcd)(nil)
)
