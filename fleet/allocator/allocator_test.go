package allocator

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/autoscale"
	"github.com/fleetd/fleetd/fleet/budget"
)

var t0 = time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)

// table is a measured curve: throughput per node count.
type table map[int]float64

func (t table) Throughput(n int) (float64, bool) {
	v, ok := t[n]
	return v, ok
}

func linear(max int) table {
	t := table{}
	for n := 1; n <= max; n++ {
		t[n] = 100 * float64(n)
	}
	return t
}

// flat scales to 2 nodes and barely beyond.
func flat() table { return table{1: 100, 2: 190, 3: 195, 4: 197, 5: 198, 6: 199} }

func nodeList(prefix string, n int) []Node {
	var out []Node
	for i := 0; i < n; i++ {
		out = append(out, Node{ID: fmt.Sprintf("%s-%d", prefix, i), Rank0: i == 0, Since: t0.Add(time.Duration(i) * time.Minute)})
	}
	return out
}

func running(name, project string, cur, min, max int) Fleet {
	return Fleet{Name: name, Project: project, GPUsPerNode: 1, MinNodes: min, MaxNodes: max, Current: cur, Running: true, Nodes: nodeList(name, cur), Arrival: t0.Add(-time.Hour)}
}

func applied(name, project string, min, max int, at time.Time) Fleet {
	return Fleet{Name: name, Project: project, GPUsPerNode: 1, MinNodes: min, MaxNodes: max, Arrival: at}
}

func mustFleet(t *testing.T, d Decision, name string) Allocation {
	t.Helper()
	a, ok := d.Fleet(name)
	if !ok {
		t.Fatalf("no allocation for %s", name)
	}
	return a
}

func expect(t *testing.T, d Decision, name string, action Action, to int, kind string, reason ...string) Allocation {
	t.Helper()
	a := mustFleet(t, d, name)
	if a.Action != action || a.To != to || (kind != "" && a.Kind != kind) {
		t.Errorf("%s: %s %d→%d (%s), want %s to %d (%s): %s", name, a.Action, a.From, a.To, a.Kind, action, to, kind, a.Reason)
	}
	for _, r := range reason {
		if !strings.Contains(a.Reason, r) {
			t.Errorf("%s: reason %q lacks %q", name, a.Reason, r)
		}
	}
	return a
}

// after applies a decision: every running fleet now has its target.
func after(in Input, d Decision, now time.Time) Input {
	out := in
	out.Now = now
	out.Fleets = nil
	for _, f := range in.Fleets {
		a, _ := d.Fleet(f.Name)
		if a.Action == Run {
			if a.To != f.Current {
				f.LastChange = in.Now
			}
			f.Running = true
			f.Current = a.To
			var keep []Node
			gone := map[string]bool{}
			for _, id := range a.Remove {
				gone[id] = true
			}
			for _, n := range f.Nodes {
				if !gone[n.ID] {
					keep = append(keep, n)
				}
			}
			for len(keep) < a.To {
				keep = append(keep, Node{ID: fmt.Sprintf("%s-n%d", f.Name, len(keep)), Rank0: len(keep) == 0, Since: in.Now})
			}
			f.Nodes = keep
		}
		out.Fleets = append(out.Fleets, f)
	}
	return out
}

func drop(in Input, name string) Input {
	out := in
	out.Fleets = nil
	for _, f := range in.Fleets {
		if f.Name != name {
			out.Fleets = append(out.Fleets, f)
		}
	}
	return out
}

