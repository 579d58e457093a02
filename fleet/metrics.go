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

// Metrics is the daemon's Prometheus instrumentation. It owns its registry
// (never the global one) so several daemons in one test process do not
// collide. Counters and histograms are updated by the hooks in stats.go;
// fleet and node gauges are computed from the state store at scrape time,
// so they can never drift from what /v1/status says.
type Metrics struct {
	reg *prometheus.Registry

	interruptions  *prometheus.CounterVec
	nodeFailures   *prometheus.CounterVec
	recovery       *prometheus.HistogramVec
	reconcile      *prometheus.HistogramVec
	providerCalls  *prometheus.CounterVec
	providerErrors *prometheus.CounterVec
	roundLatency   *prometheus.HistogramVec
}

// Recovery durations span seconds (survivors re-forming a round) to many
// minutes (a cloud replacement booting), hence the wide buckets.
var recoveryBuckets = []float64{0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800}

// newMetrics builds the registry. fleets reads the gauges at scrape time;
// nil leaves them out (unit tests of the hooks).
func newMetrics(fleets prometheus.Collector, version string) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		interruptions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetd_interruptions_total",
			Help: "Interruption notices taken, by fleet, kind (spot-interruption, rebalance, preempted, ...) and source (agent/imds, provider/aws, ...). Counted from the event log, so totals survive daemon restarts.",
		}, []string{"fleet", "kind", "source"}),
		nodeFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetd_node_failures_total",
			Help: "Nodes that ended in state failed, by fleet and the state they failed from (provisioning: launch error; booting: boot timeout or lost before boot).",
		}, []string{"fleet", "from"}),
		recovery: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fleetd_recovery_duration_seconds",
			Help:    "Measured recoveries: kind=round-reformed is notice → the survivors' next rendezvous round closed; kind=training-resumed is notice → the survivors' workers report progress again (FLEETD_PROGRESS); kind=replacement-joined is launch requested → the node's agent registered.",
			Buckets: recoveryBuckets,
		}, []string{"fleet", "kind"}),
		reconcile: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fleetd_reconcile_duration_seconds",
			Help:    "Duration of one reconcile pass of a fleet (observe providers, plan, execute).",
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"fleet"}),
		providerCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetd_provider_calls_total",
			Help: "Provider API calls by provider and operation (list, offerings, create, delete).",
		}, []string{"provider", "op"}),
		providerErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetd_provider_errors_total",
			Help: "Provider API calls that returned an error, by provider, operation, region (empty for a call spanning several regions that named none) and kind (insufficient-capacity, quota, not-found, invalid-config, transient, unclassified, ...).",
		}, []string{"provider", "op", "region", "kind"}),
		roundLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fleetd_rendezvous_round_latency_seconds",
			Help:    "Rendezvous round latency: round opened → closed.",
			Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300},
		}, []string{"fleet"}),
	}
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "fleetd_build_info",
		Help:        "Always 1; the version label is the daemon's version.",
		ConstLabels: prometheus.Labels{"version": version},
	})
	buildInfo.Set(1)
	m.reg.MustRegister(m.interruptions, m.nodeFailures, m.recovery, m.reconcile, m.providerCalls, m.providerErrors, m.roundLatency, buildInfo,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if fleets != nil {
		m.reg.MustRegister(fleets)
		if fc, ok := fleets.(*fleetCollector); ok {
			m.reg.MustRegister(newOpsCollector(fc.d))
		}
	}
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
