// Package stats owns what the daemon measures about its fleets in memory:
// recovery durations (notice → round re-formed, notice → training
// resumed, replacement requested → joined), provider call counts, the last
// pass's duration, on-demand prices learnt from offerings (for savings),
// the sources and age of the prices placement uses, and the tally of the
// event log (tally.go: interruptions, boot failures). Each part has its
// own lock; the Prometheus counters and histograms it feeds are registered
// by New.
package stats

import (
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/autoscale"
	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/providers"
)

// Recovery is one measured recovery.
type Recovery struct {
	Fleet    string        `json:"fleet"`
	Node     string        `json:"node,omitempty"`
	Kind     string        `json:"kind"` // round-reformed | training-resumed | replacement-joined
	Duration time.Duration `json:"duration"`
	At       time.Time     `json:"at"`
	// LostSteps (training-resumed) is how many steps the workers resumed
	// behind the last one reported before.
	LostSteps *int64 `json:"lost_steps,omitempty"`
}

// Recovery kinds.
const (
	// RecoveryRoundReformed: notice → the survivors' next rendezvous round
	// closed (the daemon decided the new membership; the workers still
	// restart after it).
	RecoveryRoundReformed = "round-reformed"
	// RecoveryTrainingResumed: notice → the survivors' workers report
	// progress again in a later round (they loaded their checkpoint).
	RecoveryTrainingResumed = "training-resumed"
	// RecoveryReplacementJoined: launch requested → the node's agent
	// registered.
	RecoveryReplacementJoined = "replacement-joined"
)

const maxRecoveries = 200

// Stats is the daemon's in-memory measurements. Make it with New.
type Stats struct {
	m *metrics

	mu sync.Mutex
	// pendingNotice: fleet → time of the oldest notice not yet followed by
	// a closed round; pendingResume: by the workers' next progress report.
	pendingNotice map[string]time.Time
	pendingResume map[string]time.Time
	// launchAt: fleet/node → when its launch was requested.
	launchAt   map[string]time.Time
	recoveries []Recovery // newest last
	// onDemand is the on-demand $/h by offering location (see odKey),
	// learnt from the providers' offerings, for savings against on-demand.
	onDemand map[string]float64
	// prices: fleet → provider → the sources and age of the prices
	// placement uses (see Prices).
	prices map[string]map[string]priceInfo

	// Tally is what the event log says (interruptions, boot failures).
	Tally Tally
}