// TestIssueScenario is the projects issue's end-to-end scenario at the
// allocator: pool 4 GPUs; project a (quota 2, max 4) runs an elastic
// fleet at 4 nodes of 1 GPU; project b (quota 2) applies a fleet of min 2.
func TestIssueScenario(t *testing.T) {
	projects := []Project{{Name: "a", QuotaGPUs: 2, MaxGPUs: 4}, {Name: "b", QuotaGPUs: 2, MaxGPUs: 2}}
	in := Input{Now: t0, PoolGPUs: 4, Projects: projects, Fleets: []Fleet{running("elastic", "a", 4, 1, 4)}}
	in.Fleets[0].Change.InProcess = true

	d := Decide(in)
	expect(t, d, "elastic", Run, 4, "hold", "a/elastic holds 4 nodes (max_nodes)")
	if u := d.Projects[0]; u.BorrowedGPUs != 2 || d.Projects[1].LentGPUs != 2 {
		t.Errorf("borrowing: %+v", d.Projects)
	}

	// b applies a fleet of min 2: a shrinks to its quota, keeping rank 0.
	in.Now = t0.Add(time.Minute)
	in.Fleets = append(in.Fleets, applied("first", "b", 2, 2, in.Now))
	d = Decide(in)
	a := expect(t, d, "elastic", Run, 2, "reclaim", "a/elastic 4→2: its 3rd and 4th node add 100 % throughput",
		"project b takes back the GPUs of its quota that project a borrowed (b/first starts at 2)", "keeps elastic-0, rank 0")
	if len(a.Remove) != 2 || a.Remove[0] != "elastic-3" || a.Remove[1] != "elastic-2" {
		t.Errorf("removes %v, want the newest non-rank-0 nodes elastic-3, elastic-2", a.Remove)
	}
	expect(t, d, "first", Run, 2, "start", "b/first starts at 2 nodes: its min_nodes fit project b's quota")
	if d.UsedGPUs != 4 {
		t.Errorf("used %d GPUs of 4", d.UsedGPUs)
	}

	// A second fleet of b while the first runs waits in the queue.
	in = after(in, d, t0.Add(2*time.Minute))
	in.Fleets = append(in.Fleets, applied("second", "b", 2, 2, in.Now))
	d = Decide(in)
	expect(t, d, "elastic", Run, 2, "hold")
	expect(t, d, "first", Run, 2, "hold")
	expect(t, d, "second", Queue, 0, "queued", "b/second waits, 1 of 1 in the queue: its min_nodes need 2 GPUs; project b has 0 of its 2-GPU quota free (b/first holds 2 at its min_nodes)")
	if len(d.Queue) != 1 || d.Queue[0].Position != 1 || d.Queue[0].Fleet != "second" {
		t.Errorf("queue %+v", d.Queue)
	}

	// The first finishes: the second starts, a stays at its quota.
	in = drop(after(in, d, t0.Add(time.Hour)), "first")
	d = Decide(in)
	expect(t, d, "second", Run, 2, "start")
	expect(t, d, "elastic", Run, 2, "hold", "but the pool's 4 GPUs are in use")

	// b finishes entirely: a grows back to 4.
	in = drop(after(in, d, t0.Add(2*time.Hour)), "second")
	d = Decide(in)
	expect(t, d, "elastic", Run, 4, "grow", "a/elastic 2→4: its 3rd and 4th node add 100 % throughput (not measured yet: linear scaling assumed) (project a borrows 2 GPUs beyond its 2-GPU quota, up to its max_gpus 4)")
}

// TestGoesToTheLinearFleet: two fleets in one quota, one scaling
// linearly and one flat after 2 nodes: the linear one gets the GPUs.
func TestGoesToTheLinearFleet(t *testing.T) {
	lin, fl := running("lin", "p", 3, 1, 4), running("flat", "p", 3, 1, 4)
	lin.Curve, fl.Curve = linear(4), flat()
	in := Input{Now: t0, Projects: []Project{{Name: "p", QuotaGPUs: 6, MaxGPUs: 6}}, Fleets: []Fleet{lin, fl}}
	d := Decide(in)
	expect(t, d, "lin", Run, 4, "grow", "p/lin 3→4: its 4th node adds 33 % throughput")
	expect(t, d, "flat", Run, 2, "shrink", "p/flat 3→2: its 3rd node adds 3 % throughput; p/lin 3→4 gains 33 %")

	// Settled, it holds, and says why the flat one gets no more.
	in = after(in, d, t0.Add(time.Hour))
	d = Decide(in)
	expect(t, d, "lin", Run, 4, "hold", "(max_nodes)")
	expect(t, d, "flat", Run, 2, "hold", "p/flat holds 2 nodes: a 3rd node would add 3 %, but project p holds its max_gpus (6); the GPUs do more in p/lin, whose 4th node adds 33 %")

	// Both new: the same split, from the start.
	in = Input{Now: t0, Projects: in.Projects, Fleets: []Fleet{applied("lin", "p", 1, 4, t0), applied("flat", "p", 1, 4, t0)}}
	in.Fleets[0].Curve, in.Fleets[1].Curve = linear(4), flat()
	d = Decide(in)
	expect(t, d, "lin", Run, 4, "start", "its 2nd–4th nodes add 300 % throughput")
	expect(t, d, "flat", Run, 2, "start", "its 2nd node adds 90 % throughput")
}

// noisy is what the daemon would fit from measurements of c with noise
// of up to ±amp: three minute-long rounds at each measured size, fitted
// by the autoscaler's model.
func noisy(c table, r *rand.Rand, amp float64) Curve {
	var pts []autoscale.Point
	for n, v := range c {
		for range 3 {
			pts = append(pts, autoscale.Point{Nodes: n, Rate: v * (1 + amp*(2*r.Float64()-1)), Seconds: 60})
		}
	}
	return CurveFromPoints(pts)
}

