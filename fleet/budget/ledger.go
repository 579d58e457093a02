package budget

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"
)

// Spend is money by kind, in dollars (or dollars per hour for a rate).
type Spend struct {
	Spot     float64 `json:"spot,omitempty"`
	OnDemand float64 `json:"on_demand,omitempty"`
	// Egress is what moving checkpoints between regions or clouds cost.
	Egress float64 `json:"egress,omitempty"`
}

// Total is the sum of the kinds.
func (s Spend) Total() float64 { return s.Spot + s.OnDemand + s.Egress }

func (s Spend) add(o Spend) Spend {
	return Spend{Spot: s.Spot + o.Spot, OnDemand: s.OnDemand + o.OnDemand, Egress: s.Egress + o.Egress}
}

func (s Spend) scale(f float64) Spend {
	return Spend{Spot: s.Spot * f, OnDemand: s.OnDemand * f, Egress: s.Egress * f}
}

// State is where an account stands against its limits.
type State string

// States, from best to worst.
const (
	OK State = "ok"
	// Warn: spend or burn rate reached warn_at of its limit.
	Warn State = "warn"
	// Capped: the burn rate reached per_hour; no nodes are added.
	Capped State = "capped"
	// Exhausted: the spend reached total; on_exhausted applies.
	Exhausted State = "exhausted"
)

func (s State) rank() int {
	switch s {
	case Warn:
		return 1
	case Capped:
		return 2
	case Exhausted:
		return 3
	}
	return 0
}

// Account is the spend of one fleet or one project.
type Account struct {
	Spent Spend `json:"spent"`
	// Rate is the current burn in $/h by kind (the running nodes'
	// prices): for a fleet as last observed, for a project its fleets'.
	Rate Spend `json:"rate"`
	// Since is the first spend, At the last accrual.
	Since time.Time `json:"since,omitzero"`
	At    time.Time `json:"at,omitzero"`
	// Alerted is the worst state an alert was raised for, so a restart
	// does not raise it again; it falls back when the state improves
	// (a raised budget), so the next crossing alerts again.
	Alerted State `json:"alerted,omitempty"`
}

// Ledger is the spend of every fleet and project. The zero value is
// empty and ready; it is a plain JSON value (persist it whole).
type Ledger struct {
	// Fleets by fleet key (the daemon's fleet id or name).
	Fleets map[string]*Account `json:"fleets,omitempty"`
	// Projects by project name; a project's spend includes the spend of
	// its fleets that were destroyed.
	Projects map[string]*Account `json:"projects,omitempty"`
	// Owner is each fleet's project.
	Owner map[string]string `json:"owner,omitempty"`
}

func (l *Ledger) account(m *map[string]*Account, key string) *Account {
	if *m == nil {
		*m = map[string]*Account{}
	}
	a := (*m)[key]
	if a == nil {
		a = &Account{}
		(*m)[key] = a
	}
	return a
}

// accrue adds the fleet's spend since its last accrual at its last rate.
// The nodes were billed all along, whether or not the daemon was up to
// see it, so a gap (a restart, a failover) is accrued too.
func (l *Ledger) accrue(fleet string, now time.Time) {
	fa := l.Fleets[fleet]
	if fa == nil || fa.At.IsZero() || !now.After(fa.At) {
		return
	}
	s := fa.Rate.scale(now.Sub(fa.At).Hours())
	fa.Spent = fa.Spent.add(s)
	fa.At = now
	pa := l.account(&l.Projects, l.Owner[fleet])
	pa.Spent = pa.Spent.add(s)
	if pa.Since.IsZero() && s.Total() > 0 {
		pa.Since = now
	}
	pa.At = now
}

// Run records a fleet's run rate from now on ($/h of its spot and its
// on-demand nodes), accruing its spend up to now at the previous rate.
// The daemon calls it every pass; a fleet that stops calls it with zero.
func (l *Ledger) Run(now time.Time, fleet, project string, spotPerHour, onDemandPerHour float64) {
	l.bind(fleet, project, now)
	fa := l.Fleets[fleet]
	fa.Rate = Spend{Spot: spotPerHour, OnDemand: onDemandPerHour}
	if fa.Since.IsZero() && fa.Rate.Total() > 0 {
		fa.Since = now
	}
	l.sumRates(project)
}

// Charge records a one-off spend (a checkpoint move's egress).
func (l *Ledger) Charge(now time.Time, fleet, project string, s Spend) {
	l.bind(fleet, project, now)
	fa, pa := l.Fleets[fleet], l.Projects[project]
	fa.Spent, pa.Spent = fa.Spent.add(s), pa.Spent.add(s)
	if fa.Since.IsZero() {
		fa.Since = now
	}
	if pa.Since.IsZero() {
		pa.Since = now
	}
}

// Advance accrues every fleet's spend up to now.
func (l *Ledger) Advance(now time.Time) {
	for _, f := range slices.Sorted(maps.Keys(l.Fleets)) {
		l.accrue(f, now)
	}
}

