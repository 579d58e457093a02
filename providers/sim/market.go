package sim

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/fleetd/fleetd/providers"
)

// Market is a trace seen through one provider block: the series it
// offers, with every default resolved. It is immutable and safe to share.
type Market struct {
	Trace  *Trace
	Offers []*Offer
	// LaunchLatency: launch → instance running, agent joins.
	LaunchLatency time.Duration
	// Changeover is the total cost of one (re)start, launch included.
	Changeover time.Duration
	byKey      map[string]*Offer // spot and on-demand offering keys
}

// Offer is one series as an offering pair: spot (from the trace) and
// on-demand (always available) in the same zone.
type Offer struct {
	Index      int
	Series     *Series
	Meta       Meta // resolved
	NoticeLead time.Duration
	Spot       providers.Offering // template: price and availability vary
	OnDemand   providers.Offering
	// changes are the ticks i > 0 whose capacity or price differs from
	// tick i-1, ascending.
	changes []int32
	// cum[i] is the cost in $ of running on spot through ticks 0..i-1.
	cum   []float64
	price float64 // constant spot price when the series has none
	scale int     // capacity_scale: capacity is Avail × scale
}

// NewMarket resolves cfg against tr.
func NewMarket(tr *Trace, c Config) (*Market, error) {
	m := &Market{Trace: tr, LaunchLatency: c.LaunchLatencyDuration(), Changeover: c.ChangeoverDuration(), byKey: map[string]*Offer{}}
	want := map[string]bool{}
	for _, z := range c.Zones {
		want[z] = true
	}
	found := map[string]bool{}
	for _, s := range tr.Series {
		if len(want) > 0 && !want[s.Meta.Zone] {
			continue
		}
		found[s.Meta.Zone] = true
		meta := mergeMeta(s.Meta, Meta{Cloud: c.Cloud, Instance: c.Instance})
		meta = mergeMeta(meta, Meta{Instance: Instance{InstanceType: DefaultInstanceType, GPUs: 1, GPUType: DefaultGPUType, VCPUs: DefaultVCPUs, MemoryGiB: DefaultMemoryGiB}})
		if c.OnDemandPrice > 0 {
			meta.OnDemandPrice = c.OnDemandPrice
		}
		if c.NoticeLead != "" {
			meta.NoticeLead = c.NoticeLead
		}
		lead := NoticeLeadOf(meta.Cloud)
		if meta.NoticeLead != "" {
			d, err := time.ParseDuration(meta.NoticeLead)
			if err != nil || d < 0 {
				return nil, providers.Errorf(providers.KindInvalidConfig, "series %s: notice_lead %q", s.Key, meta.NoticeLead)
			}
			lead = d
		}
		if !(meta.OnDemandPrice > 0) {
			return nil, providers.Errorf(providers.KindInvalidConfig, "series %s has no on-demand price: set on_demand_price in the provider block or the trace's trace.json", s.Key)
		}
		if s.Price == nil && !(meta.SpotPrice > 0) {
			return nil, providers.Errorf(providers.KindInvalidConfig, "series %s has no spot prices: add them to the trace or set spot_price", s.Key)
		}
		o := &Offer{Index: len(m.Offers), Series: s, Meta: meta, NoticeLead: lead, price: meta.SpotPrice, scale: max(c.CapacityScale, 1)}
		base := providers.Offering{Provider: Name, Region: meta.Region, Zone: meta.Zone, InstanceType: meta.InstanceType,
			GPUs: meta.GPUs, GPUType: meta.GPUType, VCPUs: meta.VCPUs, MemoryGiB: meta.MemoryGiB}
		o.Spot, o.OnDemand = base, base
		o.Spot.CapacityType = providers.Spot
		o.OnDemand.CapacityType, o.OnDemand.PricePerHour, o.OnDemand.Available = providers.OnDemand, meta.OnDemandPrice, -1
		for _, k := range []string{o.Spot.Key(), o.OnDemand.Key()} {
			if m.byKey[k] != nil {
				return nil, providers.Errorf(providers.KindInvalidConfig, "series %s and %s describe the same offering %s", m.byKey[k].Series.Key, s.Key, k)
			}
			m.byKey[k] = o
		}
		o.index()
		m.Offers = append(m.Offers, o)
	}
	for _, z := range c.Zones {
		if !found[z] {
			return nil, providers.Errorf(providers.KindInvalidConfig, "zone %q is not in trace %s (zones: %v)", z, tr.Name, tr.Zones())
		}
	}
	if len(m.Offers) == 0 {
		return nil, providers.Errorf(providers.KindInvalidConfig, "trace %s has no series", tr.Name)
	}
	return m, nil
}