// TestNoThrash: with throughput noise of a few percent, an allocation
// that has settled (a few passes, at most one change each fleet) does
// not move.
func TestNoThrash(t *testing.T) {
	tests := []struct {
		name   string
		curves []table
		cur    []int
		amp    float64
	}{
		{"two linear fleets", []table{linear(4), linear(4)}, []int{3, 3}, 0.05},
		{"linear and flat", []table{linear(4), flat()}, []int{4, 2}, 0.05},
		{"two flat fleets", []table{flat(), flat()}, []int{3, 3}, 0.03},
		{"three linear fleets", []table{linear(6), linear(6), linear(6)}, []int{2, 2, 2}, 0.05},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			in := Input{Now: t0, Projects: []Project{{Name: "p", QuotaGPUs: 6, MaxGPUs: 6}}}
			for i, c := range tc.cur {
				in.Fleets = append(in.Fleets, running(fmt.Sprintf("f%d", i), "p", c, 1, 6))
			}
			changes, warm := 0, map[string]int{}
			for pass := 0; pass < 205; pass++ {
				for i := range in.Fleets {
					in.Fleets[i].Curve = noisy(tc.curves[i], r, tc.amp)
				}
				d := Decide(in)
				for _, a := range d.Fleets {
					switch {
					case a.To == a.From:
					case pass < 5:
						warm[a.Fleet]++
						if warm[a.Fleet] > 1 {
							t.Errorf("settling, %s changed twice: %s", a.Fleet, a.Reason)
						}
					default:
						changes++
						t.Logf("pass %d: %s", pass, a.Reason)
					}
				}
				in = after(in, d, in.Now.Add(time.Minute))
			}
			if changes > 0 {
				t.Errorf("%d changes in 200 passes of noise", changes)
			}
		})
	}
}

// TestChangeCost: a restart that loads a big checkpoint is not worth a
// small gain; the same gain moves an in-process fleet.
func TestChangeCost(t *testing.T) {
	// a holds 3 nodes whose 3rd adds 40 %; b, at 1, would gain 90 % from
	// a 2nd (and little from a 3rd).
	ca := table{1: 100, 2: 150, 3: 210}
	cb := table{1: 100, 2: 190, 3: 200}
	tests := []struct {
		name   string
		change Change
		aTo    int
	}{
		{"in-process: moves", Change{InProcess: true}, 2},
		{"restart with a 2 TB checkpoint: holds", Change{CheckpointGB: 2000}, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, b := running("a", "p", 3, 1, 3), running("b", "p", 1, 1, 3)
			a.Curve, b.Curve = ca, cb
			a.Change, b.Change = tc.change, tc.change
			// Under the geometric mean (Fairness 1), where gains are relative.
			d := Decide(Input{Now: t0, Projects: []Project{{Name: "p", QuotaGPUs: 4, MaxGPUs: 4}}, Fleets: []Fleet{a, b}, Params: Params{Fairness: 1}})
			expect(t, d, "a", Run, tc.aTo, "")
		})
	}
}

// TestMinInterval: a fleet resized a minute ago keeps its nodes against
// its own project's fleets.
func TestMinInterval(t *testing.T) {
	a, b := running("a", "p", 2, 1, 3), running("b", "p", 1, 1, 3)
	a.Curve, b.Curve = table{1: 100, 2: 130, 3: 135}, linear(3)
	a.LastChange = t0.Add(-time.Minute)
	in := Input{Now: t0, Projects: []Project{{Name: "p", QuotaGPUs: 3, MaxGPUs: 3}}, Fleets: []Fleet{a, b}}
	d := Decide(in)
	expect(t, d, "a", Run, 2, "hold")
	expect(t, d, "b", Run, 1, "hold", "the GPUs stay with p/a, resized 1m ago (min_interval 5m)")
	in.Fleets[0].LastChange = t0.Add(-time.Hour)
	d = Decide(in)
	expect(t, d, "b", Run, 2, "grow")
	expect(t, d, "a", Run, 1, "shrink", "p/a 2→1: its 2nd node adds 30 % throughput; p/b 1→2 gains 100 %")
}

