package placement

import (
	"testing"
	"time"
)

func TestSlackReserve(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	d := 12 * time.Minute
	// Work 48 h; the deadline is set so that the slack at now is σ.
	at := func(done, slack time.Duration, spot, od bool) DeadlineInput {
		now := start.Add(10 * time.Hour)
		return DeadlineInput{Now: now, Start: start, Work: 48 * time.Hour, Done: done, Changeover: d,
			Deadline: now.Add(48*time.Hour - done + slack), SpotAvailable: spot, SpotOffered: spot, OnDemandActive: od}
	}
	offered := func(in DeadlineInput) DeadlineInput { in.SpotOffered = true; return in }
	tests := []struct {
		name   string
		p      SlackReserve
		in     DeadlineInput
		od     bool // UseOnDemand
		odOnly bool
	}{
		{"done", SlackReserve{}, at(48*time.Hour, time.Hour, false, false), false, false},
		{"spot available", SlackReserve{}, at(10*time.Hour, 4*time.Hour, true, false), false, false},
		{"no spot, plenty of slack: wait", SlackReserve{}, at(10*time.Hour, 8*time.Hour, false, false), false, false},
		// 38 h left × 0.1 = 3.8 h reserve + 27 min safety.
		{"no spot, slack at the reserve: on-demand", SlackReserve{}, at(10*time.Hour, 4*time.Hour, false, false), true, false},
		{"no reserve: wait down to the safety level", SlackReserve{Reserve: -1}, at(10*time.Hour, 30*time.Minute, false, false), false, false},
		{"on on-demand, no spot: keep it without asking for more", SlackReserve{}, at(10*time.Hour, time.Hour, false, true), false, false},
		{"on on-demand, spot back: swap", SlackReserve{}, at(10*time.Hour, time.Hour, true, true), false, false},
		// Safety: 2d + d/4 = 27 min.
		{"safety net below 2d+margin, spot or not", SlackReserve{}, at(40*time.Hour, 26*time.Minute, true, false), true, true},
		{"just above the safety net", SlackReserve{}, at(47*time.Hour, 28*time.Minute, true, false), false, false},
		{"explicit margin", SlackReserve{Margin: 10 * time.Minute}, at(47*time.Hour, 33*time.Minute, true, false), true, true},
		// Spot is there but none expected to last: on-demand at once,
		// however much slack (waiting would not bring better spot).
		{"spot offered, none admitted: on-demand", SlackReserve{}, offered(at(10*time.Hour, 8*time.Hour, false, false)), true, false},
		{"spot offered, none admitted, on on-demand: keep it", SlackReserve{}, offered(at(10*time.Hour, 8*time.Hour, false, true)), false, false},
		{"spot offered, none admitted, safety net", SlackReserve{}, offered(at(40*time.Hour, 20*time.Minute, false, false)), true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.p.Decide(tt.in)
			if got.UseOnDemand != tt.od || got.OnDemandOnly != tt.odOnly || got.Reason == "" {
				t.Errorf("Decide = %+v, want on-demand %v, only %v", got, tt.od, tt.odOnly)
			}
		})
	}
}

