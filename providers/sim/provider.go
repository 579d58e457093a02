package sim

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/fleetd/fleetd/providers"
)

// CodeCapacity is the error code of a launch into a zone without capacity.
const CodeCapacity = "InsufficientInstanceCapacity"

// KindSpotInterruption is the interruption kind of trace preemptions.
const KindSpotInterruption = "spot-interruption"

// Options configure a Provider.
type Options struct {
	// Now is the virtual clock. Nil runs in (scaled) real time for the
	// daemon: the trace's start (or the block's start) plus the time since
	// the provider's first call, times the block's speed.
	Now func() time.Time
	// Trace, when set, is used for every config instead of loading the
	// config's trace directory (in-process simulation loads it once).
	Trace *Trace
	// Market, when set, serves every call whatever the config says: an
	// in-process simulation resolves its market once for many runs.
	Market *Market
}

// Provider is the simulated market as a fleetd provider. It is safe for
// concurrent use; `fleetd sim` gives every simulated run its own.
type Provider struct {
	opts Options

	mu      sync.Mutex
	origin  time.Time // wall time of the first call (real-time mode)
	traces  map[string]*Trace
	markets map[string]*Market // by the config's raw JSON
	clocks  map[*Market]clock
	insts   map[string]*instance
	order   []*instance // launch order
	tokens  map[string][]*instance
	live    map[*Offer][]*instance // spot instances counting against capacity, launch order
	seen    map[*Market]time.Time  // preemptions are applied up to here
	seq     int
	usage   Usage
}

// clock maps between the market's virtual time and the time instances
// are reported in. With an injected clock both are the virtual time; in
// real-time mode virtual = start + (wall − origin) × speed, and instance
// times are reported (and notice deadlines taken) in wall time.
type clock struct {
	start, origin time.Time
	speed         float64
	injected      func() time.Time
}

func (c clock) now() time.Time {
	if c.injected != nil {
		return c.injected()
	}
	return c.fromWall(time.Now())
}

func (c clock) fromWall(t time.Time) time.Time {
	if c.injected != nil || t.IsZero() {
		return t
	}
	return c.start.Add(time.Duration(float64(t.Sub(c.origin)) * c.speed))
}

func (c clock) toWall(t time.Time) time.Time {
	if c.injected != nil || t.IsZero() {
		return t
	}
	return c.origin.Add(time.Duration(float64(t.Sub(c.start)) / c.speed))
}

type instance struct {
	providers.Instance // times in virtual time
	market             *Market
	offer              *Offer
	ready              time.Time // launch + latency: running, agent joins
	ended              time.Time // zero while it exists
}

var (
	_ providers.Provider    = (*Provider)(nil)
	_ providers.Interrupter = (*Provider)(nil)
)

// New returns a provider.
func New(opts Options) *Provider {
	return &Provider{opts: opts, traces: map[string]*Trace{}, markets: map[string]*Market{}, clocks: map[*Market]clock{},
		insts: map[string]*instance{}, tokens: map[string][]*instance{}, live: map[*Offer][]*instance{}, seen: map[*Market]time.Time{}}
}

// Info implements providers.Provider.
func (p *Provider) Info(ctx context.Context) (providers.Info, error) {
	if err := ctx.Err(); err != nil {
		return providers.Info{}, err
	}
	return providers.Info{Name: Name, Schema: Schema, NoticeLead: NoticeLeadOf("aws")}, nil
}

// Market returns the market of a config (loading its trace if needed).
func (p *Provider) Market(cfg providers.Config) (*Market, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.market(cfg)
}

// enter checks ctx, takes mu and loads cfg's market: the start of every
// provider call. On success the caller holds mu and must unlock it.
func (p *Provider) enter(ctx context.Context, cfg providers.Config) (*Market, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	m, err := p.market(cfg)
	if err != nil {
		p.mu.Unlock()
		return nil, err
	}
	return m, nil
}