func TestBudgets(t *testing.T) {
	priced := func(f Fleet, price float64) Fleet {
		f.PricePerNodeHour = price
		return f
	}
	tests := []struct {
		name    string
		project Project
		fleets  []Fleet
		want    map[string]Allocation // Action, To, Kind; Reason: substring
		remove  map[string][]string
	}{
		{
			name:    "per_hour cap: grows only while the allocation stays within it",
			project: Project{Name: "p", QuotaGPUs: 8, MaxGPUs: 8, Budget: Budget{PerHour: 10}},
			fleets:  []Fleet{priced(running("f", "p", 4, 1, 8), 2)},
			want:    map[string]Allocation{"f": {Action: Run, To: 5, Kind: "grow", Reason: "[ranked per dollar: project p's $10.00/h budget is the limit]"}},
		},
		{
			name:    "capped: no node is added, none taken",
			project: Project{Name: "p", QuotaGPUs: 8, MaxGPUs: 8, Budget: Budget{State: budget.Capped, PerHour: 10, Reason: "burns $10.00/h, at its $10.00/h cap: no nodes are added"}},
			fleets:  []Fleet{priced(running("f", "p", 4, 1, 8), 2.5), priced(applied("g", "p", 1, 2, t0), 1)},
			want: map[string]Allocation{
				"f": {Action: Run, To: 4, Kind: "hold", Reason: "p/f holds 4 nodes: project p's budget burns $10.00/h, at its $10.00/h cap: no nodes are added"},
				"g": {Action: Queue, To: 0, Kind: "queued", Reason: "budget: project p's budget burns"},
			},
		},
		{
			name:    "project total spent: pause, every node released, rank 0 last",
			project: Project{Name: "p", QuotaGPUs: 8, MaxGPUs: 8, Budget: Budget{State: budget.Exhausted, OnExhausted: budget.Pause, Reason: "spent $5000.00 of its $5000.00 total: pause"}},
			fleets:  []Fleet{priced(running("f", "p", 3, 1, 8), 2)},
			want:    map[string]Allocation{"f": {Action: Pause, To: 0, Kind: "budget-exhausted", Reason: "p/f pauses: it checkpoints, releases every node and keeps its checkpoints; `fleetd resume` or a raised budget brings it back: project p's budget is spent (spent $5000.00"}},
			remove:  map[string][]string{"f": {"f-2", "f-1", "f-0"}},
		},
		{
			name:    "fleet total spent with on_exhausted = stop",
			project: Project{Name: "p", QuotaGPUs: 8, MaxGPUs: 8},
			fleets: []Fleet{func() Fleet {
				f := priced(running("f", "p", 2, 1, 8), 2)
				f.Budget = Budget{State: budget.Exhausted, OnExhausted: budget.Stop}
				return f
			}(), priced(running("g", "p", 2, 1, 2), 2)},
			want: map[string]Allocation{
				"f": {Action: Stop, To: 0, Kind: "budget-exhausted", Reason: "p/f stops (on_exhausted = \"stop\"); its checkpoints are kept: its budget is spent"},
				"g": {Action: Run, To: 2, Kind: "hold"},
			},
		},
		{
			name:    "a paused fleet stays paused",
			project: Project{Name: "p", QuotaGPUs: 8, MaxGPUs: 8},
			fleets:  []Fleet{func() Fleet { f := applied("f", "p", 1, 2, t0); f.Paused = true; return f }()},
			want:    map[string]Allocation{"f": {Action: Paused, To: 0, Kind: "paused", Reason: "`fleetd resume` brings it back"}},
		},
		{
			name:    "paused by a budget that was raised: it starts again",
			project: Project{Name: "p", QuotaGPUs: 8, MaxGPUs: 8, Budget: Budget{State: budget.Warn}},
			fleets: []Fleet{
				func() Fleet { f := applied("f", "p", 1, 2, t0); f.Paused, f.PausedByBudget = true, true; return f }(),
				func() Fleet { f := applied("g", "p", 1, 2, t0); f.Paused = true; return f }(),
			},
			want: map[string]Allocation{
				"f": {Action: Run, To: 2, Kind: "start", Reason: "(resumes: its budget is no longer spent)"},
				"g": {Action: Paused, To: 0, Kind: "paused"},
			},
		},
		{
			name:    "paused by a budget still spent: stays paused",
			project: Project{Name: "p", QuotaGPUs: 8, MaxGPUs: 8, Budget: Budget{State: budget.Exhausted}},
			fleets:  []Fleet{func() Fleet { f := applied("f", "p", 1, 2, t0); f.Paused, f.PausedByBudget = true, true; return f }()},
			want:    map[string]Allocation{"f": {Action: Paused, To: 0, Kind: "paused"}},
		},
		{
			name:    "per dollar: the cheap fleet gets the budget's last dollars",
			project: Project{Name: "p", QuotaGPUs: 8, MaxGPUs: 8, Budget: Budget{PerHour: 6}},
			fleets: []Fleet{
				func() Fleet {
					f := priced(applied("cheap", "p", 1, 4, t0), 1)
					f.Curve = table{1: 100, 2: 180, 3: 260, 4: 340}
					return f
				}(),
				func() Fleet { f := priced(applied("dear", "p", 1, 4, t0), 3); f.Curve = linear(4); return f }(),
			},
			want: map[string]Allocation{
				"cheap": {Action: Run, To: 3, Kind: "start", Reason: "ranked per dollar"},
				"dear":  {Action: Run, To: 1, Kind: "start", Reason: "but project p's allocation is at $6.00/h of its $6.00/h cap"},
			},
		},
		{
			name:    "per_hour blocks a start",
			project: Project{Name: "p", QuotaGPUs: 8, MaxGPUs: 8, Budget: Budget{PerHour: 5}},
			fleets:  []Fleet{priced(running("f", "p", 2, 1, 2), 2), priced(applied("g", "p", 1, 1, t0), 2)},
			want: map[string]Allocation{
				"g": {Action: Queue, Kind: "queued", Reason: "budget: its min_nodes would add $2.00/h to project p's $4.00/h, above its $5.00/h cap"},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(Input{Now: t0, Projects: []Project{tc.project}, Fleets: tc.fleets})
			for name, w := range tc.want {
				a := expect(t, d, name, w.Action, w.To, w.Kind, w.Reason)
				if r, ok := tc.remove[name]; ok && strings.Join(a.Remove, ",") != strings.Join(r, ",") {
					t.Errorf("%s removes %v, want %v", name, a.Remove, r)
				}
			}
		})
	}
}

