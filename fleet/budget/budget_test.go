package budget

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

func decode(t *testing.T, body string) (Limits, hcl.Diagnostics) {
	t.Helper()
	src := "budget {\n" + body + "\n}\n"
	f, diags := hclsyntax.ParseConfig([]byte(src), "b.hcl", hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatalf("syntax: %s", diags)
	}
	content, diags := f.Body.Content(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: "budget"}}})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	return DecodeBlock(content.Blocks[0], nil)
}

func TestDecodeBlock(t *testing.T) {
	tests := []struct {
		name string
		body string
		want Limits
		// errs: substrings of the error details, with the line:col of each subject.
		errs  []string
		warns []string
	}{
		{name: "full", body: `per_hour = 60
total = 5000
warn_at = 0.9
on_exhausted = "stop"`, want: Limits{PerHour: 60, Total: 5000, WarnAt: 0.9, OnExhausted: Stop}},
		{name: "defaults", body: `total = 10`, want: Limits{Total: 10, WarnAt: 0.8, OnExhausted: Pause}},
		{name: "negative total", body: `total = -5`, errs: []string{"2:9 total is in dollars and must be greater than 0, got -5"}},
		{name: "zero per_hour", body: `per_hour = 0`, errs: []string{"2:12 per_hour is in dollars and must be greater than 0, got 0"}},
		{name: "warn_at above one", body: "total = 1\nwarn_at = 1.5", errs: []string{"3:11 must be in (0, 1]"}},
		{name: "warn_at zero", body: "total = 1\nwarn_at = 0", errs: []string{"3:11 must be in (0, 1]"}},
		{name: "on_exhausted", body: "total = 1\non_exhausted = \"kill\"", errs: []string{`3:16 on_exhausted must be "pause"`}},
		{name: "wrong type", body: `total = "lots"`, errs: []string{"2:9 Inappropriate value"}},
		{name: "unknown attribute", body: `totl = 3`, errs: []string{`2:1 An argument named "totl" is not expected here`}},
		{name: "empty", body: ``, want: Limits{WarnAt: 0.8, OnExhausted: Pause}, warns: []string{"1:1 sets neither per_hour nor total"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, diags := decode(t, tc.body)
			var errs, warns []string
			for _, d := range diags {
				s := d.Detail
				if d.Subject != nil {
					s = fmt.Sprintf("%d:%d %s", d.Subject.Start.Line, d.Subject.Start.Column, d.Detail)
				}
				if d.Severity == hcl.DiagError {
					errs = append(errs, s)
				} else {
					warns = append(warns, s)
				}
			}
			match := func(kind string, got, want []string) {
				if len(got) != len(want) {
					t.Fatalf("%s: got %q, want %q", kind, got, want)
				}
				for i := range want {
					pos, text, _ := strings.Cut(want[i], " ")
					if !strings.HasPrefix(got[i], pos+" ") || !strings.Contains(got[i], text) {
						t.Errorf("%s %d: got %q, want %q at %s", kind, i, got[i], text, pos)
					}
				}
			}
			match("errors", errs, tc.errs)
			match("warnings", warns, tc.warns)
			if len(tc.errs) == 0 && got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestLimitsValidate(t *testing.T) {
	tests := []struct {
		l    Limits
		want string
	}{
		{Limits{PerHour: 60, Total: 5000, WarnAt: 0.8, OnExhausted: Pause}, ""},
		{Limits{}, ""},
		{Limits{Total: -1}, "total must not be negative"},
		{Limits{PerHour: -1}, "per_hour must not be negative"},
		{Limits{WarnAt: 1.2}, "warn_at must be in (0, 1]"},
		{Limits{OnExhausted: "halt"}, `on_exhausted must be "pause" or "stop"`},
	}
	for _, tc := range tests {
		err := tc.l.Validate()
		if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: got %v, want %q", tc.l, err, tc.want)
		}
	}
}

var t0 = time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)

func TestLedgerAccruesAndStates(t *testing.T) {
	lim := Limits{PerHour: 10, Total: 100}
	tests := []struct {
		name string
		// steps run on a fresh ledger; then both statuses are read at `at`.
		steps     func(l *Ledger)
		at        time.Duration
		fleet     Status
		project   State
		projSpent float64
	}{
		{
			name:    "two hours at $4/h",
			steps:   func(l *Ledger) { l.Run(t0, "a", "p", 3, 1) },
			at:      2 * time.Hour,
			fleet:   Status{State: OK, Total: 8, PerHour: 4, Spent: Spend{Spot: 6, OnDemand: 2}, Remaining: 92},
			project: OK, projSpent: 8,
		},
		{
			name:    "warn at 80% of the rate cap",
			steps:   func(l *Ledger) { l.Run(t0, "a", "p", 8, 0) },
			at:      time.Hour,
			fleet:   Status{State: Warn, Total: 8, PerHour: 8, Spent: Spend{Spot: 8}, Remaining: 92},
			project: Warn, projSpent: 8,
		},
		{
			name: "capped: two fleets together reach the project's per_hour",
			steps: func(l *Ledger) {
				l.Run(t0, "a", "p", 6, 0)
				l.Run(t0, "b", "p", 0, 4)
			},
			at:      time.Hour,
			fleet:   Status{State: OK, Total: 6, PerHour: 6, Spent: Spend{Spot: 6}, Remaining: 94},
			project: Capped, projSpent: 10,
		},
		{
			name: "rate changes split the accrual; egress counts",
			steps: func(l *Ledger) {
				l.Run(t0, "a", "p", 2, 0)
				l.Run(t0.Add(time.Hour), "a", "p", 0, 5)
				l.Charge(t0.Add(time.Hour), "a", "p", Spend{Egress: 3})
			},
			at:      3 * time.Hour,
			fleet:   Status{State: OK, Total: 15, PerHour: 5, Spent: Spend{Spot: 2, OnDemand: 10, Egress: 3}, Remaining: 85},
			project: OK, projSpent: 15,
		},
		{
			name:    "exhausted",
			steps:   func(l *Ledger) { l.Run(t0, "a", "p", 5, 0) },
			at:      20 * time.Hour,
			fleet:   Status{State: Exhausted, Total: 100, PerHour: 5, Spent: Spend{Spot: 100}, Remaining: 0},
			project: Exhausted, projSpent: 100,
		},
		{
			name: "a destroyed fleet's spend stays in its project",
			steps: func(l *Ledger) {
				l.Run(t0, "a", "p", 5, 0)
				l.Forget(t0.Add(2*time.Hour), "a")
			},
			at:      5 * time.Hour,
			fleet:   Status{State: OK, Remaining: 100},
			project: OK, projSpent: 10,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var l Ledger
			tc.steps(&l)
			now := t0.Add(tc.at)
			got := l.FleetStatus("a", lim, now)
			if got.State != tc.fleet.State || !near(got.Total, tc.fleet.Total) || !near(got.PerHour, tc.fleet.PerHour) ||
				!near(got.Remaining, tc.fleet.Remaining) || !near(got.Spent.Spot, tc.fleet.Spent.Spot) ||
				!near(got.Spent.OnDemand, tc.fleet.Spent.OnDemand) || !near(got.Spent.Egress, tc.fleet.Spent.Egress) {
				t.Errorf("fleet: got %+v, want %+v", got, tc.fleet)
			}
			p := l.ProjectStatus("p", lim, now)
			if p.State != tc.project || !near(p.Total, tc.projSpent) {
				t.Errorf("project: got %s $%g (%s), want %s $%g", p.State, p.Total, p.Reason, tc.project, tc.projSpent)
			}
		})
	}
}

func TestExhaustionProjection(t *testing.T) {
	var l Ledger
	l.Run(t0, "a", "p", 10, 0)
	st := l.FleetStatus("a", Limits{Total: 50}, t0.Add(time.Hour))
	if want := t0.Add(5 * time.Hour); !st.ExhaustsAt.Equal(want) {
		t.Errorf("exhausts at %s, want %s", st.ExhaustsAt, want)
	}
	if !strings.Contains(st.Reason, "runs out at 2026-11-28 17:00Z") {
		t.Errorf("reason %q", st.Reason)
	}
}

// TestLedgerSurvivesRestart: a ledger persisted and loaded again keeps
// its spend, and the time the daemon was down is billed at the last rate
// (the nodes kept running).
func TestLedgerSurvivesRestart(t *testing.T) {
	var l Ledger
	l.Run(t0, "a", "p", 4, 0)
	l.Advance(t0.Add(time.Hour))
	b, err := l.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	back.Run(t0.Add(3*time.Hour), "a", "p", 0, 0)
	st := back.FleetStatus("a", Limits{}, t0.Add(10*time.Hour))
	if !near(st.Total, 12) || st.PerHour != 0 {
		t.Errorf("after restart: $%g at $%g/h, want $12 at $0/h", st.Total, st.PerHour)
	}
	if _, err := Unmarshal([]byte("{")); err == nil {
		t.Error("a broken ledger decodes")
	}
}

func TestAlertsOncePerCrossing(t *testing.T) {
	var l Ledger
	limits := func(kind, name string) (Limits, bool) {
		if kind == "project" {
			return Limits{Total: 100}, true
		}
		return Limits{}, false
	}
	l.Run(t0, "a", "p", 10, 0)
	type want struct {
		at time.Duration
		to []State
	}
	for _, w := range []want{{time.Hour, nil}, {8 * time.Hour, []State{Warn}}, {9 * time.Hour, nil}, {10 * time.Hour, []State{Exhausted}}, {11 * time.Hour, nil}} {
		got := l.Alerts(t0.Add(w.at), limits)
		var states []State
		for _, a := range got {
			if a.Kind != "project" || a.Name != "p" {
				t.Errorf("alert for %s %s", a.Kind, a.Name)
			}
			states = append(states, a.To)
		}
		if len(states) != len(w.to) || (len(w.to) > 0 && states[0] != w.to[0]) {
			t.Errorf("at +%s: alerts %v, want %v", w.at, states, w.to)
		}
		// Persisting between passes must not re-raise an alert.
		b, _ := l.Marshal()
		nl, err := Unmarshal(b)
		if err != nil {
			t.Fatal(err)
		}
		l = *nl
	}
}

func near(a, b float64) bool { return a-b < 1e-6 && b-a < 1e-6 }

// TestObserveAbsoluteSpend: the daemon's own spend figures (from node
// records) set the spend; they never lower it, egress charges stay, and
// the time between observations is estimated at the last rate.
func TestObserveAbsoluteSpend(t *testing.T) {
	var l Ledger
	steps := []struct {
		at          time.Duration
		spent, rate Spend
		charge      float64
		want        float64 // the fleet's total at `at`
	}{
		{0, Spend{}, Spend{Spot: 2}, 0, 0},
		{time.Hour, Spend{Spot: 2.1}, Spend{Spot: 2, OnDemand: 3}, 0.5, 2.6},
		{2 * time.Hour, Spend{Spot: 4, OnDemand: 2.9}, Spend{Spot: 2, OnDemand: 3}, 0, 7.4},
		// A pruned node record lowers the daemon's figure: the ledger keeps its spend.
		{3 * time.Hour, Spend{Spot: 3, OnDemand: 5.9}, Spend{}, 0, 10.4},
	}
	for _, s := range steps {
		now := t0.Add(s.at)
		l.Observe(now, "f", "p", s.spent, s.rate)
		if s.charge > 0 {
			l.Charge(now, "f", "p", Spend{Egress: s.charge})
		}
		if got := l.FleetStatus("f", Limits{}, now).Total; !near(got, s.want) {
			t.Errorf("+%s: $%g, want $%g", s.at, got, s.want)
		}
		if got := l.ProjectStatus("p", Limits{}, now).Total; !near(got, s.want) {
			t.Errorf("+%s: project $%g, want $%g", s.at, got, s.want)
		}
	}
	// Between observations: the last rate (0 here) estimates.
	l.Observe(t0.Add(4*time.Hour), "f", "p", Spend{Spot: 4, OnDemand: 5.9}, Spend{OnDemand: 1})
	if got := l.FleetStatus("f", Limits{}, t0.Add(6*time.Hour)).Total; !near(got, 12.4) {
		t.Errorf("estimated $%g, want $12.4", got)
	}
}

func TestUSD(t *testing.T) {
	for _, tt := range []struct {
		v    float64
		want string
	}{{0, "$0.00"}, {5000, "$5000.00"}, {0.5, "$0.50"}, {0.01, "$0.01"}, {0.004, "$0.0040"}, {0.0001, "$0.00010"}, {0.00123, "$0.0012"}} {
		if got := USD(tt.v); got != tt.want {
			t.Errorf("USD(%g) = %q, want %q", tt.v, got, tt.want)
		}
	}
}
