package simulate

import (
	"math"
	"testing"
	"time"

	"github.com/fleetd/fleetd/providers/sim"
)

// constantMarket is one zone whose spot pool holds two nodes at $1/h for
// ever, with on-demand at $3/h.
func constantMarket(t *testing.T) *sim.Market {
	t.Helper()
	start := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	s := &sim.Series{Key: "z", Meta: sim.Meta{Zone: "zone-a", Region: "r"}, Start: start, Tick: 10 * time.Minute}
	for range 6 * 24 * 4 {
		s.Avail = append(s.Avail, 2)
		s.Price = append(s.Price, 1)
	}
	tr := &sim.Trace{Name: "constant", Start: start, Series: []*sim.Series{s}}
	tr.End = s.End()
	m, err := sim.NewMarket(tr, sim.Config{Trace: "constant", Instance: sim.Instance{OnDemandPrice: 3}})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestFluidBoundByHand checks the fluid bound against figures worked out
// by hand. With up to 4 nodes and linear scaling the nodes cost 1, 1, 3,
// 3 $/h and each adds a quarter of the rate: the first two do a
// work-hour for $4, the others for $12. Work runs from the changeover
// (12 min) to the deadline, and the first changeover is paid at $1/h.
func TestFluidBoundByHand(t *testing.T) {
	m := constantMarket(t)
	start := m.Offers[0].TickStart(10)
	knee2 := Shape{Name: "knee-2", Knee: 2}
	for _, tc := range []struct {
		name       string
		work, dl   time.Duration
		minN, maxN int
		shape      Shape
		want       float64
	}{
		// 29.8 h at half rate on spot do 14.9 ≥ 10 work-hours.
		{"spot is enough", 10 * time.Hour, 30 * time.Hour, 1, 4, Shape{}, 10*4 + 0.2},
		// 15.8 h on spot do 7.9; 2.1 more at $12.
		{"on-demand for the rest", 10 * time.Hour, 16 * time.Hour, 1, 4, Shape{}, 7.9*4 + 2.1*12 + 0.2},
		// No gain past 2 nodes: 2 spot nodes do a work-hour for $2.
		{"knee at 2", 10 * time.Hour, 30 * time.Hour, 1, 4, knee2, 10*2 + 0.2},
		// A rigid gang of 4: a work-hour costs $8, 4 nodes wait 12 min.
		{"rigid gang", 10 * time.Hour, 30 * time.Hour, 4, 4, Shape{}, 10*8 + 4*0.2},
		// One node: the spot node all the way.
		{"one node", 10 * time.Hour, 30 * time.Hour, 1, 1, Shape{}, 10 + 0.2},
	} {
		job := Job{Work: tc.work, Deadline: tc.dl, Changeover: 12 * time.Minute, LaunchLatency: 2 * time.Minute}
		got := fluidBound(m.Offers, start, job, tc.minN, tc.maxN, tc.shape)
		if !got.Feasible || math.Abs(got.Cost-tc.want) > 1e-9 {
			t.Errorf("%s: $%.6f (feasible %v), want $%.6f", tc.name, got.Cost, got.Feasible, tc.want)
		}
	}
	// Infeasible: less time than work, even on 4 nodes at full rate.
	if got := fluidBound(m.Offers, start, Job{Work: 10 * time.Hour, Deadline: 10 * time.Hour, Changeover: 12 * time.Minute}, 1, 4, Shape{}); got.Feasible {
		t.Errorf("10 h of work fit in 9.8 h: %+v", got)
	}
}

// TestRunningBound: instances noticed at a capacity drop still run for
// the notice lead, so the bound counts the capacity before the drop
// until the lead is over.
func TestRunningBound(t *testing.T) {
	start := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	s := &sim.Series{Key: "z", Meta: sim.Meta{Zone: "zone-a", Region: "r"}, Start: start, Tick: 10 * time.Minute,
		Avail: []int32{4, 1, 1, 3}, Price: []float64{1, 1, 1, 1}}
	tr := &sim.Trace{Name: "drop", Start: start, Series: []*sim.Series{s}, End: s.End()}
	m, err := sim.NewMarket(tr, sim.Config{Trace: "drop", Instance: sim.Instance{OnDemandPrice: 3, NoticeLead: "2m"}})
	if err != nil {
		t.Fatal(err)
	}
	o := m.Offers[0]
	for _, tc := range []struct {
		at   time.Duration
		want int
	}{{5 * time.Minute, 4}, {10 * time.Minute, 4}, {11 * time.Minute, 4}, {12 * time.Minute, 1}, {25 * time.Minute, 1}, {31 * time.Minute, 3}} {
		if got := runningBound(o, start.Add(tc.at)); got != tc.want {
			t.Errorf("at %s: %d, want %d", tc.at, got, tc.want)
		}
	}
}
