// Package simulate runs fleetd's real decision code — the reconciler,
// placement and the deadline policies — against a trace-driven spot market
// (providers/sim) in virtual time, over many start windows, and compares
// policies with the omniscient optimum. `fleetd sim` is its command line;
// docs/sim.md describes the model.
package simulate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"sync"
	"time"

	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/reconcile"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/sim"
)

// Job is the deadline job every window runs.
type Job struct {
	// Work is the training time at max_nodes.
	Work time.Duration `json:"work"`
	// Deadline is counted from the window's start.
	Deadline time.Duration `json:"deadline"`
	// Changeover is the cost of one (re)start: launch, setup and lost
	// progress; LaunchLatency is its first part (launch until the agent
	// joins), the rest is spent after the rendezvous round closes.
	Changeover    time.Duration `json:"changeover"`
	LaunchLatency time.Duration `json:"launch_latency"`
	// CheckpointBytes is the checkpoint every (re)start restores (0: the
	// sim block's checkpoint_gb; below 0: none). Each restore is charged
	// the egress from CheckpointRegion to the node's region (Egress) and
	// takes Bytes / RestoreMiBps of the restart.
	CheckpointBytes  int64                 `json:"checkpoint_bytes,omitempty"`
	CheckpointRegion string                `json:"checkpoint_region,omitempty"`
	RestoreMiBps     float64               `json:"restore_mib_per_s,omitempty"`
	Egress           placement.EgressTable `json:"egress"`
	// Cloud is the market's cloud (the sim block's cloud), for egress prices.
	Cloud string `json:"cloud,omitempty"`
}

// Policy is one way of running the job.
type Policy struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// Optimum: the omniscient lower bound (bound.go, optimum.go), not a
	// reconciler run.
	Optimum bool `json:"optimum,omitempty"`
	// GangDP: the DP of optimum.go for an all-or-nothing gang of
	// max_nodes in one zone at full rate. A lower bound only when
	// max_nodes is 1; otherwise the cost of the best rigid-gang schedule,
	// which elastic and goodput runs can beat.
	GangDP bool `json:"gang_dp,omitempty"`
	// Deadline is the reconciler's deadline policy; nil is its default.
	Deadline placement.DeadlinePolicy `json:"-"`
	// OnDemand runs the fleet with spot = false.
	OnDemand bool `json:"on_demand,omitempty"`
	// OneZone restricts each window's run to one zone of the set, drawn
	// at random per window (the same zone for every one-zone policy).
	OneZone bool `json:"one_zone,omitempty"`
	// PriceOnly ranks spot zones by price alone (placement.Model's
	// PriceOnly), as the published baselines pick the cheapest zone
	// with capacity.
	PriceOnly bool `json:"price_only,omitempty"`
	// Autoscale sizes the fleet with the goodput autoscaler (goodput.go)
	// instead of aiming at max_nodes.
	Autoscale bool `json:"autoscale,omitempty"`
	// Foresight tells placement each spot zone's true remaining up-run,
	// read from the trace's future (ForesightPolicy): not a policy
	// anyone can run, a bound on what predicting interruptions better
	// could gain.
	Foresight bool `json:"foresight,omitempty"`
	// Planner replays the window with the lookahead planner
	// (lookahead.go), which knows the trace exactly for the next
	// Lookahead: like Foresight, a measuring tool.
	Planner   bool          `json:"planner,omitempty"`
	Lookahead time.Duration `json:"lookahead,omitempty"`
}

// Setup is a simulation.
type Setup struct {
	Trace *sim.Trace
	// Fleet is the spec's fleet; its sim provider block selects zones
	// and prices. Its deadline and work are replaced per window by Job.
	Fleet *spec.Fleet
	Job   Job
	// Policies to run; Optimum must be among them for ratios.
	Policies []Policy
	// Windows random start windows, drawn with Seed; or explicit Starts.
	Windows int
	Starts  []time.Time
	Seed    uint64
	// Interval is how often the deadline policy is consulted while the
	// fleet is not steadily on spot (default: the trace's tick, as the
	// published simulators decide once per tick).
	Interval time.Duration
	// Params tune the reconciler (the daemon's defaults when zero).
	Params reconcile.Params
	// Parallel bounds the windows simulated at once (default GOMAXPROCS).
	Parallel int
	// Warm starts each window's fleet with the spot market history of
	// the trace before the window (warmHistory): what a long-running
	// deployment would know. Off, every job starts from the prior, as on
	// a fresh daemon.
	Warm bool
	// Exhaustive runs a reconcile pass at every event and check time
	// instead of skipping passes that provably change nothing.
	Exhaustive bool
	// Log, when set, receives every run's plan actions and round changes
	// (use with few windows and Parallel 1).
	Log io.Writer
	// Shape is the job's throughput per node count (goodput.go); the zero
	// Shape scales linearly.
	Shape Shape
	// NoEgress hides the checkpoint's egress from placement (the
	// comparison run): restores are still charged their egress and take
	// their time, only the decisions ignore it.
	NoEgress bool

	cfg     providers.Config
	market  *sim.Market
	zoneCf  map[string]providers.Config
	zoneMkt map[string]*sim.Market
}