func TestSlackReserveMinSpotRun(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	d := 12 * time.Minute
	at := func(left, slack time.Duration, nu float64, od bool) DeadlineInput {
		now := start.Add(10 * time.Hour)
		return DeadlineInput{Now: now, Start: start, Work: 48 * time.Hour, Done: 48*time.Hour - left, Changeover: d,
			Deadline: now.Add(left + slack), ChangeRate: nu, OnDemandActive: od}
	}
	// λ·c for the slack left beyond the 27 min safety level.
	want := func(left, slack time.Duration, nu float64, c time.Duration) time.Duration {
		return time.Duration(SlackValue(slack-27*time.Minute, left, d, nu) * float64(c))
	}
	tests := []struct {
		name string
		p    SlackReserve
		in   DeadlineInput
		want time.Duration
	}{
		{"60 h deadline, calm market: any spot", SlackReserve{}, at(48*time.Hour, 12*time.Hour, 0.1, false), want(48*time.Hour, 12*time.Hour, 0.1, d)},
		{"52 h deadline, calm", SlackReserve{}, at(48*time.Hour, 4*time.Hour, 0.1, false), want(48*time.Hour, 4*time.Hour, 0.1, d)},
		{"52 h deadline, volatile", SlackReserve{}, at(48*time.Hour, 4*time.Hour, 0.5, false), want(48*time.Hour, 4*time.Hour, 0.5, d)},
		{"volatile, replacing on-demand: twice the changeovers", SlackReserve{}, at(48*time.Hour, 4*time.Hour, 0.5, true), want(48*time.Hour, 4*time.Hour, 0.5, 2*d)},
		{"3 min of free slack, 2 h left", SlackReserve{}, at(2*time.Hour, 30*time.Minute, 0.5, false), want(2*time.Hour, 30*time.Minute, 0.5, d)},
		{"below the safety level: the safety net decides", SlackReserve{}, at(20*time.Hour, 20*time.Minute, 0.5, false), 0},
		{"work done", SlackReserve{}, at(0, time.Hour, 0.5, false), 0},
		{"admission off", SlackReserve{AnySpot: true}, at(48*time.Hour, 4*time.Hour, 0.5, false), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.p.MinSpotRun(tt.in)
			if got != tt.want {
				t.Fatalf("MinSpotRun = %s, want %s", got, tt.want)
			}
		})
	}
	// What the cases above rest on: with 4 h of slack for 48 h of work a
	// calm market admits nearly every spot offering, a volatile one asks
	// for hours of expected run.
	if calm, vol := want(48*time.Hour, 4*time.Hour, 0.1, d), want(48*time.Hour, 4*time.Hour, 0.5, d); calm > 5*time.Minute || vol < time.Hour {
		t.Fatalf("calm %s, volatile %s", calm, vol)
	}
}

// TestSlackReserveNeverMissesAFeasibleDeadline: whatever the market does,
// and whichever spot the admission turns down, a job that follows the
// policy finishes in time. A fluid model in ticks
// of one minute: spot availability flips at random, a spot start or
// on-demand start costs d before progress, a preemption while on spot
// ends the run; the job starts with enough slack for one changeover.
func TestSlackReserveNeverMissesAFeasibleDeadline(t *testing.T) {
	d := 12 * time.Minute
	for _, admit := range []float64{1, 0.5, 0.1} { // share of the time spot with capacity is admitted
		for seed := range 200 {
			start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			work := 20 * time.Hour
			deadline := start.Add(work + d + time.Duration(seed%60)*time.Minute)
			rng := uint64(seed)*2654435761 + 1
			next := func() float64 { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return float64(rng%1000) / 1000 }
			const idle, spot, od = 0, 1, 2
			mode, warmAt := idle, time.Time{}
			var done time.Duration
			avail := true
			for now := start; done < work; now = now.Add(time.Minute) {
				if now.After(deadline) {
					t.Fatalf("admit %v seed %d: missed the deadline with %s of %s done", admit, seed, done, work)
				}
				if next() < 0.05 {
					avail = !avail
				}
				if mode == spot && !avail {
					mode = idle // preempted
				}
				admitted := avail && next() < admit
				dec := SlackReserve{}.Decide(DeadlineInput{Now: now, Start: start, Deadline: deadline, Work: work, Done: done,
					Changeover: d, SpotAvailable: admitted, SpotOffered: avail, ChangeRate: 0.3, OnDemandActive: mode == od})
				switch {
				case mode == idle && admitted && !dec.OnDemandOnly:
					mode, warmAt = spot, now.Add(d)
				case mode == idle && dec.UseOnDemand:
					mode, warmAt = od, now.Add(d)
				case mode == od && admitted && !dec.UseOnDemand:
					mode, warmAt = spot, now.Add(d) // swap (no overlap credited)
				}
				if mode != idle && !now.Before(warmAt) {
					done += time.Minute
				}
			}
		}
	}
}