// metrics are the counters and histograms the hooks update.
type metrics struct {
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

// New returns empty stats whose counters and histograms are registered
// with reg (none when reg is nil: unit tests of the hooks).
func New(reg prometheus.Registerer) *Stats {
	s := &Stats{pendingNotice: map[string]time.Time{}, pendingResume: map[string]time.Time{}, launchAt: map[string]time.Time{},
		onDemand: map[string]float64{}}
	s.m = &metrics{
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
	s.Tally.m = s.m
	if reg != nil {
		reg.MustRegister(s.Collectors()...)
	}
	return s
}

// Collectors are the counters and histograms the hooks update.
func (s *Stats) Collectors() []prometheus.Collector {
	m := s.m
	return []prometheus.Collector{m.interruptions, m.nodeFailures, m.recovery, m.reconcile, m.providerCalls, m.providerErrors, m.roundLatency}
}

// add keeps a recovery (under s.mu) and observes it.
func (s *Stats) add(r Recovery) {
	s.recoveries = append(s.recoveries, r)
	if len(s.recoveries) > maxRecoveries {
		s.recoveries = s.recoveries[len(s.recoveries)-maxRecoveries:]
	}
	s.m.recovery.WithLabelValues(r.Fleet, r.Kind).Observe(r.Duration.Seconds())
}

// PassDone records the duration of a fleet's reconcile pass.
func (s *Stats) PassDone(fleet string, dur time.Duration) {
	s.m.reconcile.WithLabelValues(fleet).Observe(dur.Seconds())
}

// ProviderCall counts a provider call; its region label is CallRegion's
// (known: the region the caller knows, "" if none; cfg: the call's
// config). Errors are labelled with their kind.
func (s *Stats) ProviderCall(provider, op, known string, cfg providers.Config, err error) {
	region := CallRegion(err, known, cfg)
	s.m.providerCalls.WithLabelValues(provider, op).Inc()
	// The error series of every kind exist from the first call in a
	// region, at 0, so increase() and error ratios see the first error.
	for _, k := range errorKinds {
		s.m.providerErrors.WithLabelValues(provider, op, region, k)
	}
	if err != nil {
		s.m.providerErrors.WithLabelValues(provider, op, region, ErrorKindLabel(err)).Inc()
	}
}

// ErrorKindLabel is the kind label of a failed provider call: the
// provider's typed error kind, or "unclassified".
func ErrorKindLabel(err error) string {
	if k := providers.KindOf(err); k != "" {
		return string(k)
	}
	return "unclassified"
}

// errorKinds are the kinds whose error series start at 0 with a
// (provider, op, region)'s first call, so increase() sees the first error.
var errorKinds = []string{string(providers.KindCapacity), string(providers.KindQuota), string(providers.KindNotFound),
	string(providers.KindInvalidConfig), string(providers.KindAuth), string(providers.KindTransient), "unclassified"}

// odKey locates an offering's on-demand price: per zone when the provider
// prices zones differently, else per region.
func odKey(o providers.Offering, zone bool) string {
	k := o.Provider + "/" + o.Region + "/" + o.InstanceType
	if zone {
		k += "/" + o.Zone
	}
	return k
}

// OfferingsListed learns on-demand prices from a provider's offerings,
// for the savings in status. Call it after every successful Offerings call.
func (s *Stats) OfferingsListed(offs []providers.Offering) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range offs {
		if o.CapacityType != providers.OnDemand || o.PricePerHour <= 0 {
			continue
		}
		s.onDemand[odKey(o, true)] = o.PricePerHour
		s.onDemand[odKey(o, false)] = o.PricePerHour
	}
}

// OnDemandPrice is the on-demand $/h of an offering's instance type where
// it runs; false when no provider has told us yet.
func (s *Stats) OnDemandPrice(o providers.Offering) (float64, bool) {
	if o.CapacityType == providers.OnDemand {
		return o.PricePerHour, true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, ok := s.onDemand[odKey(o, true)]; ok {
		return p, true
	}
	p, ok := s.onDemand[odKey(o, false)]
	return p, ok
}

// LaunchRequested starts a replacement-requested → joined measurement.
func (s *Stats) LaunchRequested(fleet, node string, at time.Time) {
	s.mu.Lock()
	s.launchAt[fleet+"/"+node] = at
	s.mu.Unlock()
}

// Joined closes a replacement-requested → joined measurement.
func (s *Stats) Joined(fleet, node string, at time.Time) (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.launchAt[fleet+"/"+node]
	if !ok {
		return 0, false
	}
	delete(s.launchAt, fleet+"/"+node)
	dur := at.Sub(t)
	s.add(Recovery{Fleet: fleet, Node: node, Kind: RecoveryReplacementJoined, Duration: dur, At: at})
	return dur, true
}

// Notice starts the notice → round-reformed and notice →
// training-resumed measurements of a terminal notice.
func (s *Stats) Notice(fleet string, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.pendingNotice[fleet]; !ok {
		s.pendingNotice[fleet] = at
	}
	if _, ok := s.pendingResume[fleet]; !ok {
		s.pendingResume[fleet] = at
	}
}

// TrainingResumed ends a pending notice → training-resumed measurement
// when a round's first progress report comes after the notice.
func (s *Stats) TrainingResumed(fleet string, start autoscale.RoundStart) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.pendingResume[fleet]
	if !ok || start.At.Before(t) {
		return
	}
	delete(s.pendingResume, fleet)
	r := Recovery{Fleet: fleet, Kind: RecoveryTrainingResumed, Duration: start.At.Sub(t), At: start.At}
	if start.HadPrev {
		lost := start.LostSteps
		r.LostSteps = &lost
	}
	s.add(r)
}

// RoundClosed observes a closed rendezvous round's latency and ends a
// pending notice measurement of the fleet, returning its duration.
func (s *Stats) RoundClosed(fleet string, latency time.Duration, at time.Time) (time.Duration, bool) {
	s.m.roundLatency.WithLabelValues(fleet).Observe(latency.Seconds())
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.pendingNotice[fleet]
	if !ok {
		return 0, false
	}
	delete(s.pendingNotice, fleet)
	dur := at.Sub(t)
	s.add(Recovery{Fleet: fleet, Kind: RecoveryRoundReformed, Duration: dur, At: at})
	return dur, true
}

// Recoveries returns a fleet's measured recoveries, oldest first.
func (s *Stats) Recoveries(fleet string) []api.RecoveryInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []api.RecoveryInfo{}
	for _, r := range s.recoveries {
		if r.Fleet == fleet {
			out = append(out, api.RecoveryInfo{Kind: r.Kind, Node: r.Node, DurationSeconds: r.Duration.Seconds(), At: r.At, LostSteps: r.LostSteps})
		}
	}
	return out
}

