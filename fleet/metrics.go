package fleet

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/state"
)

// Metrics is the daemon's Prometheus registry. It is its own (never the
// global one) so several daemons in one test process do not collide. The
// counters and histograms are fleet/stats' (registered by stats.New);
// fleet and node gauges are computed from the state store at scrape time,
// so they can never drift from what /v1/status says.
type Metrics struct {
	reg *prometheus.Registry
}

// newMetrics builds the registry with the build info and the Go and
// process collectors.
func newMetrics(version string) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "fleetd_build_info",
		Help:        "Always 1; the version label is the daemon's version.",
		ConstLabels: prometheus.Labels{"version": version},
	})
	buildInfo.Set(1)
	m.reg.MustRegister(buildInfo, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry is the daemon's metrics registry (for tests and embedding).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus text or protobuf format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg, Timeout: 10 * time.Second})
}

// fleetCollector computes the per-fleet gauges from the state store at
// scrape time.
type fleetCollector struct {
	d *Daemon

	nodes, spendRate, spend, onDemandEq, worldSize, round, alerts, target *prometheus.Desc
	// Training progress (FLEETD_PROGRESS reports) and the autoscaler.
	samplesRate, stepsRate, step, samples, totalSteps, eta, loss, reportAge, sizeRate *prometheus.Desc
}

func newFleetCollector(d *Daemon) *fleetCollector {
	return &fleetCollector{d: d,
		nodes:      prometheus.NewDesc("fleetd_nodes", "Nodes by fleet, lifecycle state and capacity type (spot, on-demand).", []string{"fleet", "state", "capacity_type"}, nil),
		target:     prometheus.NewDesc("fleetd_target_nodes", "The number of nodes the fleet should have now.", []string{"fleet"}, nil),
		spendRate:  prometheus.NewDesc("fleetd_spend_rate_usd_per_hour", "Current cost of the fleet's live instances in USD per hour.", []string{"fleet"}, nil),
		spend:      prometheus.NewDesc("fleetd_spend_usd", "What the fleet's instances have cost so far in USD (price × instance time). A gauge: it drops when old node records are forgotten.", []string{"fleet"}, nil),
		onDemandEq: prometheus.NewDesc("fleetd_on_demand_equivalent_usd", "What the same instance hours would have cost on demand, in USD (savings = this − fleetd_spend_usd).", []string{"fleet"}, nil),
		worldSize:  prometheus.NewDesc("fleetd_rendezvous_world_size", "World size (total worker processes) of the fleet's current rendezvous round; 0 while none is closed.", []string{"fleet"}, nil),
		round:      prometheus.NewDesc("fleetd_rendezvous_round", "Number of the fleet's current rendezvous round.", []string{"fleet"}, nil),
		alerts:     prometheus.NewDesc("fleetd_alerts", "Active alerts by fleet and kind (quota, no-capacity, repeated-boot-failures, ...).", []string{"fleet", "kind"}, nil),

		samplesRate: prometheus.NewDesc("fleetd_training_samples_per_second", "Training throughput of the fleet's latest round, from its workers' progress reports (FLEETD_PROGRESS); absent without reports.", []string{"fleet"}, nil),
		stepsRate:   prometheus.NewDesc("fleetd_training_steps_per_second", "Optimizer steps per second of the fleet's latest round, from its workers' progress reports.", []string{"fleet"}, nil),
		step:        prometheus.NewDesc("fleetd_training_step", "The job's latest reported optimizer step.", []string{"fleet"}, nil),
		samples:     prometheus.NewDesc("fleetd_training_samples", "Samples (or tokens) the job reports having processed in all.", []string{"fleet"}, nil),
		totalSteps:  prometheus.NewDesc("fleetd_training_total_steps", "The step the job ends at, when its workers report it.", []string{"fleet"}, nil),
		eta:         prometheus.NewDesc("fleetd_training_eta_seconds", "Seconds until the job reaches its total steps at the current step rate; absent when unknown.", []string{"fleet"}, nil),
		loss:        prometheus.NewDesc("fleetd_training_loss", "The job's latest reported loss; absent when the workers report none.", []string{"fleet"}, nil),
		reportAge:   prometheus.NewDesc("fleetd_training_report_age_seconds", "Age of the job's latest progress report.", []string{"fleet"}, nil),
		sizeRate:    prometheus.NewDesc("fleetd_autoscale_samples_per_second", "The autoscaler's throughput per fleet size: measured (source=measured) or the scaling model's prediction (source=model).", []string{"fleet", "nodes", "source"}, nil),
	}
}

