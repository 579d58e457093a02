package placement

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/providers"
)

// Moving a job prices its checkpoint's journey (docs/placement.md,
// "Moving a job"): every node of the job in a new group restores the
// latest checkpoint from the store before its workers start, which costs
// the store's egress to that group (checkpoint bytes × $/GB × nodes) and
// the restore time at the measured throughput, during which the nodes
// are paid for and do not train. The one-off cost is spread over
// MoveCost.Horizon and added to the group's cost per useful GPU-hour.

// Location is a cloud and region.
type Location struct {
	Cloud  string `json:"cloud"`
	Region string `json:"region,omitempty"`
}

func (l Location) String() string {
	if l.Region == "" {
		return l.Cloud
	}
	return l.Cloud + ":" + l.Region
}

// EgressRate is one row of an egress table: data from From to To costs
// PerGB dollars per GB (10⁹ bytes). From and To are "cloud", "cloud:region"
// or "*".
type EgressRate struct {
	From  string  `json:"from"`
	To    string  `json:"to"`
	PerGB float64 `json:"per_gb"`
}

// EgressTable prices data transfer between locations: the most specific
// matching row wins (region over cloud over "*", the source side first).
type EgressTable struct {
	Rates []EgressRate `json:"rates"`
	// Source and AsOf say where the prices come from and how old they are.
	Source string `json:"source"`
	AsOf   string `json:"as_of"`
}

// DefaultEgress is the list-price table fleetd ships: internet egress
// (what leaving a cloud for another costs) and inter-region transfer
// within AWS and GCP. Same-region transfer, and anything from or to a
// cloud the table does not name (local, sim), is free. Override it per
// fleet with placement.egress_per_gb.
var DefaultEgress = EgressTable{
	Rates: []EgressRate{
		{From: "aws", To: "*", PerGB: 0.09},   // EC2/S3 data transfer out to the internet, first 10 TB/month
		{From: "aws", To: "aws", PerGB: 0.02}, // between AWS regions (most US/EU pairs)
		{From: "gcp", To: "*", PerGB: 0.12},   // GCP premium-tier internet egress, 0–1 TB/month (worldwide except China, Australia)
		{From: "gcp", To: "gcp", PerGB: 0.02}, // between GCP regions within a continent (Cloud Storage and Compute)
	},
	Source: "AWS EC2 on-demand pricing, Data Transfer; Google Cloud network pricing (premium tier) and Cloud Storage network pricing: list prices",
	AsOf:   "2025-06",
}

// specificity ranks a pattern: "*" 0, "cloud" 1, "cloud:region" 2.
func specificity(p string) int {
	switch {
	case p == "*":
		return 0
	case strings.Contains(p, ":"):
		return 2
	}
	return 1
}

func matches(p string, l Location) bool {
	switch {
	case p == "*":
		return true
	case strings.Contains(p, ":"):
		return p == l.String()
	}
	return p == l.Cloud
}

// Rate returns the $/GB from src to dst and the row that set it ("" for
// free same-region or unpriced transfer).
func (t EgressTable) Rate(src, dst Location) (float64, string) {
	best, bestScore := -1, -1
	for i, r := range t.Rates {
		if !matches(r.From, src) || !matches(r.To, dst) {
			continue
		}
		if s := 3*specificity(r.From) + specificity(r.To); s > bestScore {
			best, bestScore = i, s
		}
	}
	// An explicit row for this very pair wins; otherwise the same region
	// is free.
	if src == dst && (best < 0 || specificity(t.Rates[best].From) < 2 || specificity(t.Rates[best].To) < 2) {
		return 0, ""
	}
	if best < 0 {
		return 0, ""
	}
	r := t.Rates[best]
	return r.PerGB, r.From + "->" + r.To
}

// With returns the table with overrides (most specific first, as any row).
func (t EgressTable) With(over []EgressRate, source string) EgressTable {
	if len(over) == 0 {
		return t
	}
	// Overrides come first: Rate keeps the first of equally specific rows.
	return EgressTable{Rates: append(append([]EgressRate{}, over...), t.Rates...), Source: source + "; " + t.Source, AsOf: t.AsOf}
}

// DefaultRestoreMiBps is the restore throughput assumed before one was
// measured.
const DefaultRestoreMiBps = 200

// DefaultMoveHorizon spreads a move's one-off cost when the fleet gives no
// remaining work.
const DefaultMoveHorizon = 6 * time.Hour

// MoveCost is what moving the job's checkpoint costs; nil or Bytes 0
// prices moves as free.
type MoveCost struct {
	// Bytes is the checkpoint's size (measured, or the spec's size_gb).
	Bytes int64 `json:"bytes"`
	// Source is where the checkpoint is: the store's location; an empty
	// Cloud means the job's current group.
	Source Location    `json:"source"`
	Egress EgressTable `json:"egress"`
	// RestoreMiBps is the restore throughput (measured, or the default).
	RestoreMiBps float64 `json:"restore_mib_per_s"`
	// Horizon is what the one-off cost is spread over: the job's
	// remaining work when known, else DefaultMoveHorizon.
	Horizon time.Duration `json:"horizon"`
	// CloudOf maps a provider name to its cloud; unmapped names are their
	// own cloud (aws, gcp; local and sim transfer for free).
	CloudOf map[string]string `json:"-"`
}

