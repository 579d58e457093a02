package allocator

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/fleetd/fleetd/fleet/autoscale"
)

// finish turns the tentative allocation into the decision and its reasons.
func (a *alloc) finish() Decision {
	d := Decision{Now: a.in.Now, PoolGPUs: a.pool}
	for _, f := range a.fleets {
		al := &f.alloc
		switch {
		case f.managed:
			al.Action, al.To = Run, f.n
			if al.Kind == "" {
				al.Kind, al.Reason = a.runWhy(f)
			}
			d.UsedGPUs += f.n * f.g
		case al.Kind == "unlimited":
			al.To = f.n
		}
		if al.Action == Run && al.To < al.From {
			al.Remove = pick(f.in.Nodes, al.From-al.To)
			if len(al.Remove) > 0 {
				al.Reason += "; drains " + strings.Join(al.Remove, ", ")
				if r0 := rank0(f.in.Nodes); r0 != "" {
					al.Reason += " (keeps " + r0 + ", rank 0)"
				}
			}
		}
	}
	// The queue, in the order its fleets would start.
	key := map[string]*fstate{}
	for _, f := range a.fleets {
		key[f.in.Project+"\x00"+f.in.Name] = f
	}
	sort.SliceStable(a.queue, func(i, j int) bool {
		return a.queueLess(key[a.queue[i].Project+"\x00"+a.queue[i].Fleet], key[a.queue[j].Project+"\x00"+a.queue[j].Fleet])
	})
	for i := range a.queue {
		e := &a.queue[i]
		e.Position = i + 1
		f := key[e.Project+"\x00"+e.Fleet]
		f.alloc.Reason = fmt.Sprintf("%s waits, %d of %d in the queue: %s", f.name(), e.Position, len(a.queue), e.Reason)
	}
	d.Queue = a.queue
	for _, f := range a.fleets {
		d.Fleets = append(d.Fleets, f.alloc)
	}
	borrowed := 0
	for _, p := range a.order {
		if p.known && !p.in.Unlimited {
			borrowed += max(p.used-p.quota(), 0)
		}
	}
	for _, p := range a.order {
		if !p.known {
			continue
		}
		u := ProjectUse{Name: p.in.Name, QuotaGPUs: p.quota(), MaxGPUs: p.ceiling(), UsedGPUs: p.used, Queued: p.queued, PerHour: p.perHour, Budget: p.in.Budget}
		if !p.in.Unlimited {
			u.BorrowedGPUs, u.LentGPUs = Lending(p.quota(), p.used, &borrowed)
		}
		d.Projects = append(d.Projects, u)
	}
	return d
}

// Lending is a project's borrowed and lent GPUs given its quota and use.
// Borrowed GPUs come out of the quotas left unused, in name order: call it
// for the projects in name order, borrowed starting at the sum of every
// project's GPUs above its quota; it takes what this project lends.
func Lending(quota, used int, borrowed *int) (borrowedGPUs, lentGPUs int) {
	lend := min(max(quota-used, 0), *borrowed)
	*borrowed -= lend
	return max(used-quota, 0), lend
}

