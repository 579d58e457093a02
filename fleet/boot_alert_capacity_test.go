package fleet

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/fleet/stats"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/providertest"
)

// TestBootFailureAlertIgnoresMarketRefusals: launches the cloud refused
// for capacity or quota are not boot failures; launch errors of the node
// itself (an image the cloud rejects) and boot timeouts are.
func TestBootFailureAlertIgnoresMarketRefusals(t *testing.T) {
	tests := []struct {
		unavailable string
		alert       bool
	}{
		{string(placement.UnavailableCapacity), false},
		{string(placement.UnavailableQuota), false},
		{string(placement.UnavailableLaunchError), true},
		{"", true}, // a boot timeout or a node lost while booting
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("unavailable=%q", tc.unavailable), func(t *testing.T) {
			d := bareDaemon()
			for i := 1; i <= 2*stats.BootAlertCount; i++ {
				data := map[string]string{"from": string(state.NodeProvisioning), "to": string(state.NodeFailed)}
				if tc.unavailable != "" {
					data["unavailable"] = tc.unavailable
				}
				d.stats.Tally.Event(state.Event{Seq: uint64(i), Time: time.Now(), Fleet: "f", Node: fmt.Sprint("n", i), Type: "node.transition", Data: data})
			}
			got := false
			for _, a := range d.alerts("f") {
				got = got || a.Kind == stats.AlertBootFailures
			}
			if got != tc.alert {
				t.Errorf("boot-failure alert %v, want %v (alerts %+v)", got, tc.alert, d.alerts("f"))
			}
		})
	}
}

// TestLaunchCapacityEventSaysUnavailable: a real launch refused for
// capacity writes its failed transition with unavailable=capacity, which
// is what keeps it out of the boot-failure count.
func TestLaunchCapacityEventSaysUnavailable(t *testing.T) {
	mem := providertest.NewMemProvider()
	// The market view says there is room; the launch itself is refused,
	// as EC2's InsufficientInstanceCapacity is.
	mem.SetHook(func(ctx context.Context, op providertest.Op, cfg providers.Config) error {
		if op == providertest.OpCreate {
			return providers.Errorf(providers.KindCapacity, "mem: no capacity")
		}
		return nil
	})
	td := startTestDaemon(t, t.TempDir(), mem)
	ctx := context.Background()
	td.apply(ctx, t, "train.hcl", memSpec)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		evs, err := td.store.Events(ctx, 0, 10000)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			if e.Type == "node.transition" && e.Data["to"] == string(state.NodeFailed) {
				if e.Data["unavailable"] != string(placement.UnavailableCapacity) {
					t.Fatalf("failed launch event %+v: want unavailable=capacity", e)
				}
				for _, a := range td.alerts("train") {
					if a.Kind == stats.AlertBootFailures {
						t.Errorf("boot-failure alert on capacity errors: %+v", a)
					}
				}
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("no failed launch within 20s")
}
