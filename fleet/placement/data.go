package placement

import (
	"fmt"
	"time"

	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/providers"
)

// Where the data is (docs/placement.md, "Data"). A file system is a hard
// constraint: nodes outside its cloud and region cannot mount it (and,
// with zone_policy = "required", outside its zone); in another zone of
// its region every byte read pays cross-zone transfer. A bucket is read
// from anywhere, at the egress table's price from its region to the
// node's: streamed, every epoch; staged, once per node launched. Both
// costs are added to an offering's expected cost per useful GPU-hour, so
// a cheaper zone elsewhere wins only when its saving beats reading the
// data from there.

// CrossZonePerGB is what reading one GB from a file system in another
// zone of the same region costs: AWS bills inter-AZ transfer $0.01/GB in
// each direction (both sides are the job's), GCP $0.01/GB between zones
// of a region (list prices, 2025-06).
var CrossZonePerGB = map[string]float64{"aws": 0.02, "gcp": 0.01}

// Staging throughput one node copies at (docs/placement.md, "Data"): from
// a bucket with parallel GETs (S3 and GCS serve a single client about
// 1 GB/s), and from a peer's copy in its zone, disk to disk over the
// fleet's network. A replacement stages before it joins, so this time is
// part of each interruption's changeover.
var (
	BucketStageGBps = 1.0
	PeerStageGBps   = 2.5
)

// DataCost prices a fleet's datasets from any offering; nil without data.
type DataCost struct {
	Sets   []DataSet
	Egress EgressTable
	// Nodes is the job's node count the per-epoch reads are shared over.
	Nodes int
	// Horizon spreads a staged copy's one-off cost: the remaining work,
	// else DefaultMoveHorizon.
	Horizon time.Duration
	// CloudOf maps a provider name to its cloud (MoveCost.CloudOf: the
	// simulator's market is one cloud under another name).
	CloudOf map[string]string
}

// WithClouds takes the provider-to-cloud map of m (nil-safe both ways).
func (d *DataCost) WithClouds(m *MoveCost) *DataCost {
	if d != nil && m != nil && m.CloudOf != nil {
		d.CloudOf = m.CloudOf
	}
	return d
}

// DataSet is one data block with its parsed source.
type DataSet struct {
	spec.Data
	Src spec.DataSource
}

// DataCostFor is the data cost of fleet fl: its data blocks with a known
// source, the egress table of its checkpoint moves and its target size.
func DataCostFor(fl *spec.Fleet) *DataCost {
	if fl == nil || len(fl.Training.Data) == 0 {
		return nil
	}
	d := &DataCost{Egress: EgressFor(fl.Placement), Nodes: max(fl.TargetNodes(), 1), Horizon: fl.Work}
	if d.Horizon <= 0 {
		d.Horizon = DefaultMoveHorizon
	}
	for _, ds := range fl.Training.Data {
		if src, err := spec.ParseDataSource(ds.Source); err == nil {
			d.Sets = append(d.Sets, DataSet{Data: ds, Src: src})
		}
	}
	if len(d.Sets) == 0 {
		return nil
	}
	return d
}

// Location is where the dataset lives; an empty Cloud for a node
// directory or an NFS server of unknown cloud.
func (s DataSet) Location() Location {
	return Location{Cloud: s.Src.Cloud(), Region: s.Region}
}

// EpochTime is the data block's epoch_time or DefaultEpochTime.
func (s DataSet) EpochTime() time.Duration {
	if s.Data.EpochTime > 0 {
		return s.Data.EpochTime
	}
	return spec.DefaultEpochTime
}

// DataEstimate is what reading one dataset costs from one offering.
type DataEstimate struct {
	Source string `json:"source"`
	Mode   string `json:"mode"`
	From   string `json:"from"`
	To     string `json:"to"`
	// PerGB is the transfer price per GB read (0: free), Rate the row of
	// the egress table or "cross-zone" that set it.
	PerGB float64 `json:"per_gb"`
	Rate  string  `json:"rate,omitempty"`
	// EpochUSD and HourUSD are a streamed or mounted dataset's reads over
	// the whole job, per epoch and per hour of training.
	EpochUSD float64 `json:"epoch_usd,omitempty"`
	HourUSD  float64 `json:"hour_usd,omitempty"`
	// StageUSD is a staged dataset's copy to one node.
	StageUSD float64 `json:"stage_usd,omitempty"`
	// StageSeconds is how long a replacement node stages it before it
	// joins: from a peer of its zone when the job keeps other nodes
	// there, else from the source; StagePeer says which.
	StageSeconds float64 `json:"stage_seconds,omitempty"`
	StagePeer    bool    `json:"stage_peer,omitempty"`
	// PerGPUHour is what it adds to the offering's cost per useful
	// GPU-hour.
	PerGPUHour float64 `json:"per_gpu_hour"`
}