// Result is one policy's run over one window.
type Result struct {
	Policy string    `json:"policy"`
	Window int       `json:"window"`
	Start  time.Time `json:"start"`
	// Zone is the zone of a one-zone run.
	Zone          string        `json:"zone,omitempty"`
	Cost          float64       `json:"cost"`
	SpotCost      float64       `json:"spot_cost"`
	OnDemandCost  float64       `json:"on_demand_cost"`
	SpotHours     float64       `json:"spot_hours"`
	OnDemandHours float64       `json:"on_demand_hours"`
	Elapsed       time.Duration `json:"elapsed"`
	Done          time.Duration `json:"done"`
	Missed        bool          `json:"missed,omitempty"`
	Infeasible    bool          `json:"infeasible,omitempty"`
	Migrations    int           `json:"migrations"`
	Preemptions   int           `json:"preemptions"`
	Restarts      int           `json:"restarts"`
	Passes        int           `json:"passes,omitempty"`
	// SizeChanges counts the autoscaler's target changes.
	SizeChanges int `json:"size_changes,omitempty"`
	// EgressCost is what the checkpoint restores cost in egress (part of
	// Cost); CrossRegionRestores counts restores from another region.
	EgressCost float64 `json:"egress_cost,omitempty"`
	// DataCost is what reading the fleet's datasets cost (training.data:
	// streamed reads, staged copies; part of Cost).
	DataCost            float64 `json:"data_cost,omitempty"`
	CrossRegionRestores int     `json:"cross_region_restores,omitempty"`
}

// Prepare checks the setup and resolves the market and the job: zero Job
// fields come from the spec (work; the deadline counted from the trace's
// start, the spec's job being the window at the trace's start) and the
// sim provider block (changeover, launch latency).
func (s *Setup) Prepare() error {
	if s.Trace == nil || s.Fleet == nil {
		return errors.New("simulate: trace and fleet are required")
	}
	pb, ok := s.Fleet.Provider(sim.Name)
	if !ok || len(s.Fleet.Providers) != 1 {
		return fmt.Errorf("fleet %s: the simulator needs exactly one provider, %q", s.Fleet.Name, sim.Name)
	}
	c, err := sim.DecodeConfig(providers.Config{Fleet: s.Fleet.Name, Raw: pb.Config})
	if err != nil {
		return err
	}
	if s.Job.Changeover <= 0 {
		s.Job.Changeover = c.ChangeoverDuration()
	}
	if s.Job.LaunchLatency <= 0 {
		s.Job.LaunchLatency = c.LaunchLatencyDuration()
	}
	if s.Job.LaunchLatency > s.Job.Changeover {
		return fmt.Errorf("launch latency %s exceeds the changeover %s", s.Job.LaunchLatency, s.Job.Changeover)
	}
	if s.Job.Work <= 0 {
		s.Job.Work = s.Fleet.Work
	}
	if s.Job.Deadline <= 0 && s.Fleet.Deadline != nil {
		s.Job.Deadline = s.Fleet.Deadline.Sub(s.Trace.Start)
	}
	if s.Job.Work <= 0 || s.Job.Deadline <= 0 {
		return fmt.Errorf("fleet %s: the simulator needs work and a deadline after the job's start (spec or flags)", s.Fleet.Name)
	}
	if s.Job.Deadline < s.Job.Work+s.Job.Changeover {
		return fmt.Errorf("deadline %s is shorter than the work %s plus one changeover %s: no policy can make it", s.Job.Deadline, s.Job.Work, s.Job.Changeover)
	}
	// The provider block with the job's timings, so the market launches
	// with the same latency the job model assumes.
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(pb.Config, &raw); err != nil {
		return fmt.Errorf("sim provider block: %w", err)
	}
	raw["launch_latency"], _ = json.Marshal(s.Job.LaunchLatency.String())
	raw["changeover"], _ = json.Marshal(s.Job.Changeover.String())
	b, err := json.Marshal(raw)
	if err != nil {
		return err
	}
	s.cfg = providers.Config{Fleet: s.Fleet.Name, Raw: b}
	c, err = sim.DecodeConfig(s.cfg)
	if err != nil {
		return err
	}
	if s.market, err = sim.NewMarket(s.Trace, c); err != nil {
		return err
	}
	s.zoneCf, s.zoneMkt = map[string]providers.Config{}, map[string]*sim.Market{}
	for _, z := range s.market.Zones() {
		raw["zones"], _ = json.Marshal([]string{z})
		b, err := json.Marshal(raw)
		if err != nil {
			return err
		}
		zc := providers.Config{Fleet: s.Fleet.Name, Raw: b}
		c, err := sim.DecodeConfig(zc)
		if err != nil {
			return err
		}
		if s.zoneMkt[z], err = sim.NewMarket(s.Trace, c); err != nil {
			return err
		}
		s.zoneCf[z] = zc
	}
	if s.Interval <= 0 {
		s.Interval = s.market.Offers[0].Series.Tick
	}
	s.prepareCheckpoint(c)
	if len(s.Policies) == 0 {
		s.Policies = DefaultPolicies()
	}
	return nil
}

