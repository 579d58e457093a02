package agentapi

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/state"
)

// drained takes a draining node's report that its workers stopped and
// its newest checkpoint is stored: the node's drain ends on the next pass
// (reconcile deletes it) instead of at its deadline, so a paused, shrunk
// or reclaimed fleet stops paying for it. A node that is not draining
// (the report came late, or twice) is left alone.
func (a *API) drained(w http.ResponseWriter, r *http.Request) {
	var req api.DrainedRequest
	if !api.DecodeBody(w, r, &req) {
		return
	}
	fleetName, nodeID := r.PathValue("fleet"), r.PathValue("node")
	ended := false
	err := a.deps.Update(r.Context(), func(tx state.Tx) error {
		n, err := tx.Node(fleetName, nodeID)
		if err != nil {
			return err
		}
		if n.State != state.NodeDraining || !n.DrainedAt.IsZero() {
			return nil
		}
		n.DrainedAt, ended = a.now(), true
		if err := tx.PutNode(n); err != nil {
			return err
		}
		msg := "its workers stopped"
		if req.CheckpointStep >= 0 {
			msg += fmt.Sprintf(" after checkpointing step %d", req.CheckpointStep)
		}
		if req.FlushError != "" {
			msg += "; storing its newest checkpoint failed: " + req.FlushError
		}
		_, err = tx.AppendEvent(state.Event{Fleet: fleetName, Node: nodeID, Type: "node.drained",
			Message: fmt.Sprintf("node %s drained: %s; it is deleted now, %s before its drain deadline", nodeID, msg, n.Deadline.Sub(a.now()).Round(100*time.Millisecond)),
			Data:    map[string]string{"checkpoint_step": strconv.FormatInt(req.CheckpointStep, 10)}})
		return err
	})
	if err != nil {
		a.fail(w, err)
		return
	}
	if ended {
		a.deps.Kick()
	}
	api.WriteJSON(w, http.StatusOK, map[string]bool{"ended": ended})
}