// TestQueueOrder: priority, then arrival; aging lifts a long wait; a
// fleet that waited past ReserveAfter keeps its place against backfill.
func TestQueueOrder(t *testing.T) {
	hold := running("big", "p", 4, 4, 4) // fills the quota
	tests := []struct {
		name   string
		now    time.Time
		fleets []Fleet
		order  []string
		start  []string
		// waits: a queued fleet's reason must contain this.
		waits map[string]string
	}{
		{
			name: "priority, then arrival",
			now:  t0,
			fleets: []Fleet{hold,
				applied("late", "p", 2, 2, t0.Add(-time.Minute)),
				applied("early", "p", 2, 2, t0.Add(-2*time.Minute)),
				func() Fleet { f := applied("urgent", "p", 2, 2, t0); f.Priority = 5; return f }(),
			},
			order: []string{"urgent", "early", "late"},
		},
		{
			name: "aging: an hour's wait outranks priority 5",
			now:  t0,
			fleets: []Fleet{hold,
				applied("old", "p", 2, 2, t0.Add(-time.Hour)),
				func() Fleet { f := applied("urgent", "p", 2, 2, t0); f.Priority = 5; return f }(),
			},
			order: []string{"old", "urgent"},
		},
		{
			name: "reserved: a small fleet does not start past one waiting 40 minutes",
			now:  t0,
			fleets: []Fleet{running("small-run", "p", 2, 2, 2),
				applied("huge", "p", 4, 4, t0.Add(-40*time.Minute)),
				applied("small", "p", 1, 1, t0),
			},
			order: []string{"huge", "small"},
			waits: map[string]string{"small": "p/huge waits ahead of it for 40m (a fleet waiting over 30m keeps its place)"},
		},
		{
			name: "backfill before that",
			now:  t0,
			fleets: []Fleet{running("small-run", "p", 2, 2, 2),
				applied("huge", "p", 4, 4, t0.Add(-5*time.Minute)),
				applied("small", "p", 1, 1, t0),
			},
			order: []string{"huge"},
			start: []string{"small"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(Input{Now: tc.now, Projects: []Project{{Name: "p", QuotaGPUs: 4, MaxGPUs: 4}}, Fleets: tc.fleets})
			var got []string
			for i, e := range d.Queue {
				got = append(got, e.Fleet)
				if e.Position != i+1 {
					t.Errorf("%s at position %d, index %d", e.Fleet, e.Position, i)
				}
			}
			if strings.Join(got, ",") != strings.Join(tc.order, ",") {
				t.Errorf("queue %v, want %v", got, tc.order)
			}
			for _, s := range tc.start {
				expect(t, d, s, Run, 1, "start")
			}
			for name, why := range tc.waits {
				expect(t, d, name, Queue, 0, "queued", why)
			}
			for _, e := range d.Queue {
				if want := e.Waiting >= DefaultReserveAfter; e.Reserved != want {
					t.Errorf("%s reserved=%v after %s", e.Fleet, e.Reserved, e.Waiting)
				}
			}
		})
	}
}

