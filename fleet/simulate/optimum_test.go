package simulate

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/fleetd/fleetd/providers/sim"
)

// randomMarket builds a market of zones with random availability and
// per-tick prices on a 10-minute grid.
func randomMarket(t *testing.T, rng *rand.Rand, zones, ticks int) *sim.Market {
	t.Helper()
	start := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	tr := &sim.Trace{Name: "random", Start: start}
	for z := range zones {
		s := &sim.Series{Key: fmt.Sprintf("z%d", z), Meta: sim.Meta{Zone: fmt.Sprintf("zone-%d", z), Region: "r"},
			Start: start, Tick: 10 * time.Minute}
		up := rng.Float64() < 0.5
		for range ticks {
			if rng.Float64() < 0.3 {
				up = !up
			}
			v := int32(0)
			if up {
				v = 1
			}
			s.Avail = append(s.Avail, v)
			s.Price = append(s.Price, 0.5+rng.Float64())
		}
		tr.Series = append(tr.Series, s)
	}
	tr.End = tr.Series[0].End()
	m, err := sim.NewMarket(tr, sim.Config{Trace: "random", Instance: sim.Instance{OnDemandPrice: 3}})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// randomCase draws a small random market, a job whose deadline leaves up
// to 3 h of slack after one changeover, and a start in its first 20 ticks.
func randomCase(t *testing.T, rng *rand.Rand) (*sim.Market, Job, time.Time) {
	t.Helper()
	m := randomMarket(t, rng, 1+rng.IntN(3), 80)
	job := Job{
		Work:          time.Duration(10+rng.IntN(20))*10*time.Minute + time.Duration(rng.IntN(600))*time.Second,
		Changeover:    time.Duration(5+rng.IntN(30)) * time.Minute,
		LaunchLatency: time.Duration(rng.IntN(5)) * time.Minute,
	}
	job.Deadline = job.Work + job.Changeover + time.Duration(rng.IntN(20))*10*time.Minute
	return m, job, m.Offers[0].TickStart(rng.IntN(20))
}

// bruteForce is the same discrete model solved top-down, without the
// band, the ring buffers or the best/second-best shortcut.
func bruteForce(offers []*sim.Offer, job Job, od float64) float64 {
	g := offers[0].Series.Tick
	tickH := g.Hours()
	H := int(math.Ceil(float64(job.Deadline)/float64(g) - 1e-9))
	wf := float64(job.Work) / float64(g)
	W := int(math.Ceil(wf - 1e-9))
	last := wf - float64(W-1)
	cf := float64(job.Changeover) / float64(g)
	c0 := int(math.Floor(cf + 1e-9))
	c1 := max(min(int(math.Floor(float64(job.Changeover-job.LaunchLatency)/float64(g)+1e-9)), c0), 0)
	M := len(offers) + 1
	avail := func(m, j int) bool { return m == 0 || offers[m-1].CapacityAt(j) >= 1 }
	step := func(m, j, p int) float64 {
		price := od
		if m > 0 {
			price = min(offers[m-1].SpotPriceAt(j), offers[m-1].SpotPriceAt(j+1))
		}
		c := price * tickH
		if p == W {
			c *= last
		}
		return c
	}
	change := func(m, j int) float64 {
		if m == 0 {
			return od * job.Changeover.Hours()
		}
		p := math.Inf(1)
		for i := j; i < j+max(int(math.Ceil(cf-1e-9)), 1); i++ {
			p = min(p, offers[m-1].SpotPriceAt(i))
		}
		return p * job.Changeover.Hours()
	}
	runOK := func(m, t, c int) bool {
		for j := t; j <= t+c; j++ {
			if !avail(m, j) {
				return false
			}
		}
		return true
	}
	memo := map[[3]int]float64{}
	var f func(t, p, s int) float64 // s = -1 idle, else warm mode
	f = func(t, p, s int) float64 {
		if p == W {
			return 0
		}
		if t >= H {
			return math.Inf(1)
		}
		k := [3]int{t, p, s}
		if v, ok := memo[k]; ok {
			return v
		}
		best := f(t+1, p, -1) // stop / stay idle
		for m := range M {
			if s == m && avail(m, t) {
				best = min(best, step(m, t, p+1)+f(t+1, p+1, m))
			}
			if s == -1 && t+c0+1 <= H && runOK(m, t, c0) {
				best = min(best, change(m, t)+step(m, t+c0, p+1)+f(t+c0+1, p+1, m))
			}
			if s >= 0 && s != m && t+c1+1 <= H && runOK(m, t, c1) {
				best = min(best, change(m, t)+step(m, t+c1, p+1)+f(t+c1+1, p+1, m))
			}
		}
		memo[k] = best
		return best
	}
	return f(0, 0, -1)
}

func TestOptimumMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(42, 1))
	var op optimizer
	feasible := 0
	for i := range 60 {
		m, job, start := randomCase(t, rng)
		offs := m.Offers
		got, err := op.solve(offs, start, job, 1, 3)
		if err != nil {
			t.Fatal(err)
		}
		// The brute force sees the window from its start.
		shifted := shift(t, m, start)
		want := bruteForce(shifted.Offers, job, 3)
		if math.IsInf(want, 1) {
			if got.Feasible {
				t.Errorf("case %d: DP found %v where the brute force finds nothing", i, got.Cost)
			}
			continue
		}
		feasible++
		if !got.Feasible || math.Abs(got.Cost-want) > 1e-9 {
			t.Errorf("case %d (%d zones, %+v): DP %v (feasible %v), brute force %v", i, len(offs), job, got.Cost, got.Feasible, want)
		}
		if h := got.SpotHours + got.OnDemandHours; got.Feasible && h < job.Work.Hours()-1e-9 {
			t.Errorf("case %d: %v paid hours for %v of work", i, h, job.Work.Hours())
		}
	}
	if feasible < 40 {
		t.Errorf("only %d of 60 random cases feasible; the check covers too little", feasible)
	}
}

// shift returns the market with its series starting at start.
func shift(t *testing.T, m *sim.Market, start time.Time) *sim.Market {
	t.Helper()
	tr := &sim.Trace{Name: "shifted", Start: start}
	for _, o := range m.Offers {
		s := *o.Series
		k := int(start.Sub(s.Start) / s.Tick)
		s.Avail, s.Price, s.Start = s.Avail[k:], s.Price[k:], start
		tr.Series = append(tr.Series, &s)
	}
	tr.End = tr.Series[0].End()
	out, err := sim.NewMarket(tr, sim.Config{Trace: "shifted", Instance: sim.Instance{OnDemandPrice: 3}})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
