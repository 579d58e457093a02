package fleet

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/rendezvous"
)

// Node tokens are derived, not stored: token = HMAC(node secret,
// fleet/node/created), created being the node record's creation time.
// A daemon that crashes between persisting a node and launching it renders
// the same user-data again after restart, so the provider's idempotent
// Create and the agent's token still agree; and a leaked state file holds no
// tokens. The secret lives in data_dir/node-secret (0600).
func (d *Daemon) loadNodeSecret() error {
	if d.cl != nil {
		// Node tokens must stay valid on whichever server leads: the
		// secret they derive from is shared state.
		s, err := d.sharedSecret(context.Background(), "node_secret", func() (string, error) { return randHex(32), nil })
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
// record (call it outside store transactions): the token is bound to that
// record's incarnation because node ids repeat ("<fleet>-<gen>-<n>" starts
// over when a fleet is re-created, and a forgotten node's n is reused), and
// the token of a node that is gone must never work for its namesake.
func (d *Daemon) NodeToken(fleetName, nodeID string) string {
	var created time.Time
	_ = d.store.View(context.Background(), func(tx state.Tx) error {
		if n, err := tx.Node(fleetName, nodeID); err == nil {
			created = n.CreatedAt
		}
		return nil
	})
	return d.nodeToken(fleetName, nodeID, created)
}

func (d *Daemon) nodeToken(fleetName, nodeID string, created time.Time) string {
	m := hmac.New(sha256.New, d.nodeSecret)
	fmt.Fprintf(m, "%s/%s/%d.%09d", fleetName, nodeID, created.Unix(), created.Nanosecond())
	return "fleetd_node_" + hex.EncodeToString(m.Sum(nil))
}

var (
	errUnauthorized       = errors.New("unauthorized")
	errForbidden    error = forbiddenError{}
)

// forbiddenError also matches rendezvous.ErrForbidden, so the rendezvous
// routes (which share authorizeNode) answer 403 like the agent routes
// instead of 401: the token is valid, just not for this node.
type forbiddenError struct{}

func (forbiddenError) Error() string        { return "forbidden" }
func (forbiddenError) Is(target error) bool { return target == rendezvous.ErrForbidden }

// authorizeNode checks that the request carries the token of exactly this
// node (or the admin token). A node's token cannot act on another node.
func (d *Daemon) authorizeNode(r *http.Request, fleetName, nodeID string) error {
	tok := api.BearerToken(r)
	if tok == "" {
		return fmt.Errorf("%w: missing bearer token", errUnauthorized)
	}
	if api.TokenEqual(tok, []byte(d.token)) {
		return nil
	}
	if !strings.HasPrefix(tok, "fleetd_node_") {
		// A valid read/operate token is known but never acts as a node:
		// 403, like a node token on another node.
		if role, err := d.verifyScopedToken(r.Context(), tok); err == nil {
			return fmt.Errorf("%w: a %s token cannot act as a node", errForbidden, role)
		}
		return fmt.Errorf("%w: invalid token", errUnauthorized)
	}
	if fleetName == "" || nodeID == "" {
		return fmt.Errorf("%w: a node token acts only on its own node", errForbidden)
	}
	var node state.Node
	err := d.store.View(r.Context(), func(tx state.Tx) error {
		var err error
		node, err = tx.Node(fleetName, nodeID)
		return err
	})
	if !api.TokenEqual(tok, []byte(d.nodeToken(fleetName, nodeID, node.CreatedAt))) {
		return fmt.Errorf("%w: token is not valid for node %s/%s", errForbidden, fleetName, nodeID)
	}
	// The node must exist and not be gone: a token for a forgotten or
	// terminated node is dead.
	if err != nil {
		return fmt.Errorf("%w: unknown node %s/%s", errForbidden, fleetName, nodeID)
	}
	if node.State == state.NodeTerminated {
		return fmt.Errorf("%w: node %s/%s is terminated", errForbidden, fleetName, nodeID)
	}
	return nil
}

// writeAuthError maps an authorization error to 401/403.
func writeAuthError(w http.ResponseWriter, err error) {
	status := http.StatusForbidden
	if errors.Is(err, errUnauthorized) {
		status = http.StatusUnauthorized
		w.Header().Set("WWW-Authenticate", `Bearer realm="fleetd"`)
	}
	api.WriteError(w, status, err)
}
