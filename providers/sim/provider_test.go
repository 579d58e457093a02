package sim

import (
	"context"
	"encoding/json"
	"math"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/providertest"
)

// multiDir is absolute: plugin subprocesses resolve it too.
var multiDir, _ = filepath.Abs(filepath.Join("testdata", "multi"))

func rawConfig(t *testing.T, c map[string]any) providers.Config {
	t.Helper()
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return providers.Config{Fleet: "conf", Raw: b}
}

func conformanceOptions(t *testing.T) providertest.Options {
	return providertest.Options{
		Interrupter: true,
		InvalidConfig: func(cfg providers.Config) providers.Config {
			return rawConfig(t, map[string]any{"trace": multiDir, "no_such_attribute": 1})
		},
		// At +40m us-central1-a has no spot capacity.
		CapacityError: func(cfg providers.Config, off providers.Offering) providers.Config {
			if off.Zone != "us-central1-a" || off.CapacityType != providers.Spot {
				t.Fatalf("the suite launches %s; the capacity check expects us-central1-a spot", off.Key())
			}
			return rawConfig(t, map[string]any{"trace": multiDir, "start": "40m"})
		},
	}
}

// TestConformance runs the provider suite in-process, in real-time mode
// (the daemon's): the synthetic trace's 5-minute ticks outlast the test.
func TestConformance(t *testing.T) {
	providertest.Run(t, func(t *testing.T) (providers.Provider, providers.Config) {
		return New(Options{}), rawConfig(t, map[string]any{"trace": multiDir})
	}, conformanceOptions(t))
}

// TestConformanceOverGRPC runs it through a plugin subprocess, the path
// the daemon uses.
func TestConformanceOverGRPC(t *testing.T) {
	providertest.RunOverGRPC(t, Name, func(t *testing.T) providers.Config {
		return rawConfig(t, map[string]any{"trace": multiDir})
	}, conformanceOptions(t))
}

// manual is an injected virtual clock.
type manual struct{ t time.Time }

func (m *manual) now() time.Time { return m.t }

func TestPreemptionWithNoticeLead(t *testing.T) {
	ctx := context.Background()
	start := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := &manual{t: start.Add(time.Minute)}
	p := New(Options{Now: clk.now})
	cfg := rawConfig(t, map[string]any{"trace": multiDir, "zones": []string{"us-central1-a"}, "launch_latency": "90s"})
	offs, err := p.Offerings(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(offs) != 2 || offs[0].Available != 4 || offs[0].PricePerHour != 6 || offs[1].CapacityType != providers.OnDemand || offs[1].Available != -1 {
		t.Fatalf("offerings %+v", offs)
	}
	spot := offs[0]
	var ids []string
	for i := range 4 {
		clk.t = clk.t.Add(time.Second) // launch order decides who is preempted first
		ins, err := p.Create(ctx, cfg, providers.LaunchRequest{Offering: spot, Count: 1, IdempotencyToken: "n" + string(rune('a'+i)), Tags: map[string]string{providers.TagFleet: "f"}})
		if err != nil {
			t.Fatal(err)
		}
		if ins[0].State != providers.StatePending {
			t.Errorf("fresh instance %s", ins[0].State)
		}
		ids = append(ids, ins[0].ID)
	}
	if _, err := p.Create(ctx, cfg, providers.LaunchRequest{Offering: spot, Count: 1, IdempotencyToken: "ne"}); !providers.IsCapacity(err) {
		t.Fatalf("fifth launch: %v, want a capacity error", err)
	}
	clk.t = start.Add(4 * time.Minute)
	got, _ := p.Get(ctx, cfg, ids[0])
	if got.State != providers.StateRunning {
		t.Errorf("after the launch latency: %s", got.State)
	}
	// Capacity 4 → 3 at +15m: the newest instance gets a 30 s (GCP)
	// notice at the boundary, whenever the provider is asked next.
	if ev := p.NextEvent(); !ev.Equal(start.Add(15 * time.Minute)) {
		t.Errorf("next event %s, want the drop at +15m", ev)
	}
	clk.t = start.Add(15*time.Minute + 10*time.Second)
	ins, err := p.List(ctx, cfg, map[string]string{providers.TagFleet: "f"})
	if err != nil {
		t.Fatal(err)
	}
	var noticed []string
	for _, in := range ins {
		if in.Interruption != nil {
			noticed = append(noticed, in.ID)
			if want := start.Add(15*time.Minute + 30*time.Second); !in.Interruption.Deadline.Equal(want) || in.Interruption.Kind != KindSpotInterruption {
				t.Errorf("notice %+v, want spot-interruption by %s", in.Interruption, want)
			}
		}
	}
	if !slices.Equal(noticed, []string{ids[3]}) {
		t.Errorf("noticed %v, want the newest %s", noticed, ids[3])
	}
	// The notice frees the capacity at once: one launch fits again.
	if offs, _ := p.Offerings(ctx, cfg); offs[0].Available != 0 {
		t.Errorf("available %d after the notice, want 0 (3 of 3 used)", offs[0].Available)
	}
	clk.t = start.Add(15*time.Minute + 30*time.Second)
	if got, _ := p.Get(ctx, cfg, ids[3]); got.State != providers.StateTerminated {
		t.Errorf("at the notice deadline: %s", got.State)
	}
	// 3 → 2 at +25m takes the next newest; 2 → 0 at +35m the rest.
	clk.t = start.Add(40 * time.Minute)
	ins, _ = p.List(ctx, cfg, nil)
	if len(ins) != 0 {
		t.Errorf("%d instances live after the zone emptied", len(ins))
	}
	u := p.Usage()
	if u.Preemptions != 4 || u.OnDemandHours != 0 {
		t.Errorf("usage %+v", u)
	}
	// Billing: each instance from launch to its end at the trace's
	// prices (6.0 $/h until +40m).
	ends := []time.Duration{35 * time.Minute, 35 * time.Minute, 25 * time.Minute, 15 * time.Minute}
	want := 0.0
	for i, end := range ends {
		launched := start.Add(time.Minute + time.Duration(i+1)*time.Second)
		want += 6.0 * start.Add(end+30*time.Second).Sub(launched).Hours()
	}
	if math.Abs(u.SpotCost-want) > 1e-9 {
		t.Errorf("spot cost %v, want %v", u.SpotCost, want)
	}
	if u.SpotHours <= 0 || math.Abs(u.Cost()-u.SpotCost) > 1e-12 {
		t.Errorf("usage %+v", u)
	}
}

func TestCreateUnknownOffering(t *testing.T) {
	p := New(Options{})
	cfg := rawConfig(t, map[string]any{"trace": multiDir})
	_, err := p.Create(context.Background(), cfg, providers.LaunchRequest{Offering: providers.Offering{Provider: Name, Zone: "nowhere", CapacityType: providers.Spot}, Count: 1})
	if !providers.IsInvalidConfig(err) {
		t.Errorf("unknown offering: %v", err)
	}
	if _, err := p.Offerings(context.Background(), rawConfig(t, map[string]any{"trace": filepath.Join("testdata", "missing")})); !providers.IsInvalidConfig(err) {
		t.Errorf("missing trace: %v", err)
	}
}
