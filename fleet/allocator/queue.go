package allocator

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// effPriority is the queue order's priority: the project's plus the
// fleet's plus one per AgingEvery waited, so every fleet reaches the
// head eventually.
func (a *alloc) effPriority(f *fstate) int {
	p := f.proj.in.Priority + f.in.Priority
	if w := a.waited(f); w > 0 {
		p += int(w / a.p.AgingEvery)
	}
	return p
}

func (a *alloc) waited(f *fstate) time.Duration {
	if f.in.Arrival.IsZero() || !a.in.Now.After(f.in.Arrival) {
		return 0
	}
	return a.in.Now.Sub(f.in.Arrival)
}

// queueLess orders waiting fleets: priority (aged), then arrival, then name.
func (a *alloc) queueLess(x, y *fstate) bool {
	px, py := a.effPriority(x), a.effPriority(y)
	if px != py {
		return px > py
	}
	if !x.in.Arrival.Equal(y.in.Arrival) {
		return x.in.Arrival.Before(y.in.Arrival)
	}
	return x.name() < y.name()
}

// admit starts the waiting fleets whose min_nodes fit, in queue order,
// and queues the rest with the reason.
func (a *alloc) admit() {
	var cands []*fstate
	for _, f := range a.fleets {
		if f.alloc.Action == "" && !f.in.Running {
			cands = append(cands, f)
		}
	}
	sort.SliceStable(cands, func(i, j int) bool { return a.queueLess(cands[i], cands[j]) })
	for _, f := range cands {
		why := a.fits(f)
		if why == "" && f.proj.blocked != "" {
			why = f.proj.blocked
		}
		if why == "" {
			p, need := f.proj, f.lo*f.g
			f.managed, f.started, f.n = true, true, f.lo
			p.used += need
			p.mins += need
			p.perHour += float64(f.lo) * f.price()
			continue
		}
		reserved := a.waited(f) >= a.p.ReserveAfter
		f.alloc.Action, f.alloc.Kind = Queue, "queued"
		a.enqueue(f, why, reserved)
		if reserved && f.proj.blocked == "" {
			f.proj.blocked = fmt.Sprintf("%s waits ahead of it for %s (a fleet waiting over %s keeps its place)", f.name(), roundDur(a.waited(f)), roundDur(a.p.ReserveAfter))
		}
	}
}

func (a *alloc) enqueue(f *fstate, why string, reserved bool) {
	f.proj.queued++
	if f.resumed {
		why += " (paused by its budget, which is no longer spent: it resumes when it fits)"
	}
	a.queue = append(a.queue, QueueEntry{Fleet: f.in.Name, Project: f.in.Project, Priority: a.effPriority(f), Waiting: a.waited(f), Reserved: reserved, Reason: why})
}

// fits says why the fleet cannot start now, or "".
func (a *alloc) fits(f *fstate) string {
	p, need := f.proj, f.lo*f.g
	if f.noGrow != "" {
		return "budget: " + f.noGrow
	}
	add := float64(f.lo) * f.price()
	if cap := p.in.Budget.PerHour; cap > 0 && a.liveHour(p)+add > cap*(1+1e-9) {
		return fmt.Sprintf("budget: its min_nodes would add $%.2f/h to project %s's $%.2f/h, above its $%.2f/h cap", add, p.in.Name, a.liveHour(p), cap)
	}
	if cap := f.in.Budget.PerHour; cap > 0 && add > cap*(1+1e-9) {
		return fmt.Sprintf("budget: its min_nodes cost $%.2f/h, above its own $%.2f/h cap", add, cap)
	}
	if c := f.in.CapacityNodes; c > 0 && c < f.lo {
		return fmt.Sprintf("the clouds offer %d of its nodes now; it needs min_nodes = %d", c, f.lo)
	}
	if need > p.ceiling() {
		return fmt.Sprintf("its min_nodes need %d GPUs, more than project %s may hold (max_gpus %d)", need, p.in.Name, p.ceiling())
	}
	poolMins, reserved := 0, 0
	for _, q := range a.order {
		poolMins += q.mins
		if q.known && !q.in.Unlimited {
			reserved += max(q.quota(), q.mins)
		} else {
			reserved += q.used
		}
	}
	if p.mins+need <= p.quota() && poolMins+need <= a.pool {
		return ""
	}
	// Beyond its quota a fleet starts only on GPUs no quota reserves:
	// min_nodes are never borrowed, as they could not be given back.
	if p.mins+need <= p.ceiling() && a.pool-reserved >= need {
		return ""
	}
	if p.mins+need <= p.quota() {
		return fmt.Sprintf("its min_nodes need %d GPUs; project %s's quota has room, but only %d of the pool's %d GPUs are not held by running fleets' min_nodes", need, p.in.Name, max(a.pool-poolMins, 0), a.pool)
	}
	var holders []string
	for _, g := range p.fleets {
		if g.managed && g.lo > 0 {
			holders = append(holders, fmt.Sprintf("%s holds %d at its min_nodes", g.name(), g.lo*g.g))
		}
	}
	left := max(p.quota()-p.mins, 0)
	why := fmt.Sprintf("its min_nodes need %d GPUs; project %s has %d of its %d-GPU quota free", need, p.in.Name, left, p.quota())
	if len(holders) > 0 {
		why += " (" + strings.Join(holders, ", ") + ")"
	}
	if free := a.pool - reserved; free > 0 {
		why += fmt.Sprintf(", and %d GPUs of the pool are outside every quota", free)
	} else if p.ceiling() > p.quota() {
		why += "; min_nodes are never borrowed, so GPUs other projects' quotas reserve do not count"
	}
	return why
}

// liveHour is the project's $/h were its running fleets to keep what
// they hold, plus the fleets started this pass.
func (a *alloc) liveHour(p *pstate) float64 {
	s := 0.0
	for _, f := range p.fleets {
		if f.managed {
			s += float64(max(f.in.Current, f.n)) * f.price()
		}
	}
	return s
}

func roundDur(d time.Duration) string {
	switch {
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < time.Hour:
		return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
	}
	return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
}
