package fleet

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fleetd/fleetd/fleet/agentapi"
	"github.com/fleetd/fleetd/fleet/state"
)

// Node tokens are derived, not stored (agentapi.NodeToken, which says
// why), from the node secret. The secret lives in data_dir/node-secret
// (0600), or in the shared state for a cluster.
func (d *Daemon) loadNodeSecret() error {
	if d.cl != nil {
		// Node tokens must stay valid on whichever server leads: the
		// secret they derive from is shared state.
		s, err := sharedSecret(context.Background(), d.store, "node_secret", func() (string, error) { return randHex(32), nil })
		if err != nil {
			return err
		}
		d.nodeSecret, err = hex.DecodeString(s)
		if err != nil || len(d.nodeSecret) < 32 {
			return fmt.Errorf("shared node secret is damaged")
		}
		return nil
	}
	p := filepath.Join(d.cfg.DataDir, "node-secret")
	b, err := os.ReadFile(p)
	switch {
	case err == nil:
		d.nodeSecret, err = hex.DecodeString(strings.TrimSpace(string(b)))
		if err != nil || len(d.nodeSecret) < 32 {
			return fmt.Errorf("node secret %s is damaged", p)
		}
		return nil
	case errors.Is(err, os.ErrNotExist):
		s := randHex(32)
		if err := writeFileAtomic(p, []byte(s+"\n"), 0o600); err != nil {
			return err
		}
		d.nodeSecret, _ = hex.DecodeString(s)
		return nil
	}
	return err
}

// NodeToken is the bearer token of one node's agent. It reads the node's
// record (call it outside store transactions): the token is bound to the
// record's creation time as well as its id. Node ids no longer repeat
// (they carry the fleet incarnation and a random part), but ids of fleets
// from before incarnations ("<fleet>-<gen>-<n>") did, and the token of a
// node that is gone must never work for a namesake.
func (d *Daemon) NodeToken(fleetName, nodeID string) string {
	var created time.Time
	_ = d.store.View(context.Background(), func(tx state.Tx) error {
		if n, err := tx.Node(fleetName, nodeID); err == nil {
			created = n.CreatedAt
		}
		return nil
	})
	return agentapi.NodeToken(d.nodeSecret, fleetName, nodeID, created)
}
