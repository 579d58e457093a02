package fleet

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetd/fleetd/fleet/spend"
	"github.com/fleetd/fleetd/fleet/state"
)

// Operations metrics: what alert rules need and the other gauges do not
// give — a spend counter that never goes down, the age of the stalest
// heartbeat and whether a fleet is below min_nodes.

// spendHighWater keeps the counter from dipping within one process: a node
// that ends mid-scrape has its end stamped a little before the previous
// scrape's "now". After a restart the persisted figures are at least as
// large as anything shown before, since time has moved on.
type spendHighWater struct {
	mu  sync.Mutex
	max map[string]float64
}

// keep forgets the fleets not in live (destroyed ones), so the map stays
// as small as the fleet list; a re-created fleet starts again from 0,
// which Prometheus reads as a counter reset.
func (h *spendHighWater) keep(live map[string]bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for f := range h.max {
		if !live[f] {
			delete(h.max, f)
		}
	}
}

func (h *spendHighWater) at(fleet string, v float64) float64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.max == nil {
		h.max = map[string]float64{}
	}
	if v < h.max[fleet] {
		return h.max[fleet]
	}
	h.max[fleet] = v
	return v
}

// opsCollector computes the operations gauges from the state store (and
// the rendezvous' heartbeats) at scrape time.
type opsCollector struct {
	d  *Daemon
	hw spendHighWater

	spendTotal, hbAge, minNodes, belowMin, completed *prometheus.Desc
}

func newOpsCollector(d *Daemon) *opsCollector {
	return &opsCollector{d: d,
		spendTotal: prometheus.NewDesc("fleetd_spend_usd_total", "What the fleet name's instances have cost, in USD (price × instance time), counting its destroyed incarnations too. Unlike fleetd_spend_usd it never goes down: forgotten node records are kept in the persisted total, so rate() over it is the spend rate across restarts.", []string{"fleet"}, nil),
		hbAge:      prometheus.NewDesc("fleetd_heartbeat_age_max_seconds", "Age of the stalest agent heartbeat among the fleet's joined and running nodes (one series per fleet, not per node, so node churn does not add series); absent while no such node has sent one, and on an HA follower.", []string{"fleet"}, nil),
		minNodes:   prometheus.NewDesc("fleetd_min_nodes", "The fleet's min_nodes (0 while destroying or completed).", []string{"fleet"}, nil),
		belowMin:   prometheus.NewDesc("fleetd_below_min_nodes", "1 when fewer of the fleet's nodes are joined or running than its min_nodes, so training cannot form a round; else 0.", []string{"fleet"}, nil),
		completed:  prometheus.NewDesc("fleetd_job_completed", "1 once the fleet's training job has ended, with outcome succeeded or failed (as its workers exited); absent while it runs.", []string{"fleet", "outcome"}, nil),
	}
}

func (c *opsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.spendTotal, c.hbAge, c.minNodes, c.belowMin, c.completed} {
		ch <- d
	}
}

// liveHeartbeat reports whether a node in this state must be sending
// heartbeats. Draining nodes are left out: an interrupted VM stops at its
// deadline, before the daemon marks it gone, and is no cause for alarm.
func liveHeartbeat(s state.NodeState) bool {
	return s == state.NodeJoined || s == state.NodeRunning
}

func (c *opsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d := c.d
	now := d.now()
	type figures struct {
		name     string
		spend    float64
		min, up  int
		outcome  string               // "" while the job runs
		lastSeen map[string]time.Time // live nodes → their last registration/heartbeat
	}
	var all []figures
	err := d.store.View(ctx, func(tx state.Tx) error {
		fleets, err := tx.Fleets()
		if err != nil {
			return err
		}
		for _, f := range fleets {
			ff := figures{name: f.Name, lastSeen: map[string]time.Time{}}
			if f.Completed {
				ff.outcome = "failed"
				if f.Succeeded {
					ff.outcome = "succeeded"
				}
			}
			if ff.spend, err = spend.ReadForgotten(tx, f.Name); err != nil {
				return err
			}
			// The counter is per fleet name: earlier incarnations count.
			h, err := spend.ReadHistory(tx, f.Name)
			if err != nil {
				return err
			}
			ff.spend += h.TotalUSD
			if fl, err := d.fleetSpec(f); err == nil && fl != nil && !f.Destroying && !f.Completed {
				ff.min = fl.MinNodes
			}
			nodes, err := tx.Nodes(f.Name)
			if err != nil {
				return err
			}
			for _, n := range nodes {
				ff.spend += spend.NodeUSD(n, now)
				if n.State == state.NodeJoined || n.State == state.NodeRunning {
					ff.up++
				}
				if liveHeartbeat(n.State) {
					ff.lastSeen[n.ID] = n.LastHeartbeat
				}
			}
			all = append(all, ff)
		}
		return nil
	})
	if err != nil {
		return // a failed read shows nothing rather than partial figures
	}
	live := map[string]bool{}
	for _, ff := range all {
		live[ff.name] = true
	}
	c.hw.keep(live)
	// The rendezvous holds the heartbeats after registration; read it after
	// the transaction (see withLive). Only the leader has it: a follower
	// would see registrations age and report stale heartbeats that are not.
	leader := d.cl == nil || d.cl.isLeader()
	for _, ff := range all {
		if rz := d.rdzv.rz(); rz != nil && leader {
			if st, err := rz.Status(ff.name); err == nil {
				for _, m := range st.Members {
					if last, ok := ff.lastSeen[m.NodeID]; ok && m.LastHeartbeat.After(last) {
						ff.lastSeen[m.NodeID] = m.LastHeartbeat
					}
				}
			}
		}
		ch <- prometheus.MustNewConstMetric(c.spendTotal, prometheus.CounterValue, c.hw.at(ff.name, ff.spend), ff.name)
		var oldest time.Time
		for _, t := range ff.lastSeen {
			if !t.IsZero() && (oldest.IsZero() || t.Before(oldest)) {
				oldest = t
			}
		}
		if !oldest.IsZero() && leader {
			ch <- prometheus.MustNewConstMetric(c.hbAge, prometheus.GaugeValue, max(0, now.Sub(oldest).Seconds()), ff.name)
		}
		below := 0.0
		if ff.up < ff.min {
			below = 1
		}
		ch <- prometheus.MustNewConstMetric(c.minNodes, prometheus.GaugeValue, float64(ff.min), ff.name)
		ch <- prometheus.MustNewConstMetric(c.belowMin, prometheus.GaugeValue, below, ff.name)
		if ff.outcome != "" {
			ch <- prometheus.MustNewConstMetric(c.completed, prometheus.GaugeValue, 1, ff.name, ff.outcome)
		}
	}
}