// runWhy explains a running fleet's size.
func (a *alloc) runWhy(f *fstate) (string, string) {
	from, to := f.in.Current, f.n
	p := f.proj
	var b strings.Builder
	kind := ""
	switch {
	case f.started:
		kind = "start"
		fmt.Fprintf(&b, "%s starts at %d node%s", f.name(), to, plural(to))
		if p.mins <= p.quota() {
			fmt.Fprintf(&b, ": its min_nodes fit project %s's quota", p.in.Name)
		} else {
			fmt.Fprintf(&b, ": its min_nodes fit GPUs outside every quota")
		}
		if to > f.lo {
			fmt.Fprintf(&b, "; %s %s", nodes(f.lo+1, to), a.adds(f, f.lo, to))
		}
		if to < f.in.MaxNodes {
			b.WriteString(a.limitWhy(f))
		}
		if f.resumed {
			b.WriteString(" (resumes: its budget is no longer spent)")
		}
	case to == from:
		kind = "hold"
		fmt.Fprintf(&b, "%s holds %d node%s", f.name(), to, plural(to))
		if to < f.in.MaxNodes {
			b.WriteString(a.limitWhy(f))
		} else {
			b.WriteString(" (max_nodes)")
		}
	case to > from:
		kind = "grow"
		fmt.Fprintf(&b, "%s %d→%d: ", f.name(), from, to)
		if from < f.lo {
			fmt.Fprintf(&b, "back to its min_nodes (%d) after losing nodes", f.lo)
			if to > f.lo {
				fmt.Fprintf(&b, "; %s %s", nodes(f.lo+1, to), a.adds(f, f.lo, to))
			}
		} else {
			fmt.Fprintf(&b, "%s %s", nodes(from+1, to), a.adds(f, from, to))
		}
		if p.used > p.quota() {
			fmt.Fprintf(&b, " (project %s borrows %d GPUs beyond its %d-GPU quota, up to its max_gpus %d)", p.in.Name, p.used-p.quota(), p.quota(), p.ceiling())
		}
		if to < f.in.MaxNodes {
			b.WriteString(a.limitWhy(f))
		}
	default:
		kind = "shrink"
		fmt.Fprintf(&b, "%s %d→%d: ", f.name(), from, to)
		switch {
		case to == f.hi && f.hi < from && f.capBy != "":
			b.WriteString(a.capWhy(f))
			fmt.Fprintf(&b, "; %s %s", nodes(to+1, from), a.adds(f, to, from))
		default:
			fmt.Fprintf(&b, "%s %s", nodes(to+1, from), a.adds(f, to, from))
			gainers, reclaim := a.gainers(f)
			switch {
			case reclaim != "":
				kind = "reclaim"
				fmt.Fprintf(&b, "; project %s takes back the GPUs of its quota that project %s borrowed", reclaim, p.in.Name)
				if len(gainers) > 0 {
					b.WriteString(" (" + strings.Join(gainers, "; ") + ")")
				}
			case len(gainers) > 0:
				b.WriteString("; " + strings.Join(gainers, "; "))
			case p.before > p.ceiling():
				fmt.Fprintf(&b, "; project %s may hold %d GPUs (max_gpus), less than it ran", p.in.Name, p.ceiling())
			default:
				fmt.Fprintf(&b, "; the pool (%d GPUs) is smaller than what runs", a.pool)
			}
		}
	}
	if p.dollars && kind != "hold" {
		fmt.Fprintf(&b, " [ranked per dollar: project %s's $%.2f/h budget is the limit]", p.in.Name, p.in.Budget.PerHour)
	}
	return kind, b.String()
}

// gainers describes the fleets that grew or started this pass (at most
// three, largest gain first); reclaim names another project that did so
// within its quota while f's project was borrowing.
func (a *alloc) gainers(f *fstate) ([]string, string) {
	type g struct {
		f    *fstate
		gain float64
	}
	var gs []g
	reclaim := ""
	borrowing := f.proj.before > f.proj.quota()
	for _, h := range a.fleets {
		if h == f || !h.managed || (!h.started && h.n <= h.in.Current) {
			continue
		}
		if h.proj != f.proj && borrowing && h.proj.used <= h.proj.quota() && reclaim == "" {
			reclaim = h.proj.in.Name
		}
		gain := math.Inf(1)
		if !h.started && h.in.Current > 0 {
			gain = h.x(h.n)/h.x(h.in.Current) - 1
		}
		gs = append(gs, g{h, gain})
	}
	sort.SliceStable(gs, func(i, j int) bool { return gs[i].gain > gs[j].gain })
	var out []string
	for i, x := range gs {
		if i == 3 {
			out = append(out, fmt.Sprintf("and %d more", len(gs)-3))
			break
		}
		h := x.f
		switch {
		case h.started:
			out = append(out, fmt.Sprintf("%s starts at %d", h.name(), h.n))
		case h.in.Current < h.lo:
			out = append(out, fmt.Sprintf("%s %d→%d regains its min_nodes", h.name(), h.in.Current, h.n))
		default:
			out = append(out, fmt.Sprintf("%s %d→%d gains %s", h.name(), h.in.Current, h.n, pct(x.gain)+a.assumedNote(h, h.in.Current, h.n)))
		}
	}
	return out, reclaim
}

