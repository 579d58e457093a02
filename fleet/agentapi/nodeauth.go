package agentapi

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/rendezvous"
)

// NodeToken is the bearer token of one node's agent. Node tokens are
// derived, not stored: token = HMAC(node secret, fleet/node/created),
// created being the node record's creation time. A daemon that crashes
// between persisting a node and launching it renders the same user-data
// again after restart, so the provider's idempotent Create and the agent's
// token still agree; and a leaked state file holds no tokens. Binding the
// token to created ties it to the record's incarnation: node ids repeat,
// and the token of a node that is gone must never work for its namesake.
func NodeToken(secret []byte, fleetName, nodeID string, created time.Time) string {
	m := hmac.New(sha256.New, secret)
	fmt.Fprintf(m, "%s/%s/%d.%09d", fleetName, nodeID, created.Unix(), created.Nanosecond())
	return "fleetd_node_" + hex.EncodeToString(m.Sum(nil))
}

var (
	errUnauthorized       = errors.New("unauthorized")
	errForbidden    error = forbiddenError{}
)

// forbiddenError also matches rendezvous.ErrForbidden, so the rendezvous
// routes (which share AuthorizeNode) answer 403 like the agent routes
// instead of 401: the token is valid, just not for this node.
type forbiddenError struct{}

func (forbiddenError) Error() string        { return "forbidden" }
func (forbiddenError) Is(target error) bool { return target == rendezvous.ErrForbidden }

// AuthorizeNode checks that the request carries the token of exactly this
// node (or the admin token). A node's token cannot act on another node.
func (a *API) AuthorizeNode(r *http.Request, fleetName, nodeID string) error {
	tok := api.BearerToken(r)
	if tok == "" {
		return fmt.Errorf("%w: missing bearer token", errUnauthorized)
	}
	if api.TokenEqual(tok, []byte(a.adminToken)) {
		return nil
	}
	if !strings.HasPrefix(tok, "fleetd_node_") {
		// A valid read/operate token is known but never acts as a node:
		// 403, like a node token on another node.
		if role, err := a.deps.VerifyScopedToken(r.Context(), tok); err == nil {
			return fmt.Errorf("%w: a %s token cannot act as a node", errForbidden, role)
		}
		return fmt.Errorf("%w: invalid token", errUnauthorized)
	}
	if fleetName == "" || nodeID == "" {
		return fmt.Errorf("%w: a node token acts only on its own node", errForbidden)
	}
	node, err := state.Read(r.Context(), a.deps, func(tx state.Tx) (state.Node, error) { return tx.Node(fleetName, nodeID) })
	if !api.TokenEqual(tok, []byte(NodeToken(a.secret, fleetName, nodeID, node.CreatedAt))) {
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