func (p *Provider) market(cfg providers.Config) (*Market, error) {
	if p.opts.Market != nil {
		if _, ok := p.clocks[p.opts.Market]; !ok {
			p.clocks[p.opts.Market] = clock{injected: p.opts.Now}
		}
		return p.opts.Market, nil
	}
	if m, ok := p.markets[string(cfg.Raw)]; ok {
		return m, nil
	}
	c, err := DecodeConfig(cfg)
	if err != nil {
		return nil, err
	}
	tr := p.opts.Trace
	if tr == nil {
		if tr = p.traces[c.Trace]; tr == nil {
			if tr, err = Load(c.Trace); err != nil {
				return nil, providers.InvalidConfig(err)
			}
			p.traces[c.Trace] = tr
		}
	}
	m, err := NewMarket(tr, c)
	if err != nil {
		return nil, err
	}
	ck := clock{injected: p.opts.Now}
	if p.opts.Now == nil {
		off, err := c.StartOffset(tr)
		if err != nil {
			return nil, err
		}
		ck.speed = c.Speed
		if ck.speed == 0 {
			ck.speed = 1
		}
		if p.origin.IsZero() {
			p.origin = time.Now()
		}
		ck.start, ck.origin = tr.Start.Add(off), p.origin
	}
	p.markets[string(cfg.Raw)] = m
	p.clocks[m] = ck
	return m, nil
}

// now returns m's virtual time and applies the trace up to it. Callers
// hold mu.
func (p *Provider) now(m *Market) time.Time {
	now := p.clocks[m].now()
	p.advance(m, now)
	return now
}

// advance applies capacity drops of m in (seen, now]: the newest spot
// instances beyond a zone's capacity get a notice at the tick boundary
// and end at boundary + notice lead; instances whose time came end.
func (p *Provider) advance(m *Market, now time.Time) {
	seen := p.seen[m]
	if now.Before(seen) {
		return
	}
	for _, o := range m.Offers {
		lv := p.live[o]
		if len(lv) == 0 {
			continue
		}
		t := seen
		for {
			b := o.NextChange(t)
			if b.IsZero() || b.After(now) {
				break
			}
			t = b
			if c := o.Capacity(b); len(lv) > c {
				for _, in := range lv[c:] {
					in.Interruption = &providers.InterruptionInfo{Kind: KindSpotInterruption, Deadline: b.Add(o.NoticeLead)}
					p.usage.Preemptions++
				}
				clear(lv[c:])
				lv = lv[:c]
				if len(lv) == 0 {
					break
				}
			}
		}
		p.live[o] = lv
	}
	for _, in := range p.order {
		if !in.ended.IsZero() || in.market != m {
			continue
		}
		if in.Interruption != nil && !in.Interruption.Deadline.IsZero() && !now.Before(in.Interruption.Deadline) {
			p.end(in, in.Interruption.Deadline)
			continue
		}
		if in.State == providers.StatePending && !now.Before(in.ready) {
			in.State = providers.StateRunning
		}
	}
	p.seen[m] = now
}

// end terminates an instance at t and bills it.
func (p *Provider) end(in *instance, t time.Time) {
	if !in.ended.IsZero() {
		return
	}
	if t.Before(in.LaunchedAt) {
		t = in.LaunchedAt
	}
	in.ended, in.State = t, providers.StateTerminated
	p.unlive(in)
	p.bill(in, t)
}

func (p *Provider) bill(in *instance, t time.Time) {
	h := t.Sub(in.LaunchedAt).Hours()
	c := in.offer.Cost(in.Offering.CapacityType, in.LaunchedAt, t)
	if in.Offering.CapacityType == providers.Spot {
		p.usage.SpotHours += h
		p.usage.SpotCost += c
	} else {
		p.usage.OnDemandHours += h
		p.usage.OnDemandCost += c
	}
}

func (p *Provider) unlive(in *instance) {
	lv := p.live[in.offer]
	if i := slices.Index(lv, in); i >= 0 {
		p.live[in.offer] = slices.Delete(lv, i, i+1)
	}
}

