package controller

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/fleetd/fleetd/fleet/budget"
	"github.com/fleetd/fleetd/fleet/projects"
	"github.com/fleetd/fleetd/fleet/reconcile"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/spend"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

// observeSpend feeds the budget ledger each fleet's spend as the daemon
// computes it (spend.Incarnation: price × lifetime of its node records,
// split by capacity type) and its run rate, forgets destroyed fleets,
// raises the ledger's alerts as events and saves it: at once after an
// alert, else at most every flushEvery (Flush saves the rest). It runs in
// ReconcileAll only; pool.mu guards the ledger against the API's reads.
func (p *pool) observeSpend(ctx context.Context, fleets []state.Fleet, specs map[string]*spec.Fleet, now time.Time) {
	c := p.c
	l := p.loadLedger(ctx)
	known := map[string]bool{}
	for _, f := range fleets {
		known[f.Name] = true
		project := projects.Default
		if fl, ok := specs[f.Name]; ok {
			project = fl.ProjectName()
		} else if p, ok := l.Owner[f.Name]; ok {
			project = p
		}
		var spent, rate budget.Spend
		err := c.store.View(ctx, func(tx state.Tx) error {
			total, err := spend.Incarnation(tx, f.Name, now)
			if err != nil {
				return err
			}
			nodes, err := tx.Nodes(f.Name)
			if err != nil {
				return err
			}
			var od float64
			for _, n := range nodes {
				usd := spend.NodeUSD(n, now)
				if n.Offering.CapacityType == providers.OnDemand {
					od += usd
				}
				if reconcile.Live(n.State) && n.InstanceID != "" {
					if n.Offering.CapacityType == providers.OnDemand {
						rate.OnDemand += n.Offering.PricePerHour
					} else {
						rate.Spot += n.Offering.PricePerHour
					}
				}
			}
			// Forgotten (pruned) records count as spot: their type is gone.
			spent = budget.Spend{OnDemand: od, Spot: total - od}
			return nil
		})
		if err != nil {
			c.log.Warn("budget: fleet spend", "fleet", f.Name, "err", err)
			continue
		}
		p.mu.Lock()
		l.Observe(now, f.Name, project, spent, rate)
		p.ledgerDirty = true
		p.mu.Unlock()
	}
	p.mu.Lock()
	for name := range l.Owner {
		if !known[name] {
			l.Forget(now, name)
			p.ledgerDirty = true
		}
	}
	alerts := l.Alerts(now, func(kind, name string) (budget.Limits, bool) {
		if kind == "project" {
			p, ok := c.opts.ProjectsNow().Get(name)
			if !ok || p.Budget == nil {
				return budget.Limits{}, false
			}
			return *p.Budget, true
		}
		fl, ok := specs[name]
		if !ok || fl.Budget == nil {
			return budget.Limits{}, false
		}
		return *fl.Budget, true
	})
	p.mu.Unlock()
	for _, a := range alerts {
		ev := state.Event{Type: "budget." + string(a.To), Message: fmt.Sprintf("%s %s budget %s → %s: %s", a.Kind, a.Name, a.From, a.To, a.Status.Reason),
			Data: map[string]string{"kind": a.Kind, "name": a.Name, "state": string(a.To), "spent_usd": strconv.FormatFloat(a.Status.Spent.Total(), 'f', 2, 64)}}
		if a.Kind == "fleet" {
			ev.Fleet = a.Name
		}
		c.appendEvent(ctx, ev)
	}
	p.saveLedger(ctx, now, len(alerts) > 0)
}

// loadLedger returns the ledger, reading it from the store the first time
// in a leader term (Reset drops it).
func (p *pool) loadLedger(ctx context.Context) *budget.Ledger {
	c := p.c
	p.mu.Lock()
	l := p.ledger
	p.mu.Unlock()
	if l != nil {
		return l
	}
	err := c.store.View(ctx, func(tx state.Tx) error {
		var err error
		l, err = budget.Load(tx)
		return err
	})
	if err != nil || l == nil {
		c.log.Warn("budget: load ledger; starting from the node records", "err", err)
		l = &budget.Ledger{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ledger != nil {
		// Loaded meanwhile (a pass and a charge at once): one ledger, or
		// a charge made on the other would be lost.
		return p.ledger
	}
	p.ledger, p.ledgerSaved = l, c.now()
	return l
}

// saveLedger persists the ledger when force, or when it changed and was
// last saved flushEvery ago.
func (p *pool) saveLedger(ctx context.Context, now time.Time, force bool) {
	c := p.c
	p.mu.Lock()
	l := p.ledger
	due := p.ledgerDirty && (force || now.Sub(p.ledgerSaved) >= flushEvery)
	var b []byte
	if due && l != nil {
		b, _ = l.Marshal()
	}
	p.mu.Unlock()
	if b == nil {
		return
	}
	err := c.store.Update(ctx, func(tx state.Tx) error { return tx.SetMeta(budget.MetaKey, b) })
	if err != nil {
		if ctx.Err() == nil {
			c.log.Warn("budget: save ledger; retried next pass", "err", err)
		}
		return
	}
	p.mu.Lock()
	p.ledgerSaved, p.ledgerDirty = now, false
	p.mu.Unlock()
}

// ChargeEgress records a checkpoint move's egress ($) in the budget
// ledger, on the fleet's and its project's accounts, and saves the ledger
// at once: unlike node time, egress cannot be recomputed from the node
// records after a restart.
func (c *Controller) ChargeEgress(ctx context.Context, fleet, project string, usd float64) {
	p := c.pool
	l := p.loadLedger(ctx)
	now := c.now()
	p.mu.Lock()
	l.Charge(now, fleet, project, budget.Spend{Egress: usd})
	p.ledgerDirty = true
	p.mu.Unlock()
	p.saveLedger(ctx, now, true)
}

// BudgetStatus is a fleet's or project's budget status now (kind "fleet"
// or "project"), zero spend when the ledger has no account for it.
func (c *Controller) BudgetStatus(kind, name string, lim budget.Limits) budget.Status {
	return c.pool.status(kind, name, lim)
}

// status is BudgetStatus.
func (p *pool) status(kind, name string, lim budget.Limits) budget.Status {
	c := p.c
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.ledger
	if l == nil {
		l = &budget.Ledger{}
	}
	if kind == "project" {
		return l.ProjectStatus(name, lim, c.now())
	}
	return l.FleetStatus(name, lim, c.now())
}