// MoveEstimate is the one-off cost of restoring the checkpoint in a group.
type MoveEstimate struct {
	From           string  `json:"from"`
	To             string  `json:"to"`
	Nodes          int     `json:"nodes"`
	PerGB          float64 `json:"egress_per_gb"`
	EgressUSD      float64 `json:"egress_usd"`
	RestoreSeconds float64 `json:"restore_seconds"`
	RestoreUSD     float64 `json:"restore_usd"`
	// PerGPUHour is (EgressUSD + RestoreUSD) spread over the horizon and
	// the group's GPUs: what Choose adds to the group's cost.
	PerGPUHour float64 `json:"per_gpu_hour"`
}

// TotalUSD is the move's one-off cost.
func (e MoveEstimate) TotalUSD() float64 { return e.EgressUSD + e.RestoreUSD }

func (e MoveEstimate) String() string {
	return fmt.Sprintf("checkpoint %s→%s for %d node(s): egress $%.2f ($%.3f/GB), restore %s ($%.2f)",
		e.From, e.To, e.Nodes, e.EgressUSD, e.PerGB, (time.Duration(e.RestoreSeconds) * time.Second).String(), e.RestoreUSD)
}

// LocationOf is an offering's cloud and region.
func (m *MoveCost) LocationOf(o providers.Offering) Location {
	c := o.Provider
	if m != nil && m.CloudOf != nil {
		if v, ok := m.CloudOf[c]; ok {
			c = v
		}
	}
	return Location{Cloud: c, Region: o.Region}
}

// Estimate prices restoring the checkpoint on the offerings of a group
// (one per node) when the checkpoint is at src.
func (m *MoveCost) Estimate(src Location, nodes []providers.Offering) (MoveEstimate, bool) {
	if m == nil || m.Bytes <= 0 || len(nodes) == 0 {
		return MoveEstimate{}, false
	}
	dst := m.LocationOf(nodes[0])
	rate, _ := m.Egress.Rate(src, dst)
	gb := float64(m.Bytes) / 1e9
	mibps := m.RestoreMiBps
	if mibps <= 0 {
		mibps = DefaultRestoreMiBps
	}
	secs := float64(m.Bytes) / (1 << 20) / mibps
	perHour, gpus := 0.0, 0
	for _, o := range nodes {
		perHour += o.PricePerHour
		gpus += max(o.GPUs, 1)
	}
	e := MoveEstimate{From: src.String(), To: dst.String(), Nodes: len(nodes), PerGB: rate,
		EgressUSD: gb * rate * float64(len(nodes)), RestoreSeconds: secs, RestoreUSD: secs / 3600 * perHour}
	h := m.Horizon
	if h <= 0 {
		h = DefaultMoveHorizon
	}
	e.PerGPUHour = e.TotalUSD() / (h.Hours() * float64(gpus))
	return e, true
}

// sourceFor is where the checkpoint is: the store's location, else the
// job's current nodes' (the first one's), else nowhere known.
func (m *MoveCost) sourceFor(nodes []providers.Offering) Location {
	if m == nil {
		return Location{}
	}
	if m.Source.Cloud != "" {
		return m.Source
	}
	if len(nodes) > 0 {
		return m.LocationOf(nodes[0])
	}
	return Location{}
}

// MoveCostFor is the move cost of a fleet's checkpoint: its measured size
// (bytes, 0 when none was measured yet) or the spec's size_gb, the
// store's location, the default egress table with the spec's overrides,
// the measured restore throughput (0: DefaultRestoreMiBps) and the
// fleet's remaining work as the horizon. Nil without a checkpoint block
// or a size.
func MoveCostFor(fl *spec.Fleet, bytes int64, restoreMiBps float64) *MoveCost {
	if fl == nil || fl.Training.Checkpoint == nil {
		return nil
	}
	c := fl.Training.Checkpoint
	if bytes <= 0 {
		bytes = int64(c.SizeGB * 1e9)
	}
	if bytes <= 0 {
		return nil
	}
	m := &MoveCost{Bytes: bytes, RestoreMiBps: restoreMiBps, Horizon: fl.Work}
	if st, err := spec.ParseStoreURL(c.Store); err == nil && st.Cloud() != "" {
		m.Source = Location{Cloud: st.Cloud(), Region: st.Query.Get("region")}
	}
	m.Egress = EgressFor(fl.Placement)
	return m
}

// EgressFor is the default egress table with a fleet's
// placement.egress_per_gb overrides.
func EgressFor(pl spec.Placement) EgressTable {
	var over []EgressRate
	keys := make([]string, 0, len(pl.EgressPerGB))
	for k := range pl.EgressPerGB {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if from, to, ok := spec.ParseEgressKey(k); ok {
			over = append(over, EgressRate{From: from, To: to, PerGB: pl.EgressPerGB[k]})
		}
	}
	return DefaultEgress.With(over, "spec placement.egress_per_gb")
}