func (o *Offer) index() {
	s := o.Series
	for i := 1; i < len(s.Avail); i++ {
		if s.Avail[i] != s.Avail[i-1] || (s.Price != nil && s.Price[i] != s.Price[i-1]) {
			o.changes = append(o.changes, int32(i))
		}
	}
	h := s.Tick.Hours()
	o.cum = make([]float64, len(s.Avail)+1)
	for i := range s.Avail {
		o.cum[i+1] = o.cum[i] + o.priceAt(i)*h
	}
}

// Offer returns the offer behind an offering key (spot or on-demand).
func (m *Market) Offer(key string) *Offer { return m.byKey[key] }

// Zones lists the market's zones in offer order.
func (m *Market) Zones() []string {
	out := make([]string, 0, len(m.Offers))
	for _, o := range m.Offers {
		out = append(out, o.Meta.Zone)
	}
	return out
}

// tickAt is the tick index at t, clamped to the series: before the start
// the first tick holds, after the end the last.
func (o *Offer) tickAt(t time.Time) int {
	s := o.Series
	d := t.Sub(s.Start)
	if d < 0 {
		return 0
	}
	i := int(d / s.Tick)
	if i >= len(s.Avail) {
		return len(s.Avail) - 1
	}
	return i
}

// TickStart is when tick i starts.
func (o *Offer) TickStart(i int) time.Time {
	return o.Series.Start.Add(time.Duration(i) * o.Series.Tick)
}

func (o *Offer) priceAt(i int) float64 {
	if o.Series.Price == nil {
		return o.price
	}
	return o.Series.Price[i]
}

// Capacity is how many spot instances can run at t.
func (o *Offer) Capacity(t time.Time) int { return int(o.Series.Avail[o.tickAt(t)]) * o.capScale() }

// CapacityAt is the capacity of tick i (clamped).
func (o *Offer) CapacityAt(i int) int {
	return int(o.Series.Avail[max(0, min(i, len(o.Series.Avail)-1))]) * o.capScale()
}

// capScale is the provider block's capacity_scale (1 when unset).
func (o *Offer) capScale() int { return max(o.scale, 1) }

// SpotPrice is the spot price at t in $/h.
func (o *Offer) SpotPrice(t time.Time) float64 { return o.priceAt(o.tickAt(t)) }

// SpotPriceAt is the spot price of tick i (clamped).
func (o *Offer) SpotPriceAt(i int) float64 {
	return o.priceAt(max(0, min(i, len(o.Series.Avail)-1)))
}

// NextChange is the first tick boundary after t at which capacity or
// price changes; zero when nothing changes any more.
func (o *Offer) NextChange(t time.Time) time.Time {
	s := o.Series
	d := t.Sub(s.Start)
	// First tick index whose start is after t.
	var next int64
	if d >= 0 {
		next = int64(d/s.Tick) + 1
	}
	j := sort.Search(len(o.changes), func(k int) bool { return int64(o.changes[k]) >= next })
	if j == len(o.changes) {
		return time.Time{}
	}
	return o.TickStart(int(o.changes[j]))
}

// position is t in ticks from the series start (fractional).
func (o *Offer) position(t time.Time) float64 {
	return float64(t.Sub(o.Series.Start)) / float64(o.Series.Tick)
}

// costTo is the cost of running on spot from the series start to x ticks.
func (o *Offer) costTo(x float64) float64 {
	n := len(o.Series.Avail)
	h := o.Series.Tick.Hours()
	switch {
	case x <= 0:
		return x * o.priceAt(0) * h
	case x >= float64(n):
		return o.cum[n] + (x-float64(n))*o.priceAt(n-1)*h
	}
	i := int(x)
	return o.cum[i] + (x-float64(i))*o.priceAt(i)*h
}

// SpotCost is what one spot instance costs from a to b at the trace's
// per-tick prices.
func (o *Offer) SpotCost(a, b time.Time) float64 {
	if !b.After(a) {
		return 0
	}
	return o.costTo(o.position(b)) - o.costTo(o.position(a))
}

// OnDemandCost is what one on-demand instance costs from a to b.
func (o *Offer) OnDemandCost(a, b time.Time) float64 {
	if !b.After(a) {
		return 0
	}
	return b.Sub(a).Hours() * o.Meta.OnDemandPrice
}

// Cost is what one instance of capacity type ct costs from a to b.
func (o *Offer) Cost(ct providers.CapacityType, a, b time.Time) float64 {
	if ct == providers.Spot {
		return o.SpotCost(a, b)
	}
	return o.OnDemandCost(a, b)
}

func (o *Offer) String() string {
	return fmt.Sprintf("%s (%s, tick %s)", o.Spot.Key(), o.Series.Key, o.Series.Tick)
}

// Horizon is how long every series still runs after t: windows that must
// stay inside the trace end before t + Horizon(t).
func (m *Market) Horizon(t time.Time) time.Duration {
	end := time.Duration(math.MaxInt64)
	for _, o := range m.Offers {
		if d := o.Series.End().Sub(t); d < end {
			end = d
		}
	}
	return end
}