// Estimate prices each dataset from offering o.
func (d *DataCost) Estimate(o providers.Offering) []DataEstimate {
	if d == nil {
		return nil
	}
	cloud := o.Provider
	if c, ok := d.CloudOf[cloud]; ok {
		cloud = c
	}
	dst := Location{Cloud: cloud, Region: o.Region}
	gpus := float64(max(o.GPUs, 1))
	out := make([]DataEstimate, 0, len(d.Sets))
	for _, s := range d.Sets {
		e := DataEstimate{Source: s.Source, Mode: s.Mode, From: s.Location().String(), To: Location{Cloud: cloud, Region: firstOf(o.Zone, o.Region)}.String()}
		switch {
		case s.Src.FileSystem():
			// Other regions are excluded (dataExclusion): only the zone
			// can differ.
			if s.Zone != "" && o.Zone != "" && o.Zone != s.Zone {
				e.PerGB, e.Rate = CrossZonePerGB[cloud], "cross-zone"
			}
			e.From = Location{Cloud: s.Src.Cloud(), Region: firstOf(s.Zone, s.Region)}.String()
		case s.Src.Bucket():
			e.PerGB, e.Rate = d.Egress.Rate(s.Location(), dst)
		}
		switch s.Mode {
		case spec.DataStage:
			e.StageUSD = s.SizeGB * e.PerGB
			e.PerGPUHour = e.StageUSD / (d.Horizon.Hours() * gpus)
			// With survivors in the zone a replacement copies from one
			// of them, at no transfer charge (agent/peerstage.go).
			e.StagePeer = d.Nodes > 1
			rate := BucketStageGBps
			if e.StagePeer {
				rate = PeerStageGBps
			}
			e.StageSeconds = s.SizeGB / rate
		default:
			e.EpochUSD = s.ReadPerEpoch() * e.PerGB
			e.HourUSD = e.EpochUSD / s.EpochTime().Hours()
			e.PerGPUHour = e.HourUSD / (float64(d.Nodes) * gpus)
		}
		out = append(out, e)
	}
	return out
}

// PerGPUHour is what reading the data from o adds to its cost per useful
// GPU-hour.
func (d *DataCost) PerGPUHour(o providers.Offering) float64 {
	sum := 0.0
	for _, e := range d.Estimate(o) {
		sum += e.PerGPUHour
	}
	return sum
}

// ChangeoverUSD is what staging adds to each interruption of a node on
// o, per GPU: the replacement's paid time while it stages (it joins only
// with the data on disk), plus the source's transfer price when no peer
// of the zone can serve the copy.
func (d *DataCost) ChangeoverUSD(o providers.Offering) float64 {
	gpus := float64(max(o.GPUs, 1))
	sum := 0.0
	for _, e := range d.Estimate(o) {
		if e.StageSeconds <= 0 {
			continue
		}
		sum += o.PricePerHour * e.StageSeconds / 3600 / gpus
		if !e.StagePeer {
			sum += e.StageUSD / gpus
		}
	}
	return sum
}

// apply adds the data cost to a candidate's score. It is added, not
// weighted by availability: it is a price, the same for any capacity.
// Staging enters each expected interruption's changeover.
func (d *DataCost) apply(c Candidate) Candidate {
	if d == nil {
		return c
	}
	dc := d.PerGPUHour(c.Offering) + c.Rate*d.ChangeoverUSD(c.Offering)
	c.DataCost = dc
	c.Score += dc
	c.Weighted += dc
	return c
}

