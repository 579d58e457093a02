// Package state is fleetd's persistent store: fleets, nodes, the event log,
// offering history and daemon metadata. The daemon is its only writer.
package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/fleetd/fleetd/providers"
)

// ErrNotFound is returned (wrapped) when a fleet or node does not exist.
var ErrNotFound = errors.New("not found")

// Fleet is an applied fleet spec. Source is kept verbatim so the daemon can
// re-decode it after an upgrade and `fleetd status` can show what was applied.
type Fleet struct {
	Name     string            `json:"name"`
	Filename string            `json:"filename"`
	Source   []byte            `json:"source"`
	Vars     map[string]string `json:"vars,omitempty"`
	// BaseDir, Files and Env make re-parsing Source reproducible: the spec's
	// directory, the files its file() calls read, and the env() values used.
	BaseDir    string            `json:"base_dir,omitempty"`
	Files      map[string]string `json:"files,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	Generation int64             `json:"generation"` // bumped by every PutFleet
	// Incarnation identifies this life of the fleet name, from the apply
	// that created it to its destroy: random, made by PutFleet for a new
	// record, kept by every later PutFleet. Its instances carry it
	// (providers.TagIncarnation), so a re-created fleet of the same name
	// never adopts, drains or deletes its predecessor's.
	Incarnation string `json:"incarnation,omitempty"`
	// LegacyUntagged marks a fleet that existed before incarnations (the
	// schema 1 → 2 migration): its instances launched before the upgrade
	// carry no incarnation tag and still belong to it. New launches are
	// tagged either way.
	LegacyUntagged bool `json:"legacy_untagged,omitempty"`
	Destroying     bool `json:"destroying,omitempty"`
	// Completed is set when the training job finished; the fleet then
	// scales to zero but stays listed with its outcome.
	Completed   bool      `json:"completed,omitempty"`
	Succeeded   bool      `json:"succeeded,omitempty"`
	CompletedAt time.Time `json:"completed_at,omitzero"`
	// CompletedDetail is what the agent that reported the end said of it.
	CompletedDetail string    `json:"completed_detail,omitempty"`
	CreatedAt       time.Time `json:"created_at"`
	UpdatedAt       time.Time `json:"updated_at"`
}

// NodeState is a node's lifecycle state.
type NodeState string

const (
	NodeRequested    NodeState = "requested"
	NodeProvisioning NodeState = "provisioning"
	NodeBooting      NodeState = "booting"
	NodeJoined       NodeState = "joined"
	NodeRunning      NodeState = "running"
	NodeDraining     NodeState = "draining"
	NodeTerminating  NodeState = "terminating"
	NodeTerminated   NodeState = "terminated"
	NodeFailed       NodeState = "failed"
)

// Node is one member of a fleet, from the decision to launch it until it is gone.
type Node struct {
	ID         string             `json:"id"`
	Fleet      string             `json:"fleet"`
	State      NodeState          `json:"state"`
	Reason     string             `json:"reason,omitempty"` // why it entered State
	Offering   providers.Offering `json:"offering"`
	InstanceID string             `json:"instance_id,omitempty"`
	Address    string             `json:"address,omitempty"`
	TokenHash  string             `json:"token_hash,omitempty"` // sha256 of the per-node token, never the token
	Round      int64              `json:"round,omitempty"`
	Deadline   time.Time          `json:"deadline,omitempty"` // interruption deadline while draining
	// DrainedAt is when its agent reported, while draining, that its
	// workers stopped and its newest checkpoint is stored: the drain
	// ends then, not at Deadline.
	DrainedAt     time.Time `json:"drained_at,omitzero"`
	LastHeartbeat time.Time `json:"last_heartbeat,omitempty"`
	AgentVersion  string    `json:"agent_version,omitempty"` // as the agent said at its last registration
	// Network is the fast network its launch asked for (node.network), so
	// a relaunch repeats the same request and its agent learns the path.
	Network   providers.NetworkRequest `json:"network,omitzero"`
	CreatedAt time.Time                `json:"created_at"`
	UpdatedAt time.Time                `json:"updated_at"`
}

// Event is one entry of the append-only event log. Seq is assigned by the
// store, strictly increasing and never reused.
type Event struct {
	Seq   uint64    `json:"seq"`
	Time  time.Time `json:"time"`
	Fleet string    `json:"fleet,omitempty"`
	// Incarnation is the fleet's incarnation when the event was written;
	// AppendEvent fills it in for events of an existing fleet, so the
	// history of a destroyed fleet is never shown as its successor's.
	Incarnation string            `json:"incarnation,omitempty"`
	Node        string            `json:"node,omitempty"`
	Type        string            `json:"type"` // e.g. fleet.applied, node.transition, notice
	Message     string            `json:"message"`
	Data        map[string]string `json:"data,omitempty"`
}

// OfferingRecord is what this deployment has learned about an offering.
type OfferingRecord struct {
	Key               string    `json:"key"` // providers.Offering.Key()
	UnavailableUntil  time.Time `json:"unavailable_until,omitempty"`
	UnavailableReason string    `json:"unavailable_reason,omitempty"`
	Interruptions     int       `json:"interruptions"`
	Launches          int       `json:"launches"`
	RunSeconds        float64   `json:"run_seconds"` // observed instance-seconds, for interruption rates
	UpdatedAt         time.Time `json:"updated_at"`
}

// StagingRecord is a node's latest staging report for one data block,
// kept so status shows a copy's progress across a daemon restart. Report
// is the agent's report as the daemon encodes it (opaque here, like meta
// values); the record goes with its node.
type StagingRecord struct {
	Fleet     string          `json:"fleet"`
	Node      string          `json:"node"`
	MountPath string          `json:"mount_path"`
	Report    json.RawMessage `json:"report"`
	UpdatedAt time.Time       `json:"updated_at"`
}

// Tx is a view of the store inside one transaction. Writes made through a
// Tx commit together or not at all.
type Tx interface {
	Meta(key string) ([]byte, error) // nil, nil when absent
	SetMeta(key string, value []byte) error

	Fleet(name string) (Fleet, error)
	Fleets() ([]Fleet, error)
	// PutFleet stores f with Generation set to the previous generation + 1
	// and returns the stored value. A new record gets a fresh random
	// Incarnation (unless f names one); an existing one keeps its own.
	PutFleet(f Fleet) (Fleet, error)
	DeleteFleet(name string) error // also deletes its nodes

	Node(fleet, id string) (Node, error)
	Nodes(fleet string) ([]Node, error)
	// SharedNodes is Nodes for a reader that modifies neither the slice
	// nor its nodes: the result may be the store's cached copy, handed to
	// every such reader until the fleet's nodes change. A reconcile pass
	// over 10,000 nodes then copies none.
	SharedNodes(fleet string) ([]Node, error)
	PutNode(n Node) error
	DeleteNode(fleet, id string) error

	// AppendEvent assigns Seq (and Time if zero) and returns the stored event.
	AppendEvent(e Event) (Event, error)

	Offering(key string) (OfferingRecord, error) // zero record with Key set when absent
	Offerings() ([]OfferingRecord, error)
	PutOffering(r OfferingRecord) error

	// PutStaging stores r (UpdatedAt set to now) in place of the node's
	// record for r.MountPath; ErrNotFound if the node does not exist.
	PutStaging(r StagingRecord) error
	// Stagings returns the fleet's staging records ordered by node id,
	// then mount path; none for an unknown fleet.
	Stagings(fleet string) ([]StagingRecord, error)
}

// Store is the persistent state. Update runs fn in a read-write transaction
// that is durable (fsynced) when Update returns nil.
type Store interface {
	View(ctx context.Context, fn func(Tx) error) error
	Update(ctx context.Context, fn func(Tx) error) error
	// Events returns up to limit events with Seq > since, in order.
	Events(ctx context.Context, since uint64, limit int) ([]Event, error)
	Close() error
}

// Viewer is the read side of a Store.
type Viewer interface {
	View(ctx context.Context, fn func(Tx) error) error
}

// ReadMetaJSON decodes the JSON document stored under meta key into v;
// false, and v untouched, when there is none. A document that does not
// decode is an error prefixed with what.
func ReadMetaJSON(tx Tx, key, what string, v any) (bool, error) {
	b, err := tx.Meta(key)
	if err != nil || len(b) == 0 {
		return false, err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return true, fmt.Errorf("%s: %w", what, err)
	}
	return true, nil
}

// Read runs fn in a read transaction and returns what it read.
func Read[T any](ctx context.Context, s Viewer, fn func(Tx) (T, error)) (T, error) {
	var out T
	err := s.View(ctx, func(tx Tx) error {
		var err error
		out, err = fn(tx)
		return err
	})
	return out, err
}