// priceInfo is where the prices of one provider's offerings for a fleet
// come from and the date of the oldest.
type priceInfo struct {
	sources []string
	oldest  time.Time
}

// Prices remembers, after a provider's offerings were listed for a
// fleet's pass, the price sources and the oldest price date of those that
// fit the fleet's node: the prices placement decides with now. Status
// shows them rather than the prices each live node was launched at, which
// only age.
func (s *Stats) Prices(fleet, provider string, fl *spec.Fleet, offs []providers.Offering) {
	var pi priceInfo
	fits := false
	for _, o := range offs {
		if fl != nil && placement.Exclusion(fl, o) != "" {
			continue
		}
		fits = true
		if o.PriceSource != "" && !slices.Contains(pi.sources, o.PriceSource) {
			pi.sources = append(pi.sources, o.PriceSource)
		}
		if !o.PriceAsOf.IsZero() && (pi.oldest.IsZero() || o.PriceAsOf.Before(pi.oldest)) {
			pi.oldest = o.PriceAsOf
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.prices == nil {
		s.prices = map[string]map[string]priceInfo{}
	}
	if !fits {
		delete(s.prices[fleet], provider)
		return
	}
	if s.prices[fleet] == nil {
		s.prices[fleet] = map[string]priceInfo{}
	}
	s.prices[fleet][provider] = pi
}

// CurrentPrices puts into a summary the sources and oldest date of the
// prices placement uses for the fleet, when the daemon has listed
// offerings for it; before that the summary keeps those of its live
// nodes' launches.
func (s *Stats) CurrentPrices(sum *api.FleetSummary) {
	s.mu.Lock()
	defer s.mu.Unlock()
	byProvider := s.prices[sum.Name]
	if len(byProvider) == 0 {
		return
	}
	provs := make([]string, 0, len(byProvider))
	for p := range byProvider {
		provs = append(provs, p)
	}
	slices.Sort(provs)
	sum.PriceSources, sum.PricesAsOf = nil, time.Time{}
	for _, p := range provs {
		pi := byProvider[p]
		for _, src := range pi.sources {
			if !slices.Contains(sum.PriceSources, src) {
				sum.PriceSources = append(sum.PriceSources, src)
			}
		}
		if !pi.oldest.IsZero() && (sum.PricesAsOf.IsZero() || pi.oldest.Before(sum.PricesAsOf)) {
			sum.PricesAsOf = pi.oldest
		}
	}
}