// limitWhy says what keeps the fleet below max_nodes.
func (a *alloc) limitWhy(f *fstate) string {
	n, p := f.n, f.proj
	if n >= f.hi && f.capBy != "" {
		return ": " + a.capWhy(f)
	}
	if n >= f.hi {
		return ""
	}
	next := f.x(n+1)/f.x(n) - 1
	s := fmt.Sprintf(": a %s node would add %s", ordinal(n+1), pct(next)+a.assumedNote(f, n, n+1))
	free := a.pool
	for _, q := range a.order {
		free -= q.used
	}
	switch {
	case f.settling:
		s += fmt.Sprintf(", but it was resized %s ago (min_interval %s)", roundDur(a.in.Now.Sub(f.in.LastChange)), roundDur(a.p.MinInterval))
	case p.in.Budget.PerHour > 0 && p.perHour+f.price() > p.in.Budget.PerHour*(1+1e-9):
		s += fmt.Sprintf(", but project %s's allocation is at $%.2f/h of its $%.2f/h cap", p.in.Name, p.perHour, p.in.Budget.PerHour)
	case f.in.Budget.PerHour > 0 && float64(n+1)*f.price() > f.in.Budget.PerHour*(1+1e-9):
		s += fmt.Sprintf(", but it would cost more than its own $%.2f/h cap", f.in.Budget.PerHour)
	case p.used+f.g > p.ceiling():
		s += fmt.Sprintf(", but project %s holds its max_gpus (%d)", p.in.Name, p.ceiling())
		if w := a.weakest(f, true); w != "" {
			s += "; " + w
		}
	case free < f.g:
		s += fmt.Sprintf(", but the pool's %d GPUs are in use", a.pool)
		if w := a.weakest(f, false); w != "" {
			s += "; " + w
		}
	case next <= 0:
		s += ", so it is not worth a GPU"
	default:
		s += ", less than its resize costs"
	}
	return s
}

// weakest describes the node elsewhere that adds least per GPU among
// those f competes with: its own project's, and (unless ownOnly)
// borrowers'.
func (a *alloc) weakest(f *fstate, ownOnly bool) string {
	for _, h := range f.proj.fleets {
		if h != f && h.managed && h.settling && h.n > h.lo {
			return fmt.Sprintf("the GPUs stay with %s, resized %s ago (min_interval %s)", h.name(), roundDur(a.in.Now.Sub(h.in.LastChange)), roundDur(a.p.MinInterval))
		}
	}
	var best *fstate
	bv := math.Inf(1)
	for _, h := range a.fleets {
		if h == f || !h.managed || h.n <= h.lo || (h.proj != f.proj && (ownOnly || h.proj.used <= h.proj.quota())) {
			continue
		}
		v := h.weight * (a.u(h, h.n) - a.u(h, h.n-1)) / float64(max(h.g, 1))
		if v < bv {
			best, bv = h, v
		}
	}
	if best == nil {
		return ""
	}
	return fmt.Sprintf("the GPUs do more in %s, whose %s node adds %s", best.name(), ordinal(best.n), pct(best.x(best.n)/best.x(best.n-1)-1)+a.assumedNote(best, best.n-1, best.n))
}

func (a *alloc) capWhy(f *fstate) string {
	switch f.capBy {
	case "want":
		return fmt.Sprintf("its autoscaler wants %d", f.hi)
	case "capacity":
		return fmt.Sprintf("the clouds offer %d of its nodes now", f.hi)
	case "budget":
		return f.noGrow
	}
	return ""
}

// adds words the throughput the nodes (a, b] add over a ("add 3 %
// throughput").
func (a *alloc) adds(f *fstate, lo, hi int) string {
	verb := "add"
	if hi-lo == 1 {
		verb = "adds"
	}
	return fmt.Sprintf("%s %s throughput%s", verb, pct(f.x(hi)/f.x(lo)-1), a.assumedNote(f, lo, hi))
}

