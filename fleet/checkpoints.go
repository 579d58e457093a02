package fleet

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
)

// Checkpoint stores, the daemon's side: the node API (signed URLs,
// listings, deletes, reports) and the reports it keeps are in
// fleet/agentapi; what status, metrics and placement read of them is here.

// checkpointCollector exports the checkpoint gauges at scrape time.
type checkpointCollector struct{ d *Daemon }

var (
	ckptLastStepDesc = prometheus.NewDesc("fleetd_checkpoint_last_step", "Step of the fleet's newest checkpoint complete in its store (-1: none yet).", []string{"fleet"}, nil)
	ckptAgeDesc      = prometheus.NewDesc("fleetd_checkpoint_age_seconds", "Age of the fleet's newest checkpoint in its store.", []string{"fleet"}, nil)
	ckptBytesDesc    = prometheus.NewDesc("fleetd_checkpoint_bytes", "Size of the fleet's newest checkpoint in its store.", []string{"fleet"}, nil)
	ckptUploadDesc   = prometheus.NewDesc("fleetd_checkpoint_upload_mib_per_second", "Throughput of the fleet's last checkpoint upload.", []string{"fleet"}, nil)
	ckptRestoreDesc  = prometheus.NewDesc("fleetd_checkpoint_restore_mib_per_second", "Throughput of the fleet's last checkpoint restore.", []string{"fleet"}, nil)
	ckptFailingDesc  = prometheus.NewDesc("fleetd_checkpoint_store_failing", "1 while the fleet's checkpoint store fails (upload, restore or a corrupt checkpoint), until the next success.", []string{"fleet"}, nil)
)

func (c checkpointCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{ckptLastStepDesc, ckptAgeDesc, ckptBytesDesc, ckptUploadDesc, ckptRestoreDesc, ckptFailingDesc} {
		ch <- d
	}
}

func (c checkpointCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	type fc struct {
		name string
		c    *spec.Checkpoint
	}
	var fleets []fc
	_ = c.d.store.View(ctx, func(tx state.Tx) error {
		all, err := tx.Fleets()
		if err != nil {
			return err
		}
		for _, f := range all {
			if fl, err := c.d.fleetSpec(f); err == nil && fl.Training.Checkpoint != nil {
				fleets = append(fleets, fc{f.Name, fl.Training.Checkpoint})
			}
		}
		return nil
	})
	now := c.d.now()
	for _, f := range fleets {
		s := c.d.agentAPI.CheckpointStatus(f.name, f.c, now)
		g := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, f.name)
		}
		g(ckptLastStepDesc, float64(s.LastStep))
		if s.LastStep >= 0 {
			g(ckptAgeDesc, s.AgeSeconds)
			g(ckptBytesDesc, float64(s.Bytes))
		}
		if s.UploadMiBps > 0 {
			g(ckptUploadDesc, s.UploadMiBps)
		}
		if s.RestoreMiBps > 0 {
			g(ckptRestoreDesc, s.RestoreMiBps)
		}
		failing := 0.0
		if s.Error != "" {
			failing = 1
		}
		g(ckptFailingDesc, failing)
	}
}

// moveCost prices moving a fleet's checkpoint to another group: measured
// size and restore throughput when its agents reported them.
func (d *Daemon) moveCost(fl *spec.Fleet) *placement.MoveCost {
	if fl == nil || fl.Training.Checkpoint == nil {
		return nil
	}
	return placement.MoveCostFor(fl, d.agentAPI.CheckpointBytes(fl.Name), d.agentAPI.RestoreMiBps(fl.Name))
}

// checkpointMoves prices moving the job away from its checkpoint store's
// location, for the status view and the dashboard: to another region of
// the same cloud and to each other cloud fleetd knows, for nodes nodes.
func checkpointMoves(m *placement.MoveCost, nodes int) []api.CheckpointMove {
	if m == nil || m.Bytes <= 0 || m.Source.Cloud == "" || nodes <= 0 {
		return nil
	}
	mibps := m.RestoreMiBps
	if mibps <= 0 {
		mibps = placement.DefaultRestoreMiBps
	}
	restore := float64(m.Bytes) / (1 << 20) / mibps
	dests := []placement.Location{{Cloud: m.Source.Cloud, Region: "*"}}
	for _, c := range []string{"aws", "gcp"} {
		if c != m.Source.Cloud {
			dests = append(dests, placement.Location{Cloud: c})
		}
	}
	out := make([]api.CheckpointMove, 0, len(dests))
	for _, dst := range dests {
		rate, _ := m.Egress.Rate(m.Source, dst)
		out = append(out, api.CheckpointMove{To: dst.String(), PerGB: rate, EgressUSD: float64(m.Bytes) / 1e9 * rate * float64(nodes),
			RestoreSeconds: restore, Source: m.Egress.Source, AsOf: m.Egress.AsOf})
	}
	return out
}

// CheckpointRestored (agentapi.Deps) charges a checkpoint restore's egress to the fleet's
// and its project's budget: the bytes read × the egress price from the
// store's location to the node's cloud and region (placement's table with
// the spec's egress_per_gb). A store whose location is unknown (file://,
// no region) or a free transfer charges nothing.
func (x agentDeps) CheckpointRestored(ctx context.Context, fleetName, nodeID string, bytes int64) {
	d := x.d
	if bytes <= 0 {
		return
	}
	var f state.Fleet
	var n state.Node
	if err := d.store.View(ctx, func(tx state.Tx) error {
		var err error
		if f, err = tx.Fleet(fleetName); err != nil {
			return err
		}
		n, err = tx.Node(fleetName, nodeID)
		return err
	}); err != nil {
		d.log.Warn("checkpoint egress: read fleet and node", "fleet", fleetName, "node", nodeID, "err", err)
		return
	}
	fl, err := d.fleetSpec(f)
	if err != nil {
		return
	}
	m := placement.MoveCostFor(fl, bytes, 0)
	if m == nil || m.Source.Cloud == "" {
		return
	}
	dst := m.LocationOf(n.Offering)
	rate, _ := m.Egress.Rate(m.Source, dst)
	usd := float64(bytes) / 1e9 * rate
	if usd <= 0 {
		return
	}
	d.ctrl.ChargeEgress(ctx, fleetName, fl.ProjectName(), usd)
	d.appendEvent(ctx, state.Event{Fleet: fleetName, Node: nodeID, Type: "checkpoint.egress",
		Message: fmt.Sprintf("%s restored %.2f GB from %s to %s: $%.4f egress ($%.3f/GB) charged to fleet %s and project %s",
			nodeID, float64(bytes)/1e9, m.Source, dst, usd, rate, fleetName, fl.ProjectName()),
		Data: map[string]string{"usd": strconv.FormatFloat(usd, 'f', 6, 64), "bytes": strconv.FormatInt(bytes, 10), "from": m.Source.String(), "to": dst.String()}})
}