func TestProjectsEdgeCases(t *testing.T) {
	t.Run("an undeclared default project is not limited", func(t *testing.T) {
		d := Decide(Input{Now: t0, PoolGPUs: 2, Projects: []Project{{Name: "default", Unlimited: true}, {Name: "p", QuotaGPUs: 2, MaxGPUs: 2}},
			Fleets: []Fleet{running("free", "default", 2, 1, 8), func() Fleet { f := running("w", "default", 3, 1, 8); f.Want = 5; return f }()}})
		expect(t, d, "free", Run, 8, "unlimited", "project default is not declared, so not limited")
		expect(t, d, "w", Run, 5, "unlimited", "its autoscaler wants 5")
		if d.UsedGPUs != 0 {
			t.Errorf("the pool counts %d GPUs of unlimited fleets", d.UsedGPUs)
		}
	})
	t.Run("a deleted project's fleet keeps what it runs; a new one waits", func(t *testing.T) {
		d := Decide(Input{Now: t0, Projects: []Project{{Name: "p", QuotaGPUs: 4, MaxGPUs: 4}},
			Fleets: []Fleet{running("orphan", "gone", 2, 1, 8), applied("new", "gone", 1, 1, t0), applied("ok", "p", 1, 4, t0)}})
		expect(t, d, "orphan", Run, 2, "no-project", "its project gone no longer exists")
		expect(t, d, "new", Queue, 0, "no-project", "project gone does not exist")
		expect(t, d, "ok", Run, 2, "start")
	})
	t.Run("capacity caps growth", func(t *testing.T) {
		f := running("f", "p", 2, 1, 8)
		f.CapacityNodes = 3
		d := Decide(Input{Now: t0, Projects: []Project{{Name: "p", QuotaGPUs: 8, MaxGPUs: 8}}, Fleets: []Fleet{f}})
		expect(t, d, "f", Run, 3, "grow", "the clouds offer 3 of its nodes now")
	})
	t.Run("the autoscaler wants fewer", func(t *testing.T) {
		f := running("f", "p", 6, 1, 8)
		f.Want = 4
		d := Decide(Input{Now: t0, Projects: []Project{{Name: "p", QuotaGPUs: 8, MaxGPUs: 8}}, Fleets: []Fleet{f}})
		expect(t, d, "f", Run, 4, "shrink", "p/f 6→4: its autoscaler wants 4; its 5th and 6th node add 50 % throughput")
	})
	t.Run("a smaller pool or ceiling shrinks what runs", func(t *testing.T) {
		d := Decide(Input{Now: t0, PoolGPUs: 3, Projects: []Project{{Name: "p", QuotaGPUs: 3, MaxGPUs: 8}}, Fleets: []Fleet{running("f", "p", 5, 1, 8)}})
		expect(t, d, "f", Run, 3, "shrink", "p/f 5→3: its 4th and 5th node add 67 % throughput (not measured yet: linear scaling assumed); the pool (3 GPUs) is smaller than what runs")
		d = Decide(Input{Now: t0, PoolGPUs: 8, Projects: []Project{{Name: "p", QuotaGPUs: 2, MaxGPUs: 4}}, Fleets: []Fleet{running("f", "p", 5, 1, 8)}})
		expect(t, d, "f", Run, 4, "shrink", "project p may hold 4 GPUs (max_gpus), less than it ran")
	})
	t.Run("interrupted below min_nodes gets its min back first", func(t *testing.T) {
		d := Decide(Input{Now: t0, Projects: []Project{{Name: "p", QuotaGPUs: 4, MaxGPUs: 4}},
			Fleets: []Fleet{running("hurt", "p", 1, 2, 2), running("other", "p", 2, 1, 4)}})
		expect(t, d, "hurt", Run, 2, "grow", "back to its min_nodes (2)")
		expect(t, d, "other", Run, 2, "hold")
	})
	t.Run("min_nodes beyond the quota start only on unreserved GPUs", func(t *testing.T) {
		projects := []Project{{Name: "a", QuotaGPUs: 2, MaxGPUs: 6}, {Name: "b", QuotaGPUs: 2, MaxGPUs: 2}}
		fleets := []Fleet{running("one", "a", 2, 2, 2), applied("two", "a", 2, 2, t0)}
		d := Decide(Input{Now: t0, PoolGPUs: 4, Projects: projects, Fleets: fleets})
		expect(t, d, "two", Queue, 0, "queued", "min_nodes are never borrowed")
		d = Decide(Input{Now: t0, PoolGPUs: 6, Projects: projects, Fleets: fleets})
		expect(t, d, "two", Run, 2, "start", "its min_nodes fit GPUs outside every quota")
	})
}

func TestPriorityWeightsBorrowing(t *testing.T) {
	// Two projects borrow the pool's spare GPUs; the higher priority one
	// gets them at equal scaling.
	projects := []Project{{Name: "hi", QuotaGPUs: 1, MaxGPUs: 4, Priority: 10}, {Name: "lo", QuotaGPUs: 1, MaxGPUs: 4}}
	d := Decide(Input{Now: t0, PoolGPUs: 4, Projects: projects, Fleets: []Fleet{applied("x", "hi", 1, 3, t0), applied("y", "lo", 1, 3, t0)}})
	expect(t, d, "x", Run, 3, "start")
	expect(t, d, "y", Run, 1, "start")
}

func TestRemoval(t *testing.T) {
	nodes := []Node{
		{ID: "master", Rank0: true, PricePerHour: 9},
		{ID: "spot-old", PricePerHour: 1, Since: t0},
		{ID: "spot-new", PricePerHour: 1, Since: t0.Add(time.Hour)},
		{ID: "dear", PricePerHour: 3, Since: t0},
		{ID: "od", OnDemand: true, PricePerHour: 2, Since: t0},
	}
	var got []string
	for _, n := range Removal(nodes) {
		got = append(got, n.ID)
	}
	if want := "od,dear,spot-new,spot-old,master"; strings.Join(got, ",") != want {
		t.Errorf("order %v, want %s", got, want)
	}
}

func TestCurveFromPointsAndJSON(t *testing.T) {
	if CurveFromPoints(nil) != nil {
		t.Error("a curve without points")
	}
	c := CurveFromPoints([]autoscale.Point{{Nodes: 1, Rate: 100, Seconds: 60}, {Nodes: 2, Rate: 150, Seconds: 60}})
	f := running("f", "p", 2, 1, 3)
	f.Curve = c
	g := running("g", "p", 1, 1, 3)
	g.Curve = linear(3)
	d := Decide(Input{Now: t0, Projects: []Project{{Name: "p", QuotaGPUs: 5, MaxGPUs: 5}}, Fleets: []Fleet{f, g}})
	// f's 3rd node would add 20 % (the model's), g's 2nd and 3rd 200 %.
	expect(t, d, "g", Run, 3, "grow")
	expect(t, d, "f", Run, 2, "hold", "a 3rd node would add 20 % (predicted by its scaling model)")
	b, err := json.Marshal(d)
	if err != nil || !strings.Contains(string(b), `"kind":"grow"`) {
		t.Errorf("json %s %v", b, err)
	}
}

