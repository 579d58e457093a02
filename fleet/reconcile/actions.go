package reconcile

import (
	"fmt"
	"time"

	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

// Action is one step of a Plan. The daemon executes a plan's actions in
// order; every action that changes a node carries the full updated record,
// which the daemon persists (with an event) before acting on it.
type Action interface {
	// String is a one-line human description, reason included.
	String() string
	isAction()
}

// Transition moves a node to another lifecycle state. Node is the updated
// record (State, Reason, UpdatedAt and any field the move sets, e.g.
// Deadline). Persist it, append a node.transition event, then act.
type Transition struct {
	Node   state.Node      `json:"node"`
	From   state.NodeState `json:"from"`
	To     state.NodeState `json:"to"`
	Reason string          `json:"reason"`
}

// Launch asks for one instance for Node. Node is in state requested: when
// it is new (Relaunch false), persist it first. Then persist it as
// provisioning (StartLaunch), call Create with IdempotencyToken = Node.ID
// and the fleet/node/daemon tags, and feed the outcome to AfterLaunch. A
// relaunch repeats Create with the same token; the provider returns the
// first call's instance if there was one.
type Launch struct {
	Node     state.Node         `json:"node"`
	Offering providers.Offering `json:"offering"`
	Relaunch bool               `json:"relaunch,omitempty"`
	Reason   string             `json:"reason"`
	// Network is the launch's fast-network request (node.network,
	// placement.NetworkFor); zero for a standard launch.
	Network providers.NetworkRequest `json:"network,omitzero"`
}

// Terminate deletes a node's instance. The node's state change, if any,
// comes as a Transition before it.
type Terminate struct {
	NodeID     string `json:"node_id"`
	InstanceID string `json:"instance_id"`
	Provider   string `json:"provider"`
	Reason     string `json:"reason"`
}

// DeleteOrphan deletes an instance that carries this daemon's and fleet's
// tags but that no node record accounts for.
type DeleteOrphan struct {
	Instance providers.Instance `json:"instance"`
	Reason   string             `json:"reason"`
}

// Adopt records that a requested/provisioning node's instance exists:
// Node is the updated record (booting, InstanceID, Address).
type Adopt struct {
	Node     state.Node         `json:"node"`
	Instance providers.Instance `json:"instance"`
	Reason   string             `json:"reason"`
}

// MarkUnavailable puts an offering in the unavailable-offerings cache:
// apply placement.MarkUnavailable(record, now, Reason, Kind) and persist.
type MarkUnavailable struct {
	Key    string                    `json:"key"`
	Kind   placement.UnavailableKind `json:"kind"`
	Reason string                    `json:"reason"`
}

// Alert is a condition to surface in status. Alerts are level-triggered:
// every plan carries the complete set of the fleet's current alerts, so the
// daemon replaces the previous set (and logs an event for new ones).
type Alert struct {
	Kind    string `json:"kind"`
	Subject string `json:"subject,omitempty"`
	Message string `json:"message"`
}

// Drain tells the node's agent (through the rendezvous service) to drain
// by Deadline: new round without it, drain file, SIGTERM, SIGKILL after
// drain_grace. The node's Transition to draining comes before it.
type Drain struct {
	NodeID   string    `json:"node_id"`
	Deadline time.Time `json:"deadline"`
	Reason   string    `json:"reason"`
}

// ForgetNode deletes a node record that ended long enough ago.
type ForgetNode struct {
	NodeID string `json:"node_id"`
	Reason string `json:"reason"`
}

func (Transition) isAction()      {}
func (Launch) isAction()          {}
func (Terminate) isAction()       {}
func (DeleteOrphan) isAction()    {}
func (Adopt) isAction()           {}
func (MarkUnavailable) isAction() {}
func (Alert) isAction()           {}
func (Drain) isAction()           {}
func (ForgetNode) isAction()      {}

func (a Transition) String() string {
	return fmt.Sprintf("transition %s %s→%s: %s", a.Node.ID, a.From, a.To, a.Reason)
}

func (a Launch) String() string {
	verb := "launch"
	if a.Relaunch {
		verb = "relaunch"
	}
	return fmt.Sprintf("%s %s on %s ($%.4f/h): %s", verb, a.Node.ID, a.Offering.Key(), a.Offering.PricePerHour, a.Reason)
}

func (a Terminate) String() string {
	return fmt.Sprintf("terminate %s (%s %s): %s", a.NodeID, a.Provider, a.InstanceID, a.Reason)
}

func (a DeleteOrphan) String() string {
	return fmt.Sprintf("delete orphan %s (%s): %s", a.Instance.ID, a.Instance.Offering.Provider, a.Reason)
}

func (a Adopt) String() string {
	return fmt.Sprintf("adopt %s instance %s: %s", a.Node.ID, a.Instance.ID, a.Reason)
}

func (a MarkUnavailable) String() string {
	return fmt.Sprintf("mark %s unavailable (%s): %s", a.Key, a.Kind, a.Reason)
}

func (a Alert) String() string {
	return fmt.Sprintf("alert %s: %s", a.Kind, a.Message)
}

func (a Drain) String() string {
	return fmt.Sprintf("drain %s by %s: %s", a.NodeID, a.Deadline.UTC().Format(time.RFC3339), a.Reason)
}

func (a ForgetNode) String() string {
	return fmt.Sprintf("forget %s: %s", a.NodeID, a.Reason)
}

// Alert kinds.
const (
	AlertObserve    = "observe-failed"     // a provider's List failed: no decisions about its instances
	AlertQuota      = "quota"              // an offering is backed off on a quota error
	AlertNoCapacity = "no-capacity"        // below min_nodes and no group can hold min_nodes
	AlertOnDemand   = "on-demand-fallback" // a spot fleet runs on-demand nodes
	AlertForeign    = "foreign-instance"   // an instance with this fleet's tag but another daemon id
	// AlertOtherIncarnation: an instance of this daemon and fleet name but
	// another incarnation (one a destroy left behind, or a restored state's).
	AlertOtherIncarnation = "other-incarnation"
	AlertUnknownAge       = "orphan-unknown-age" // an orphan without a launch time; never deleted automatically
)