func (c *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.nodes, c.target, c.spendRate, c.spend, c.onDemandEq, c.worldSize, c.round, c.alerts,
		c.samplesRate, c.stepsRate, c.step, c.samples, c.totalSteps, c.eta, c.loss, c.reportAge, c.sizeRate} {
		ch <- d
	}
}

func (c *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d := c.d
	// Read the store first, then the live parts: see withLive.
	type fleetFigures struct {
		s      api.FleetSummary
		counts map[[2]string]int // state, capacity type
	}
	var all []fleetFigures
	_ = d.store.View(ctx, func(tx state.Tx) error {
		fleets, err := tx.Fleets()
		if err != nil {
			return err
		}
		for _, f := range fleets {
			fl, _ := d.fleetSpec(f)
			s, err := d.summary(tx, f, fl)
			if err != nil {
				return err
			}
			nodes, err := tx.Nodes(f.Name)
			if err != nil {
				return err
			}
			counts := map[[2]string]int{}
			for _, n := range nodes {
				counts[[2]string{string(n.State), string(n.Offering.CapacityType)}]++
			}
			all = append(all, fleetFigures{s, counts})
		}
		return nil
	})
	for _, ff := range all {
		s := d.withLive(ff.s)
		for k, v := range ff.counts {
			ch <- prometheus.MustNewConstMetric(c.nodes, prometheus.GaugeValue, float64(v), s.Name, k[0], k[1])
		}
		ch <- prometheus.MustNewConstMetric(c.target, prometheus.GaugeValue, float64(s.TargetNodes), s.Name)
		ch <- prometheus.MustNewConstMetric(c.spendRate, prometheus.GaugeValue, s.CostPerHour, s.Name)
		ch <- prometheus.MustNewConstMetric(c.spend, prometheus.GaugeValue, s.SpendUSD, s.Name)
		ch <- prometheus.MustNewConstMetric(c.onDemandEq, prometheus.GaugeValue, s.OnDemandEquivalentUSD, s.Name)
		ws, round := 0, 0
		if s.Rendezvous != nil {
			round = s.Rendezvous.Round
			if s.Rendezvous.State == "closed" {
				ws = s.Rendezvous.WorldSize
			}
		}
		ch <- prometheus.MustNewConstMetric(c.worldSize, prometheus.GaugeValue, float64(ws), s.Name)
		ch <- prometheus.MustNewConstMetric(c.round, prometheus.GaugeValue, float64(round), s.Name)
		c.collectTraining(ch, s.Name)
		byKind := map[string]int{}
		for _, a := range d.alerts(s.Name) {
			byKind[a.Kind]++
		}
		for k, v := range byKind {
			ch <- prometheus.MustNewConstMetric(c.alerts, prometheus.GaugeValue, float64(v), s.Name, k)
		}
	}
}

// collectTraining emits a fleet's training gauges from its latest
// progress report and the autoscaler's per-size figures.
func (c *fleetCollector) collectTraining(ch chan<- prometheus.Metric, fleet string) {
	now := c.d.now()
	t, sc := c.d.trainingInfo(fleet, now)
	if t != nil && t.Source == "reports" {
		g := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, fleet)
		}
		g(c.samplesRate, t.SamplesPerSecond)
		g(c.stepsRate, t.StepsPerSecond)
		g(c.step, float64(t.Step))
		g(c.samples, t.Samples)
		if t.TotalSteps > 0 {
			g(c.totalSteps, float64(t.TotalSteps))
		}
		if t.ETA != nil {
			g(c.eta, t.ETASeconds)
		}
		if t.Loss != nil {
			g(c.loss, *t.Loss)
		}
		if t.ReportedAt != nil {
			g(c.reportAge, max(0, now.Sub(*t.ReportedAt).Seconds()))
		}
	}
	if sc != nil {
		for _, o := range sc.Options {
			if o.SamplesPerSecond <= 0 {
				continue
			}
			src := "model"
			if o.Measured {
				src = "measured"
			}
			ch <- prometheus.MustNewConstMetric(c.sizeRate, prometheus.GaugeValue, o.SamplesPerSecond, fleet, strconv.Itoa(o.Nodes), src)
		}
	}
}