// Offerings implements providers.Provider: per series a spot offering
// (price and free capacity now) and an on-demand one (always available).
func (p *Provider) Offerings(ctx context.Context, cfg providers.Config) ([]providers.Offering, error) {
	m, err := p.enter(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer p.mu.Unlock()
	now := p.now(m)
	out := make([]providers.Offering, 0, 2*len(m.Offers))
	for _, o := range m.Offers {
		s := o.Spot
		s.PricePerHour = o.SpotPrice(now)
		s.Available = max(o.Capacity(now)-len(p.live[o]), 0)
		out = append(out, s, o.OnDemand)
	}
	return out, nil
}

// Create implements providers.Provider. Spot launches need free capacity
// at the current tick; the instance runs after the launch latency.
func (p *Provider) Create(ctx context.Context, cfg providers.Config, req providers.LaunchRequest) ([]providers.Instance, error) {
	m, err := p.enter(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer p.mu.Unlock()
	now := p.now(m)
	if req.IdempotencyToken != "" {
		if prev, ok := p.tokens[req.IdempotencyToken]; ok {
			return p.snapshot(prev), nil
		}
	}
	o := m.Offer(req.Offering.Key())
	if o == nil {
		return nil, &providers.Error{Kind: providers.KindInvalidConfig, Offering: req.Offering.Key(), Err: fmt.Errorf("offering %s is not in trace %s", req.Offering.Key(), m.Trace.Name)}
	}
	n := max(req.Count, 1)
	spot := req.Offering.CapacityType == providers.Spot
	off := o.OnDemand
	if spot {
		if free := o.Capacity(now) - len(p.live[o]); free < n {
			return nil, &providers.Error{Kind: providers.KindCapacity, Code: CodeCapacity, Offering: req.Offering.Key(),
				Err: fmt.Errorf("%d spot instance(s) requested, %d free in %s at %s", n, max(free, 0), o.Meta.Zone, now.UTC().Format(time.RFC3339))}
		}
		off = o.Spot
		off.PricePerHour = o.SpotPrice(now)
		off.Available = 0
	}
	created := make([]*instance, 0, n)
	for range n {
		p.seq++
		in := &instance{market: m, offer: o, ready: now.Add(m.LaunchLatency)}
		in.ID = "sim-" + strconv.FormatInt(int64(p.seq), 36)
		in.Offering = off
		in.State = providers.StatePending
		if m.LaunchLatency == 0 {
			in.State = providers.StateRunning
		}
		in.Address = fmt.Sprintf("10.%d.%d.%d", (p.seq>>16)&0xff, (p.seq>>8)&0xff, p.seq&0xff)
		in.Tags = maps.Clone(req.Tags)
		in.LaunchedAt = now
		p.insts[in.ID] = in
		p.order = append(p.order, in)
		if spot {
			p.live[o] = append(p.live[o], in)
		}
		created = append(created, in)
	}
	if req.IdempotencyToken != "" {
		p.tokens[req.IdempotencyToken] = created
	}
	return p.snapshot(created), nil
}

func (p *Provider) snapshot(ins []*instance) []providers.Instance {
	out := make([]providers.Instance, len(ins))
	for i, in := range ins {
		out[i] = p.copy(in)
	}
	return out
}

// copy is the instance as callers see it: times in the clock's terms.
func (p *Provider) copy(in *instance) providers.Instance {
	ck := p.clocks[in.market]
	c := in.Instance
	c.Tags = maps.Clone(in.Tags)
	c.LaunchedAt = ck.toWall(c.LaunchedAt)
	if in.Interruption != nil {
		ii := *in.Interruption
		ii.Deadline = ck.toWall(ii.Deadline)
		c.Interruption = &ii
	}
	return c
}

// Get implements providers.Provider; terminated instances stay visible.
func (p *Provider) Get(ctx context.Context, cfg providers.Config, id string) (providers.Instance, error) {
	m, err := p.enter(ctx, cfg)
	if err != nil {
		return providers.Instance{}, err
	}
	defer p.mu.Unlock()
	p.now(m)
	in, ok := p.insts[id]
	if !ok {
		return providers.Instance{}, providers.NotFound(fmt.Errorf("sim instance %q", id))
	}
	p.now(in.market)
	return p.copy(in), nil
}

// List implements providers.Provider: live instances carrying every tag,
// by id.
func (p *Provider) List(ctx context.Context, cfg providers.Config, tags map[string]string) ([]providers.Instance, error) {
	m, err := p.enter(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer p.mu.Unlock()
	p.now(m)
	var out []providers.Instance
	for _, in := range p.order {
		if in.market != m {
			p.now(in.market)
		}
		if !in.ended.IsZero() || !providers.HasTags(in.Tags, tags) {
			continue
		}
		out = append(out, p.copy(in))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Delete implements providers.Provider: the instance ends (and stops
// being billed) now.
func (p *Provider) Delete(ctx context.Context, cfg providers.Config, id string) error {
	_, err := p.enter(ctx, cfg)
	if err != nil {
		return err
	}
	defer p.mu.Unlock()
	if in, ok := p.insts[id]; ok {
		p.end(in, p.now(in.market))
	}
	return nil
}

// Interrupt implements providers.Interrupter: the instance gets the
// notice now and, when the notice has a deadline, ends then.
func (p *Provider) Interrupt(ctx context.Context, cfg providers.Config, id string, info providers.InterruptionInfo) error {
	_, err := p.enter(ctx, cfg)
	if err != nil {
		return err
	}
	defer p.mu.Unlock()
	in, ok := p.insts[id]
	if !ok {
		return providers.NotFound(fmt.Errorf("sim instance %q", id))
	}
	p.now(in.market)
	if !in.ended.IsZero() {
		return nil
	}
	ii := info
	ii.Deadline = p.clocks[in.market].fromWall(ii.Deadline)
	in.Interruption = &ii
	p.unlive(in)
	return nil
}

// Usage is what a provider's instances cost so far.
type Usage struct {
	SpotCost      float64 `json:"spot_cost"`
	OnDemandCost  float64 `json:"on_demand_cost"`
	SpotHours     float64 `json:"spot_hours"`
	OnDemandHours float64 `json:"on_demand_hours"`
	// Preemptions counts spot instances the trace took.
	Preemptions int `json:"preemptions"`
}

// Cost is the total.
func (u Usage) Cost() float64 { return u.SpotCost + u.OnDemandCost }

// Usage returns the bill of every instance so far, live ones up to now.
func (p *Provider) Usage() Usage {
	p.mu.Lock()
	defer p.mu.Unlock()
	u := p.usage
	for _, in := range p.order {
		if in.ended.IsZero() {
			now := p.now(in.market)
			h := now.Sub(in.LaunchedAt).Hours()
			c := in.offer.Cost(in.Offering.CapacityType, in.LaunchedAt, now)
			if in.Offering.CapacityType == providers.Spot {
				u.SpotHours, u.SpotCost = u.SpotHours+h, u.SpotCost+c
			} else {
				u.OnDemandHours, u.OnDemandCost = u.OnDemandHours+h, u.OnDemandCost+c
			}
		}
	}
	return u
}

// NextEvent is the earliest time after now at which something happens to
// this provider's live instances on its own: a launch completes, a notice
// deadline ends an instance, or the capacity of a zone with running spot
// instances changes.
func (p *Provider) NextEvent() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	var next, now time.Time
	earliest := func(t time.Time) {
		if !t.IsZero() && t.After(now) && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	for m := range p.clocks {
		now = p.now(m)
	}
	for _, in := range p.order {
		if !in.ended.IsZero() {
			continue
		}
		if in.State == providers.StatePending {
			earliest(in.ready)
		}
		if in.Interruption != nil {
			earliest(in.Interruption.Deadline)
		}
	}
	for o, lv := range p.live {
		if len(lv) > 0 {
			// Only drops below what runs matter; skip other changes.
			t := now
			for {
				b := o.NextChange(t)
				if b.IsZero() {
					break
				}
				if o.Capacity(b) < len(lv) {
					earliest(b)
					break
				}
				t = b
			}
		}
	}
	return next
}