// assumedNote marks figures the fleet's curve did not measure: with no
// curve, where it cannot say (extrapolated here), and, for the
// autoscaler's model, sizes it predicts but never ran.
func (a *alloc) assumedNote(f *fstate, lo, hi int) string {
	if f.in.Curve == nil {
		return " (not measured yet: linear scaling assumed)"
	}
	predicted := false
	for _, n := range []int{lo, hi} {
		if n < 1 {
			continue
		}
		if _, ok := f.in.Curve.Throughput(n); !ok {
			return " (extrapolated: not measured at that size)"
		}
		if m, ok := f.in.Curve.(autoscale.Model); ok && !slices.Contains(m.Sizes, n) {
			predicted = true
		}
	}
	if predicted {
		return " (predicted by its scaling model)"
	}
	return ""
}

func (a *alloc) pausedWhy(f *fstate) string {
	s := f.name() + " is paused: `fleetd resume` brings it back"
	if b := f.in.Budget; b.State != "" && b.Reason != "" {
		s += " (its budget: " + b.Reason + ")"
	}
	return s
}

func (a *alloc) exhaustedWhy(f *fstate, b Budget, whose string) string {
	what := "pauses: it checkpoints, releases every node and keeps its checkpoints; `fleetd resume` or a raised budget brings it back"
	if b.OnExhausted == "stop" {
		what = "stops (on_exhausted = \"stop\"); its checkpoints are kept"
	}
	s := fmt.Sprintf("%s %s: %s budget is spent", f.name(), what, whose)
	if b.Reason != "" {
		s += " (" + b.Reason + ")"
	}
	return s
}

func (a *alloc) noProjectWhy(f *fstate) string {
	return fmt.Sprintf("%s holds %d node%s: its project %s no longer exists, so it keeps what it runs and grows no more; name an existing project in its spec", f.name(), f.n, plural(f.n), f.in.Project)
}

func (a *alloc) unlimitedWhy(f *fstate) string {
	why := fmt.Sprintf("project %s is not declared, so not limited", f.in.Project)
	if f.g == 0 {
		why = "a CPU-only fleet takes no GPUs from the pool"
	}
	s := fmt.Sprintf("%s runs %d node%s: %s", f.name(), f.n, plural(f.n), why)
	if f.capBy != "" {
		s += "; " + a.capWhy(f)
	}
	return s
}

// Removal orders a fleet's nodes by which to drain first: never the
// rank-0 node while another can go, on-demand before spot, the dearest
// first, the newest first (it has done the least work), then by id.
func Removal(nodes []Node) []Node {
	out := append([]Node(nil), nodes...)
	sort.SliceStable(out, func(i, j int) bool {
		x, y := out[i], out[j]
		switch {
		case x.Rank0 != y.Rank0:
			return y.Rank0
		case x.OnDemand != y.OnDemand:
			return x.OnDemand
		case x.PricePerHour != y.PricePerHour:
			return x.PricePerHour > y.PricePerHour
		case !x.Since.Equal(y.Since):
			return x.Since.After(y.Since)
		}
		return x.ID > y.ID
	})
	return out
}

func pick(nodes []Node, k int) []string {
	var out []string
	for _, n := range Removal(nodes) {
		if len(out) == k {
			break
		}
		out = append(out, n.ID)
	}
	return out
}

func removeAll(nodes []Node) []string { return pick(nodes, len(nodes)) }

func rank0(nodes []Node) string {
	for _, n := range nodes {
		if n.Rank0 {
			return n.ID
		}
	}
	return ""
}

// nodes names the nodes lo..hi (1-based): "its 5th node", "its 5th and
// 6th node", "its 3rd–6th nodes".
func nodes(lo, hi int) string {
	switch {
	case hi <= lo:
		return "its " + ordinal(lo) + " node"
	case hi == lo+1:
		return "its " + ordinal(lo) + " and " + ordinal(hi) + " node"
	}
	return "its " + ordinal(lo) + "–" + ordinal(hi) + " nodes"
}

func ordinal(n int) string {
	suf := "th"
	if n%100 < 11 || n%100 > 13 {
		switch n % 10 {
		case 1:
			suf = "st"
		case 2:
			suf = "nd"
		case 3:
			suf = "rd"
		}
	}
	return fmt.Sprintf("%d%s", n, suf)
}

func pct(v float64) string {
	if math.IsInf(v, 0) || math.IsNaN(v) {
		return "all its"
	}
	return fmt.Sprintf("%.0f %%", 100*v)
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