// Market is the resolved market of the whole zone set (after Prepare).
func (s *Setup) Market() *sim.Market { return s.market }

// windows draws the start windows: tick boundaries of the first series
// such that the deadline stays inside every series.
func (s *Setup) windows() ([]time.Time, []int, error) {
	zones := len(s.market.Offers)
	rng := rand.New(rand.NewPCG(s.Seed, 0x5eed))
	o := s.market.Offers[0]
	if len(s.Starts) > 0 {
		// Explicit starts snap to the tick they fall in.
		starts := make([]time.Time, len(s.Starts))
		zi := make([]int, len(s.Starts))
		for i, t := range s.Starts {
			d := t.Sub(o.Series.Start)
			k := d / o.Series.Tick
			if d < 0 && d%o.Series.Tick != 0 {
				k--
			}
			starts[i] = o.TickStart(int(k))
			zi[i] = rng.IntN(zones)
		}
		return starts, zi, nil
	}
	first := o.Series.Start
	for _, x := range s.market.Offers {
		if x.Series.Start.After(first) {
			first = x.Series.Start
		}
	}
	i0 := int((first.Sub(o.Series.Start) + o.Series.Tick - 1) / o.Series.Tick)
	room := s.market.Horizon(o.TickStart(i0)) - s.Job.Deadline
	if room < 0 {
		return nil, nil, fmt.Errorf("the trace (%s from %s) is shorter than the deadline %s", s.market.Horizon(o.TickStart(i0)), o.TickStart(i0).Format(time.RFC3339), s.Job.Deadline)
	}
	n := int(room/o.Series.Tick) + 1
	starts := make([]time.Time, s.Windows)
	zi := make([]int, s.Windows)
	for i := range starts {
		starts[i] = o.TickStart(i0 + rng.IntN(n))
		zi[i] = rng.IntN(zones)
	}
	return starts, zi, nil
}

