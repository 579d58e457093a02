// Package spend is what fleets have cost, kept in the state store's meta:
// a node's spend from its record, what deleted node records had cost (so
// the spend counter never drops), and each fleet name's destroyed
// incarnations. Functions take a transaction; callers decide when to call
// them (the controller when it forgets nodes or a fleet, the API and
// metrics when they read).
package spend

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/fleetd/fleetd/fleet/state"
)

// forgottenKey holds, per fleet, what the node records deleted by
// ForgetNode had cost (a decimal string in USD). fleetd_spend_usd drops
// when a record goes; the counter adds this back so it does not.
func forgottenKey(fleet string) string { return "spend-forgotten/" + fleet }

// NodeUSD is what a node has cost at now: price × time from its
// record's creation to now, or to its end once terminated or failed (the
// rule fleetd_spend_usd and status use).
func NodeUSD(n state.Node, now time.Time) float64 {
	if n.InstanceID == "" {
		return 0
	}
	end := now
	if n.State == state.NodeTerminated || n.State == state.NodeFailed {
		end = n.UpdatedAt
	}
	if h := end.Sub(n.CreatedAt).Hours(); h > 0 {
		return h * n.Offering.PricePerHour
	}
	return 0
}

// historyKey holds, per fleet name, the incarnations destroyed so
// far and what they cost (History JSON): a re-created fleet's spend
// starts from 0, and the name's total counts every incarnation.
func historyKey(fleet string) string { return "spend-history/" + fleet }

// History is what the destroyed incarnations of one fleet name cost.
type History struct {
	TotalUSD float64 `json:"total_usd"`
	// Incarnations lists the newest destroyed incarnations (at most
	// maxHistory); TotalUSD also counts the pruned ones.
	Incarnations []PastIncarnation `json:"incarnations,omitempty"`
}

// PastIncarnation is one destroyed incarnation of a fleet name.
type PastIncarnation struct {
	ID          string    `json:"id"`
	CreatedAt   time.Time `json:"created_at"`
	DestroyedAt time.Time `json:"destroyed_at"`
	SpendUSD    float64   `json:"spend_usd"`
}

const maxHistory = 20

// ReadHistory is the spend history of a fleet name (zero when none).
func ReadHistory(tx state.Tx, fleet string) (History, error) {
	var h History
	b, err := tx.Meta(historyKey(fleet))
	if err != nil || len(b) == 0 {
		return h, err
	}
	return h, json.Unmarshal(b, &h)
}

// Incarnation is what fleet f's current incarnation has cost at now:
// its forgotten node records and its remaining ones.
func Incarnation(tx state.Tx, f string, now time.Time) (float64, error) {
	total, err := ReadForgotten(tx, f)
	if err != nil {
		return 0, err
	}
	nodes, err := tx.Nodes(f)
	if err != nil {
		return 0, err
	}
	for _, n := range nodes {
		total += NodeUSD(n, now)
	}
	return total, nil
}

// RecordDestroyed adds fleet f's current incarnation to its name's spend
// history; call it in the transaction that deletes the fleet.
func RecordDestroyed(tx state.Tx, f state.Fleet, now time.Time) error {
	spend, err := Incarnation(tx, f.Name, now)
	if err != nil {
		return err
	}
	h, err := ReadHistory(tx, f.Name)
	if err != nil {
		return err
	}
	h.TotalUSD += spend
	h.Incarnations = append(h.Incarnations, PastIncarnation{ID: f.Incarnation, CreatedAt: f.CreatedAt, DestroyedAt: now, SpendUSD: spend})
	if n := len(h.Incarnations); n > maxHistory {
		h.Incarnations = h.Incarnations[n-maxHistory:]
	}
	b, err := json.Marshal(h)
	if err != nil {
		return err
	}
	return tx.SetMeta(historyKey(f.Name), b)
}

func ReadForgotten(tx state.Tx, fleet string) (float64, error) {
	b, err := tx.Meta(forgottenKey(fleet))
	if err != nil || len(b) == 0 {
		return 0, err
	}
	return strconv.ParseFloat(string(b), 64)
}

// AddForgotten moves a node's spend into the fleet's forgotten total.
// Call it in the transaction that deletes the node record.
func AddForgotten(tx state.Tx, n state.Node, now time.Time) error {
	prev, err := ReadForgotten(tx, n.Fleet)
	if err != nil {
		return err
	}
	v := prev + NodeUSD(n, now)
	return tx.SetMeta(forgottenKey(n.Fleet), []byte(strconv.FormatFloat(v, 'g', -1, 64)))
}

// ForgetFleet drops a destroyed fleet's forgotten-node total (its
// history keeps the incarnation's spend); call it in the transaction that
// deletes the fleet, after RecordDestroyed.
func ForgetFleet(tx state.Tx, fleet string) error { return tx.SetMeta(forgottenKey(fleet), nil) }
