package sim

import (
	"context"
	"testing"
	"time"

	"github.com/fleetd/fleetd/providers"
)

// capacity_scale multiplies every series' spot capacity: a 0/1 probe
// trace holds gangs.
func TestCapacityScale(t *testing.T) {
	tr, err := Load(multiDir)
	if err != nil {
		t.Fatal(err)
	}
	var at time.Time
	base, err := NewMarket(tr, Config{Trace: multiDir})
	if err != nil {
		t.Fatal(err)
	}
	scaled, err := NewMarket(tr, Config{Trace: multiDir, CapacityScale: 8})
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range base.Offers {
		at = o.TickStart(3)
		if got, want := scaled.Offers[i].Capacity(at), 8*o.Capacity(at); got != want {
			t.Errorf("%s: capacity %d, want %d", o.Meta.Zone, got, want)
		}
		if got, want := scaled.Offers[i].CapacityAt(5), 8*o.CapacityAt(5); got != want {
			t.Errorf("%s: capacity at tick 5 %d, want %d", o.Meta.Zone, got, want)
		}
	}
	p := New(Options{Now: func() time.Time { return at }, Trace: tr})
	if _, err := p.Offerings(context.Background(), rawConfig(t, map[string]any{"trace": multiDir, "capacity_scale": -1})); !providers.IsInvalidConfig(err) {
		t.Errorf("a negative capacity_scale: %v", err)
	}
}