// TestPure: the same input gives the same decision, and the input is
// left as it was.
func TestPure(t *testing.T) {
	in := Input{Now: t0, PoolGPUs: 6, Projects: []Project{{Name: "a", QuotaGPUs: 3, MaxGPUs: 6}, {Name: "b", QuotaGPUs: 3, MaxGPUs: 6}},
		Fleets: []Fleet{running("x", "a", 4, 1, 6), running("y", "b", 2, 1, 6), applied("z", "b", 2, 2, t0), applied("w", "a", 3, 3, t0)}}
	in.Fleets[0].Curve, in.Fleets[1].Curve = flat(), linear(6)
	before, _ := json.Marshal(in)
	d1, d2 := Decide(in), Decide(in)
	after, _ := json.Marshal(in)
	if string(before) != string(after) {
		t.Errorf("Decide changed its input")
	}
	j1, _ := json.Marshal(d1)
	j2, _ := json.Marshal(d2)
	if string(j1) != string(j2) {
		t.Errorf("two decisions differ:\n%s\n%s", j1, j2)
	}
}

// TestFairnessPower pins the utility the fill maximizes on a linear
// fleet and one that gains 70 % from a 2nd node and nothing after, 5
// GPUs: total work (p = 1) gives the linear one every GPU it can use;
// the geometric mean (the default) and Pollux's p = −1 give the other
// its 2nd node, worth more to it (+70 %) than the linear fleet's 4th
// (+33 %) is to the linear one. In every case the flat fleet gets
// nothing past what it can use.
func TestFairnessPower(t *testing.T) {
	tests := []struct {
		name            string
		power           float64
		linTo, sublinTo int
	}{
		{"total work (p = 1, default)", 1, 4, 1},
		{"geometric mean", 0, 3, 2},
		{"Pollux (p = -1)", -1, 3, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := Input{Now: t0, Projects: []Project{{Name: "p", QuotaGPUs: 5, MaxGPUs: 5}}, Params: Params{Fairness: 1 - tc.power},
				Fleets: []Fleet{applied("lin", "p", 1, 4, t0), applied("sub", "p", 1, 4, t0)}}
			in.Fleets[0].Curve, in.Fleets[1].Curve = linear(4), table{1: 100, 2: 170, 3: 171, 4: 172}
			d := Decide(in)
			expect(t, d, "lin", Run, tc.linTo, "start")
			expect(t, d, "sub", Run, tc.sublinTo, "start")
		})
	}
}

// TestResizedOftenHolds: a resize's stall is spread over the time the
// fleet is expected to hold its new size, the Horizon or its own mean
// time between resizes when shorter (Pollux's restart penalty). a's 3rd
// node adds 13 %, b's 2nd would add 30 %: between fleets resized once in
// the hour the node moves; between fleets resized every five minutes
// (12 in the hour: (1 h + the 30-minute prior) / 13 ≈ 7 minutes per
// size) the 1-minute stall costs each a seventh of its work, and it
// stays.
func TestResizedOftenHolds(t *testing.T) {
	tests := []struct {
		name    string
		resizes int
		aTo     int
	}{
		{"resized once in the hour: moves", 1, 2},
		{"resized every 5 minutes: holds", 12, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, b := running("a", "p", 3, 1, 3), running("b", "p", 1, 1, 3)
			a.Curve, b.Curve = table{1: 100, 2: 150, 3: 170}, table{1: 100, 2: 130, 3: 131}
			a.Resizes, b.Resizes = tc.resizes, tc.resizes
			// Under the geometric mean (Fairness 1), where gains are relative.
			d := Decide(Input{Now: t0, Projects: []Project{{Name: "p", QuotaGPUs: 4, MaxGPUs: 4}}, Fleets: []Fleet{a, b}, Params: Params{Fairness: 1}})
			expect(t, d, "a", Run, tc.aTo, "")
			expect(t, d, "b", Run, 4-tc.aTo, "")
		})
	}
}