// Forget ends a destroyed fleet's account: its spend stays in its
// project's.
func (l *Ledger) Forget(now time.Time, fleet string) {
	l.accrue(fleet, now)
	p, ok := l.Owner[fleet]
	delete(l.Fleets, fleet)
	delete(l.Owner, fleet)
	if ok {
		l.sumRates(p)
	}
}

// bind accrues the fleet to now and attaches it to its project.
func (l *Ledger) bind(fleet, project string, now time.Time) {
	l.accrue(fleet, now)
	l.attach(fleet, project, now)
}

// attach makes sure both accounts exist. A fleet that moves to another
// project takes its future spend along; what it spent stays where it was
// spent.
func (l *Ledger) attach(fleet, project string, now time.Time) {
	fa := l.account(&l.Fleets, fleet)
	pa := l.account(&l.Projects, project)
	if fa.At.IsZero() {
		fa.At = now
	}
	if pa.At.IsZero() {
		pa.At = now
	}
	if l.Owner == nil {
		l.Owner = map[string]string{}
	}
	if old, ok := l.Owner[fleet]; ok && old != project {
		l.Owner[fleet] = project
		l.sumRates(old)
	}
	l.Owner[fleet] = project
}

// Observe records a fleet's spend as the daemon computes it from its node
// records (price × lifetime, by capacity type) and its current run rate:
// exact across restarts and failovers, since the records are persisted.
// Spend never goes down here (a pruned node record must not refund it);
// egress comes only from Charge. Between two observations the statuses
// estimate the spend at the last rate.
func (l *Ledger) Observe(now time.Time, fleet, project string, spent, rate Spend) {
	l.attach(fleet, project, now)
	fa, pa := l.Fleets[fleet], l.Projects[project]
	d := Spend{Spot: math.Max(spent.Spot-fa.Spent.Spot, 0), OnDemand: math.Max(spent.OnDemand-fa.Spent.OnDemand, 0)}
	fa.Spent, pa.Spent = fa.Spent.add(d), pa.Spent.add(d)
	fa.Rate = Spend{Spot: rate.Spot, OnDemand: rate.OnDemand}
	if now.After(fa.At) {
		fa.At = now
	}
	if fa.Since.IsZero() && (d.Total() > 0 || fa.Rate.Total() > 0) {
		fa.Since = now
	}
	if pa.Since.IsZero() && d.Total() > 0 {
		pa.Since = now
	}
	l.sumRates(project)
}

func (l *Ledger) sumRates(project string) {
	pa := l.account(&l.Projects, project)
	pa.Rate = Spend{}
	for f, p := range l.Owner {
		if fa := l.Fleets[f]; p == project && fa != nil {
			pa.Rate = pa.Rate.add(fa.Rate)
		}
	}
}

// Status is an account against its limits at a time.
type Status struct {
	State State   `json:"state"`
	Spent Spend   `json:"spent"`
	Rate  Spend   `json:"rate"`
	Limit Limits  `json:"limit"`
	Total float64 `json:"total"`
	// PerHour is the current burn in $/h.
	PerHour float64 `json:"per_hour"`
	// Remaining is Limit.Total minus the spend (0 without a total).
	Remaining float64 `json:"remaining,omitempty"`
	// ExhaustsAt is when the total is spent at the current burn rate;
	// zero without a total or without a burn.
	ExhaustsAt time.Time `json:"exhausts_at,omitzero"`
	// Reason says the state for humans.
	Reason string `json:"reason"`
}

// FleetStatus is a fleet's account against lim at now (accrued to now;
// the ledger itself is not changed).
func (l *Ledger) FleetStatus(fleet string, lim Limits, now time.Time) Status {
	var a Account
	if fa := l.Fleets[fleet]; fa != nil {
		a = *fa
		if !a.At.IsZero() && now.After(a.At) {
			a.Spent = a.Spent.add(a.Rate.scale(now.Sub(a.At).Hours()))
		}
	}
	return evaluate(a, lim, now)
}

// ProjectStatus is a project's account against lim at now.
func (l *Ledger) ProjectStatus(project string, lim Limits, now time.Time) Status {
	var a Account
	if pa := l.Projects[project]; pa != nil {
		a = *pa
	}
	for _, f := range slices.Sorted(maps.Keys(l.Fleets)) {
		if l.Owner[f] != project {
			continue
		}
		if fa := l.Fleets[f]; !fa.At.IsZero() && now.After(fa.At) {
			a.Spent = a.Spent.add(fa.Rate.scale(now.Sub(fa.At).Hours()))
		}
	}
	return evaluate(a, lim, now)
}