// dataExclusion says why o's nodes cannot reach one of f's file systems,
// or "".
func dataExclusion(f *spec.Fleet, o providers.Offering) string {
	for _, ds := range f.Training.Data {
		src, err := spec.ParseDataSource(ds.Source)
		if err != nil || !src.FileSystem() {
			continue
		}
		if c := src.Cloud(); c != "" && o.Provider != c {
			return fmt.Sprintf("data %s is a file system in %s %s; %s nodes cannot mount it", ds.Source, c, ds.Region, o.Provider)
		}
		if ds.Region != "" && o.Region != ds.Region {
			return fmt.Sprintf("data %s is a file system in region %s; nodes in %s cannot mount it", ds.Source, ds.Region, o.Region)
		}
		if ds.ZonePolicy == spec.ZoneRequired && ds.Zone != "" && o.Zone != ds.Zone {
			return fmt.Sprintf(`data %s is in zone %s, zone_policy = "required"`, ds.Source, ds.Zone)
		}
		// A file system answers only inside its VPC. An offering whose
		// network the provider does not report is kept: DataNotes says
		// the network is unconfirmed.
		if ds.Network != "" && o.VPC != "" && o.VPC != ds.Network {
			return fmt.Sprintf("data %s is in network %s; nodes in %s land in %s", ds.Source, ds.Network, firstOf(o.Zone, o.Region), o.VPC)
		}
	}
	return ""
}

// networkNotes say, for a plan, which file systems pinned to a network
// the offering o cannot be confirmed to reach: its provider reports no
// VPC for it.
func networkNotes(fl *spec.Fleet, o providers.Offering) []string {
	if o.VPC != "" {
		return nil
	}
	var out []string
	for _, ds := range fl.Training.Data {
		if ds.Network == "" {
			continue
		}
		if src, err := spec.ParseDataSource(ds.Source); err != nil || !src.FileSystem() {
			continue
		}
		out = append(out, fmt.Sprintf("data %s is in network %s; %s does not say which network its nodes in %s land in: unchecked, the mount fails if it is another",
			ds.Source, ds.Network, o.Provider, firstOf(o.Zone, o.Region)))
	}
	return out
}

// DataNotes say, for a plan, where each dataset is and what reading it
// costs from the first offering launched, for the job's len(launch) nodes.
func DataNotes(fl *spec.Fleet, launch []providers.Offering) []string {
	d := DataCostFor(fl)
	if d == nil || len(launch) == 0 {
		return nil
	}
	d.Nodes = len(launch)
	o := launch[0]
	var out []string
	for i, e := range d.Estimate(o) {
		s := d.Sets[i]
		where := fmt.Sprintf("data %s (%s, %.0f GB) is in %s", e.Source, e.Mode, s.SizeGB, e.From)
		if e.From == "" {
			where = fmt.Sprintf("data %s (%s, %.0f GB)", e.Source, e.Mode, s.SizeGB)
		}
		var cost string
		switch {
		case e.PerGB == 0:
			cost = fmt.Sprintf("reading it from %s is free", e.To)
		case e.Mode == spec.DataStage:
			cost = fmt.Sprintf("staging it from %s costs $%.2f per node ($%.3f/GB, %s), $%.3f per GPU-hour over %s",
				e.To, e.StageUSD, e.PerGB, e.Rate, e.PerGPUHour, d.Horizon)
		default:
			assumed := ""
			if s.Data.EpochTime <= 0 {
				assumed = ", assumed: set epoch_time"
			}
			cost = fmt.Sprintf("reading %.0f GB per epoch from %s costs $%.2f per epoch ($%.3f/GB, %s), $%.2f per hour at one epoch per %s%s, $%.3f per GPU-hour",
				s.ReadPerEpoch(), e.To, e.EpochUSD, e.PerGB, e.Rate, e.HourUSD, s.EpochTime(), assumed, e.PerGPUHour)
		}
		out = append(out, where+"; "+cost)
	}
	return append(out, networkNotes(fl, o)...)
}

func firstOf(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// DataTradeoff says, for a plan, when an offering of the market offs
// (same capacity type as the first launched) is cheaper by price than the
// one launched but loses once reading the data from it is priced; "" when
// none is.
func DataTradeoff(fl *spec.Fleet, offs, launch []providers.Offering) string {
	d := DataCostFor(fl)
	if d == nil || len(launch) == 0 {
		return ""
	}
	d.Nodes = len(launch)
	chosen := launch[0]
	var best *providers.Offering
	for _, o := range Filter(fl, offs) {
		if o.CapacityType == chosen.CapacityType && o.PricePerGPUHour() < chosen.PricePerGPUHour() &&
			(best == nil || o.PricePerGPUHour() < best.PricePerGPUHour()) {
			best = &o
		}
	}
	if best == nil {
		return ""
	}
	extra := d.PerGPUHour(*best) - d.PerGPUHour(chosen)
	if extra <= 0 {
		return ""
	}
	return fmt.Sprintf("data: %s is $%.3f/GPU-h cheaper than %s, but reading the data from there adds $%.3f per GPU-hour",
		best.Key(), chosen.PricePerGPUHour()-best.PricePerGPUHour(), chosen.Key(), extra)
}