// TestShortJobBehindALongOne drives two linear fleets in virtual time
// (a pass a minute): a long one holds the whole pool of 8 when a short
// one, an eighth of its work, arrives. Maximizing total work leaves the
// newcomer its min_nodes (every GPU adds the same to either); the
// geometric mean gives it its share at once, so it ends far sooner and
// the long one no later (the pool's work is the same): the average
// completion time falls.
func TestShortJobBehindALongOne(t *testing.T) {
	run := func(power float64) (short, long time.Duration) {
		in := Input{Now: t0, PoolGPUs: 8, Projects: []Project{{Name: "p", QuotaGPUs: 8, MaxGPUs: 8}}, Params: Params{Fairness: 1 - power}}
		lf := running("long", "p", 8, 1, 8)
		lf.Arrival, lf.Curve = t0.Add(-time.Hour), linear(8)
		sf := applied("short", "p", 1, 8, t0)
		sf.Curve = linear(8)
		in.Fleets = []Fleet{lf, sf}
		work := map[string]float64{"long": 100 * 8 * 3600, "short": 100 * 8 * 3600 / 8}
		ended := map[string]time.Duration{}
		for pass := 0; pass < 24*60 && len(in.Fleets) > 0; pass++ {
			d := Decide(in)
			moved := after(in, d, in.Now.Add(time.Minute))
			next := moved
			next.Fleets = nil
			for _, f := range moved.Fleets {
				if f.Current != mustFleet(t, d, f.Name).From && f.Running {
					f.Resizes++
				}
				x, _ := f.Curve.Throughput(f.Current)
				if f.Current > 0 && f.Running {
					work[f.Name] -= x * 60
				}
				if work[f.Name] <= 0 {
					ended[f.Name] = in.Now.Add(time.Minute).Sub(f.Arrival)
					continue
				}
				next.Fleets = append(next.Fleets, f)
			}
			in = next
		}
		return ended["short"], ended["long"]
	}
	s1, l1 := run(1)
	s0, l0 := run(0)
	t.Logf("total work: short %s, long %s; geometric mean: short %s, long %s", s1, l1, s0, l0)
	if s0 == 0 || l0 == 0 || s1 == 0 || l1 == 0 {
		t.Fatalf("unfinished: %s %s %s %s", s1, l1, s0, l0)
	}
	if !(s0 < s1*2/3) {
		t.Errorf("short job: %s with the geometric mean, %s with total work: want it far sooner", s0, s1)
	}
	if !(s0+l0 < s1+l1) {
		t.Errorf("sum of completion times: %s with the geometric mean, %s with total work", s0+l0, s1+l1)
	}
}

func TestAlignedSizes(t *testing.T) {
	for _, c := range []struct {
		per, most int
		want      []int
	}{
		{4, 16, []int{1, 2, 4, 8, 12, 16}},
		{4, 3, []int{1, 2}},
		{8, 20, []int{1, 2, 4, 8, 16}},
		{6, 12, []int{1, 2, 4, 6, 12}},
		{1, 3, []int{1, 2, 3}},
	} {
		if got := AlignedSizes(c.per, c.most); !slices.Equal(got, c.want) {
			t.Errorf("AlignedSizes(%d, %d) = %v, want %v", c.per, c.most, got, c.want)
		}
	}
}

// TestSizesAreKept: a linear fleet allowed 1, 2, 4 or 8 nodes in a pool
// of 7 GPUs gets 4, not 7; a second fleet takes the rest.
func TestSizesAreKept(t *testing.T) {
	in := Input{Now: t0, PoolGPUs: 7, Projects: []Project{{Name: "p", QuotaGPUs: 7, MaxGPUs: 7}},
		Fleets: []Fleet{
			{Name: "a", Project: "p", GPUsPerNode: 1, MinNodes: 1, MaxNodes: 8, Arrival: t0, Sizes: []int{1, 2, 4, 8}},
			{Name: "b", Project: "p", GPUsPerNode: 1, MinNodes: 1, MaxNodes: 8, Arrival: t0.Add(time.Second), Sizes: []int{1, 2, 4, 8}},
		}}
	dec := Decide(in)
	for _, f := range dec.Fleets {
		if !slices.Contains([]int{1, 2, 4, 8}, f.To) {
			t.Errorf("%s given %d nodes, outside its sizes", f.Fleet, f.To)
		}
	}
	if dec.UsedGPUs > 7 {
		t.Errorf("used %d GPUs of 7", dec.UsedGPUs)
	}
}

// TestNoiseScaleMakesGoodput: two fleets with the same linear throughput;
// one reports a gradient noise scale far below its batch (a larger batch
// adds little statistical progress), the other one far above it (every
// sample counts): the GPUs go to the second. Without reports both are
// throughput alone.
func TestNoiseScaleMakesGoodput(t *testing.T) {
	small, large := running("small", "p", 2, 1, 6), running("large", "p", 2, 1, 6)
	// 256 samples per node at 2 nodes (batch 512).
	small.Curve = GoodputCurve(linear(6), 100, 512, 2)
	large.Curve = GoodputCurve(linear(6), 1e6, 512, 2)
	in := Input{Now: t0, Projects: []Project{{Name: "p", QuotaGPUs: 6, MaxGPUs: 6}}, Fleets: []Fleet{small, large}}
	d := Decide(in)
	if s, l := mustFleet(t, d, "small"), mustFleet(t, d, "large"); s.To >= l.To || s.To+l.To != 6 {
		t.Errorf("small noise scale %d nodes, large %d; want the large one more of the 6", s.To, l.To)
	}
	g := GoodputCurve(linear(6), 100, 512, 2)
	x1, _ := g.Throughput(1)
	x4, _ := g.Throughput(4)
	// (100 + 256) / (100 + 4·256) of 400.
	if x1 != 100 || math.Abs(x4-400*356.0/1124) > 1e-9 {
		t.Errorf("goodput at 1 and 4 nodes: %g, %g", x1, x4)
	}
	if c := GoodputCurve(linear(6), 0, 512, 2); !reflect.DeepEqual(c, linear(6)) {
		t.Errorf("without a noise scale the curve changed: %v", c)
	}
}