func evaluate(a Account, lim Limits, now time.Time) Status {
	lim = lim.WithDefaults()
	st := Status{State: OK, Spent: a.Spent, Rate: a.Rate, Limit: lim, Total: a.Spent.Total(), PerHour: a.Rate.Total()}
	if lim.Total > 0 {
		st.Remaining = math.Max(lim.Total-st.Total, 0)
		if st.PerHour > 0 && st.Remaining > 0 {
			st.ExhaustsAt = now.Add(time.Duration(st.Remaining / st.PerHour * float64(time.Hour)))
		}
	}
	switch {
	case lim.Total > 0 && st.Total >= lim.Total:
		st.State = Exhausted
		st.Reason = fmt.Sprintf("spent %s of its %s total: %s", USD(st.Total), USD(lim.Total), lim.OnExhausted)
	case lim.PerHour > 0 && st.PerHour >= lim.PerHour:
		st.State = Capped
		st.Reason = fmt.Sprintf("burns %s/h, at its %s/h cap: no nodes are added", USD(st.PerHour), USD(lim.PerHour))
	case lim.Total > 0 && st.Total >= lim.WarnAt*lim.Total:
		st.State = Warn
		st.Reason = fmt.Sprintf("spent %s, %.0f%% of its %s total", USD(st.Total), 100*st.Total/lim.Total, USD(lim.Total))
	case lim.PerHour > 0 && st.PerHour >= lim.WarnAt*lim.PerHour:
		st.State = Warn
		st.Reason = fmt.Sprintf("burns %s/h, %.0f%% of its %s/h cap", USD(st.PerHour), 100*st.PerHour/lim.PerHour, USD(lim.PerHour))
	default:
		st.Reason = fmt.Sprintf("spent %s, burns %s/h", USD(st.Total), USD(st.PerHour))
	}
	if !st.ExhaustsAt.IsZero() && st.State != Exhausted {
		st.Reason += "; the total runs out at " + st.ExhaustsAt.UTC().Format("2006-01-02 15:04Z") + " at this rate"
	}
	return st
}

// Alert is an account entering a worse state.
type Alert struct {
	// Kind is "fleet" or "project"; Name the fleet key or project name.
	Kind   string `json:"kind"`
	Name   string `json:"name"`
	From   State  `json:"from"`
	To     State  `json:"to"`
	Status Status `json:"status"`
}

// Alerts accrues to now and returns every account whose state got worse
// than the worst it alerted for (once per crossing, across restarts: the
// ledger remembers). limits gives an account's limits: kind is "fleet"
// or "project"; false means no budget.
func (l *Ledger) Alerts(now time.Time, limits func(kind, name string) (Limits, bool)) []Alert {
	l.Advance(now)
	var out []Alert
	check := func(kind string, m map[string]*Account, status func(string, Limits) Status) {
		for _, name := range slices.Sorted(maps.Keys(m)) {
			lim, ok := limits(kind, name)
			if !ok || lim.IsZero() {
				continue
			}
			a := m[name]
			st := status(name, lim)
			prev := a.Alerted
			if prev == "" {
				prev = OK
			}
			switch {
			case st.State.rank() > prev.rank():
				out = append(out, Alert{Kind: kind, Name: name, From: prev, To: st.State, Status: st})
				a.Alerted = st.State
			case st.State.rank() < prev.rank():
				a.Alerted = st.State
			}
		}
	}
	check("project", l.Projects, func(n string, lim Limits) Status { return l.ProjectStatus(n, lim, now) })
	check("fleet", l.Fleets, func(n string, lim Limits) Status { return l.FleetStatus(n, lim, now) })
	return out
}

// Marshal encodes the ledger for the state store.
func (l *Ledger) Marshal() ([]byte, error) { return json.Marshal(l) }

// Unmarshal decodes a ledger the store kept.
func Unmarshal(b []byte) (*Ledger, error) {
	l := &Ledger{}
	if len(b) == 0 {
		return l, nil
	}
	if err := json.Unmarshal(b, l); err != nil {
		return nil, fmt.Errorf("budget ledger: %w", err)
	}
	for f := range l.Fleets {
		if l.Fleets[f] == nil {
			delete(l.Fleets, f)
		}
	}
	return l, nil
}

// MetaKey is where the daemon keeps the ledger in its state store's meta.
const MetaKey = "budget-ledger"

// MetaStore is the part of a state transaction the ledger is kept in
// (state.Tx is one, on bbolt and on etcd alike, so the ledger follows the
// leader).
type MetaStore interface {
	Meta(key string) ([]byte, error)
	SetMeta(key string, value []byte) error
}

// Load reads the ledger kept in tx; an empty one when there is none.
func Load(tx MetaStore) (*Ledger, error) {
	b, err := tx.Meta(MetaKey)
	if err != nil {
		return nil, fmt.Errorf("read budget ledger: %w", err)
	}
	return Unmarshal(b)
}

// Save keeps the ledger in tx.
func (l *Ledger) Save(tx MetaStore) error {
	b, err := l.Marshal()
	if err != nil {
		return fmt.Errorf("encode budget ledger: %w", err)
	}
	if err := tx.SetMeta(MetaKey, b); err != nil {
		return fmt.Errorf("save budget ledger: %w", err)
	}
	return nil
}

// USD renders dollars in cents, or with two significant digits below a
// cent, so a small test or trial budget does not read "$0.00 of $0.00".
func USD(v float64) string {
	if v == 0 || math.Abs(v) >= 0.01 {
		return fmt.Sprintf("$%.2f", v)
	}
	return fmt.Sprintf("$%.*f", int(math.Ceil(-math.Log10(math.Abs(v))))+1, v)
}