// Run simulates every policy over every window, windows in parallel.
func (s *Setup) Run(ctx context.Context) ([]Result, error) {
	if s.market == nil {
		if err := s.Prepare(); err != nil {
			return nil, err
		}
	}
	starts, zi, err := s.windows()
	if err != nil {
		return nil, err
	}
	par := s.Parallel
	if par <= 0 {
		par = runtime.GOMAXPROCS(0)
	}
	par = max(min(par, len(starts)), 1)
	out := make([][]Result, len(starts))
	errs := make([]error, len(starts))
	next := make(chan int)
	var wg sync.WaitGroup
	for range par {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var op optimizer
			for w := range next {
				out[w], errs[w] = s.window(&op, w, starts[w], s.market.Offers[zi[w]].Meta.Zone)
			}
		}()
	}
	for w := range starts {
		select {
		case next <- w:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(next)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var all []Result
	for w := range starts {
		if errs[w] != nil {
			return nil, fmt.Errorf("window %d (%s): %w", w, starts[w].Format(time.RFC3339), errs[w])
		}
		all = append(all, out[w]...)
	}
	return all, nil
}

// window runs every policy over one window.
func (s *Setup) window(op *optimizer, w int, start time.Time, zone string) ([]Result, error) {
	var out []Result
	for _, pol := range s.Policies {
		var res Result
		var err error
		switch {
		case pol.Optimum, pol.GangDP:
			res, err = s.optimum(op, pol, start)
		case pol.Planner:
			res, err = s.lookahead(op, pol, start)
		default:
			res, err = s.RunOne(pol, start, zone)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", pol.Name, err)
		}
		res.Window = w
		out = append(out, res)
	}
	return out, nil
}

// RunOne runs one reconciler-driven policy over the window starting at
// start; zone is used by one-zone policies.
func (s *Setup) RunOne(pol Policy, start time.Time, zone string) (Result, error) {
	fl := *s.Fleet
	dl := start.Add(s.Job.Deadline)
	fl.Deadline, fl.Work = &dl, s.Job.Work
	fl.Placement.Fallback, fl.Placement.FallbackAfter = spec.FallbackDeadline, 0
	cfg, mkt := s.cfg, s.market
	if pol.OnDemand {
		fl.Node.Spot = false
	}
	if pol.OneZone {
		cfg, mkt = s.zoneCf[zone], s.zoneMkt[zone]
	} else {
		zone = ""
	}
	fl.Providers = []spec.Provider{{Name: sim.Name, Config: cfg.Raw}}
	r, err := newRunner(s, pol, &fl, cfg, mkt, start, zone)
	if err != nil {
		return Result{}, err
	}
	return r.run(), nil
}

// onDemandPrice is the lowest on-demand price of the market's zones.
func (s *Setup) onDemandPrice() float64 {
	od := 0.0
	for _, o := range s.market.Offers {
		if od == 0 || o.Meta.OnDemandPrice < od {
			od = o.Meta.OnDemandPrice
		}
	}
	return od
}

// optimum is the lower bound of a window (pol.Optimum): the fluid bound
// (bound.go) for any fleet and shape and, for one-node jobs, the DP
// (optimum.go), which is then a bound too and tighter — the higher of
// the two. With pol.GangDP it is the DP alone, for a gang of max_nodes.
func (s *Setup) optimum(op *optimizer, pol Policy, start time.Time) (Result, error) {
	gang := max(s.Fleet.MaxNodes, 1)
	var o optimumResult
	if pol.GangDP || gang == 1 {
		var err error
		if o, err = op.solve(s.market.Offers, start, s.Job, gang, s.onDemandPrice()*float64(gang)); err != nil {
			return Result{}, err
		}
		o.SpotHours, o.OnDemandHours = o.SpotHours*float64(gang), o.OnDemandHours*float64(gang)
	}
	if pol.Optimum {
		if f := fluidBound(s.market.Offers, start, s.Job, s.Fleet.MinNodes, gang, s.Shape); f.Feasible && (!o.Feasible || f.Cost > o.Cost) {
			o = f
		}
	}
	res := Result{Policy: pol.Name, Start: start, Cost: o.Cost, SpotHours: o.SpotHours, OnDemandHours: o.OnDemandHours,
		Migrations: o.Migrations, Preemptions: o.Preemptions, Restarts: o.Restarts, Infeasible: !o.Feasible, Done: s.Job.Work}
	if !o.Feasible {
		res.Cost, res.Done = 0, 0
	}
	return res, nil
}

// prepareCheckpoint resolves the job's checkpoint from the sim block: its
// size, the store's region (default: the first zone's), the restore
// throughput and the egress table (the spec's overrides on the defaults,
// or nothing with NoEgress).
func (s *Setup) prepareCheckpoint(c sim.Config) {
	if s.Job.CheckpointBytes == 0 {
		s.Job.CheckpointBytes = int64(c.CheckpointGB * 1e9)
	}
	if s.Job.CheckpointBytes < 0 {
		s.Job.CheckpointBytes = 0
	}
	if s.Job.CheckpointRegion == "" {
		s.Job.CheckpointRegion = c.CheckpointRegion
	}
	if s.Job.CheckpointRegion == "" {
		zones := s.market.Zones()
		for _, o := range s.market.Offers {
			if len(zones) > 0 && o.Spot.Zone == zones[0] {
				s.Job.CheckpointRegion = o.Spot.Region
			}
		}
	}
	if s.Job.RestoreMiBps <= 0 {
		s.Job.RestoreMiBps = c.RestoreMiBps
	}
	if s.Job.RestoreMiBps <= 0 {
		s.Job.RestoreMiBps = placement.DefaultRestoreMiBps
	}
	if s.Job.Cloud == "" {
		s.Job.Cloud = c.Cloud
	}
	if s.Job.Cloud == "" {
		s.Job.Cloud = sim.Name
	}
	s.Job.Egress = placement.EgressFor(s.Fleet.Placement)
}

// restoreTime is how long one restore of the checkpoint takes.
func (j Job) restoreTime() time.Duration {
	if j.CheckpointBytes <= 0 || j.RestoreMiBps <= 0 {
		return 0
	}
	return time.Duration(float64(j.CheckpointBytes) / (1 << 20) / j.RestoreMiBps * float64(time.Second))
}
