package reconcile

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

// Identity is who a fleet's instances belong to: this daemon (or cluster)
// and this incarnation of the fleet name. A pass only ever adopts, drains
// or deletes instances whose tags name both; anything else carrying the
// fleet's name is reported and left alone.
type Identity struct {
	Fleet       string
	DaemonID    string
	Incarnation string
	// LegacyUntagged accepts instances without an incarnation tag (launched
	// before incarnations existed) as this incarnation's.
	LegacyUntagged bool
}

// FleetIdentity is the identity of fleet f's current incarnation under daemon.
func FleetIdentity(f state.Fleet, daemon string) Identity {
	return Identity{Fleet: f.Name, DaemonID: daemon, Incarnation: f.Incarnation, LegacyUntagged: f.LegacyUntagged}
}

// Tags are the tags a launch for node gives its instance.
func (id Identity) Tags(node string) map[string]string {
	t := map[string]string{providers.TagFleet: id.Fleet, providers.TagNodeID: node, providers.TagDaemonID: id.DaemonID}
	if id.Incarnation != "" {
		t[providers.TagIncarnation] = id.Incarnation
	}
	return t
}

// Token is the idempotency token of node's launch: the daemon id and the
// node id, which carries the incarnation and a random part, so a token
// never repeats across daemons sharing an account, re-created fleets, or
// a state restored from an older backup.
func (id Identity) Token(node string) string {
	if id.DaemonID == "" {
		return node
	}
	return id.DaemonID + "." + node
}

// Owner says whose an observed instance is.
type Owner int

const (
	Ours             Owner = iota
	OtherFleet             // another fleet name
	OtherDaemon            // this fleet name, another daemon or cluster
	OtherIncarnation       // this daemon and name, another incarnation
)

// Of classifies an instance. Empty DaemonID or Incarnation (tests, old
// callers) skip their check.
func (id Identity) Of(in providers.Instance) Owner {
	switch {
	case in.Tags[providers.TagFleet] != id.Fleet:
		return OtherFleet
	case id.DaemonID != "" && in.Tags[providers.TagDaemonID] != id.DaemonID:
		return OtherDaemon
	case id.Incarnation == "":
		return Ours
	}
	switch inc := in.Tags[providers.TagIncarnation]; {
	case inc == id.Incarnation, inc == "" && id.LegacyUntagged:
		return Ours
	}
	return OtherIncarnation
}

// ForeignLaunchError is a Create that returned an instance this fleet
// incarnation does not own (its idempotency token was answered with
// another daemon's or incarnation's instance). The node fails without
// backing the offering off, and the instance is never recorded.
type ForeignLaunchError struct {
	InstanceID string
	Owner      Owner
	Tags       map[string]string
}

func (e *ForeignLaunchError) Error() string {
	who := "another fleet"
	switch e.Owner {
	case OtherDaemon:
		who = fmt.Sprintf("daemon %q", e.Tags[providers.TagDaemonID])
	case OtherIncarnation:
		who = fmt.Sprintf("incarnation %q", e.Tags[providers.TagIncarnation])
	}
	return fmt.Sprintf("launch returned instance %s of %s; not adopting it", e.InstanceID, who)
}

// CheckLaunched returns a *ForeignLaunchError if an instance Create
// returned for node is not this incarnation's, or its node tag names
// another node. Providers that echo no tags (none today) pass.
func (id Identity) CheckLaunched(node string, created []providers.Instance) error {
	for _, in := range created {
		if len(in.Tags) == 0 {
			continue
		}
		if o := id.Of(in); o != Ours {
			return &ForeignLaunchError{InstanceID: in.ID, Owner: o, Tags: in.Tags}
		}
		if n := in.Tags[providers.TagNodeID]; n != "" && n != node {
			return &ForeignLaunchError{InstanceID: in.ID, Owner: OtherFleet, Tags: in.Tags}
		}
	}
	return nil
}

func isForeignLaunch(err error) bool {
	var fe *ForeignLaunchError
	return errors.As(err, &fe)
}

// NodeIDs returns a NewNodeID for Input: "<fleet>-<incarnation>-<n>-<r>"
// with n one more than the highest ordinal among nodes (for people: the
// fleet's 7th node) and r four random characters, so ids never repeat:
// not after a re-create (new incarnation), not after a state restore
// (random part). rnd returns n random id characters (state.RandomID).
func NodeIDs(fleet, incarnation string, nodes []state.Node, rnd func(n int) (string, error)) func() string {
	prefix := fleet + "-" + incarnation + "-"
	next := 1
	for _, n := range nodes {
		rest, ok := strings.CutPrefix(n.ID, prefix)
		if !ok {
			continue
		}
		ord, _, _ := strings.Cut(rest, "-")
		if k, err := strconv.Atoi(ord); err == nil && k >= next {
			next = k + 1
		}
	}
	return func() string {
		r, err := rnd(4)
		if err != nil {
			// The system random source failing is not survivable anyway;
			// the ordinal still keeps ids of this pass apart.
			r = "x"
		}
		id := prefix + strconv.Itoa(next) + "-" + r
		next++
		return id
	}
}
