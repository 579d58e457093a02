package placement

import (
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

func netFleet(mode spec.Network) *spec.Fleet {
	return &spec.Fleet{Name: "f", MinNodes: 2, MaxNodes: 8,
		Node:      spec.Node{GPUs: 8, Spot: true, Network: mode},
		Placement: spec.Placement{Colocate: spec.ColocateZone, Fallback: spec.FallbackNever},
		Providers: []spec.Provider{{Name: "aws"}}}
}

var (
	efaOff   = providers.Offering{Provider: "aws", Region: "us-east-1", Zone: "us-east-1a", InstanceType: "p5.48xlarge", CapacityType: providers.Spot, GPUs: 8, PricePerHour: 30, Network: providers.NetworkInfo{Fabric: providers.FabricEFA, Interfaces: 32, BandwidthGbps: 3200}}
	plainOff = providers.Offering{Provider: "aws", Region: "us-east-1", Zone: "us-east-1a", InstanceType: "p3.16xlarge", CapacityType: providers.Spot, GPUs: 8, PricePerHour: 7}
)

func TestNetworkExclusion(t *testing.T) {
	for _, c := range []struct {
		mode spec.Network
		off  providers.Offering
		want string
	}{
		{"", plainOff, ""},
		{spec.NetworkStandard, efaOff, ""},
		{spec.NetworkAuto, plainOff, ""},
		{spec.NetworkFast, efaOff, ""},
		{spec.NetworkFast, plainOff, `no fast network (EFA, GPUDirect) on p3.16xlarge, node.network is "fast"`},
	} {
		if got := Exclusion(netFleet(c.mode), c.off); got != c.want {
			t.Errorf("%q on %s: exclusion %q, want %q", c.mode, c.off.InstanceType, got, c.want)
		}
	}
}

func TestNetworkFor(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	tags := map[string]string{providers.TagFleet: "f"}
	failed := func(n int, kind UnavailableKind) state.OfferingRecord {
		rec := state.OfferingRecord{Key: efaOff.Key()}
		for i := range n {
			// Each failure after the previous back-off ended: a new one of the streak.
			rec = MarkUnavailable(rec, now.Add(time.Duration(i)*30*time.Minute), "InsufficientInstanceCapacity", kind)
		}
		return rec
	}
	group := GroupName("f", "k3x9")
	for _, c := range []struct {
		name      string
		mode      spec.Network
		off       providers.Offering
		rec       state.OfferingRecord
		wantGroup string
		fabric    bool
		fallback  bool
	}{
		{"standard never asks", spec.NetworkStandard, efaOff, state.OfferingRecord{}, "", false, false},
		{"auto on a plain type", spec.NetworkAuto, plainOff, state.OfferingRecord{}, "", false, false},
		{"auto on EFA", spec.NetworkAuto, efaOff, state.OfferingRecord{}, group, true, false},
		{"auto below the threshold", spec.NetworkAuto, efaOff, failed(GroupFallbackAfter-1, UnavailableCapacity), group, true, false},
		{"auto falls back", spec.NetworkAuto, efaOff, failed(GroupFallbackAfter, UnavailableCapacity), "", true, true},
		{"auto: quota is not capacity", spec.NetworkAuto, efaOff, failed(GroupFallbackAfter, UnavailableQuota), group, true, false},
		{"auto: a success resets", spec.NetworkAuto, efaOff, RecordLaunch(failed(GroupFallbackAfter, UnavailableCapacity), now.Add(3*time.Hour)), group, true, false},
		{"fast keeps the group", spec.NetworkFast, efaOff, failed(GroupFallbackAfter+2, UnavailableCapacity), group, true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := NetworkFor(netFleet(c.mode), c.off, c.rec, group, tags)
			if p.Request.Group != c.wantGroup || p.Request.Fabric != c.fabric || (p.Fallback != "") != c.fallback {
				t.Fatalf("plan %+v, want group %q fabric %v fallback %v", p, c.wantGroup, c.fabric, c.fallback)
			}
			if c.fallback && !strings.Contains(p.Fallback, "launching without a group") {
				t.Errorf("fallback note %q", p.Fallback)
			}
			if c.wantGroup != "" && p.Request.GroupTags[providers.TagFleet] != "f" {
				t.Errorf("group tags %v", p.Request.GroupTags)
			}
		})
	}
}

func TestGroupName(t *testing.T) {
	if got := GroupName("bert-large", "k3x9"); got != "fleetd-bert-large-k3x9" {
		t.Errorf("GroupName = %q", got)
	}
}

func TestChooseSaysWhyNothingFits(t *testing.T) {
	f := netFleet(spec.NetworkFast)
	ch := Choose(ChooseInput{Fleet: f, Offerings: []providers.Offering{plainOff, plainOff}, Need: 2, Target: 2,
		Capacity: Decision{Spot: true}, Now: time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)})
	want := `no offering fits the fleet: 2 × no fast network (EFA, GPUDirect) on p3.16xlarge, node.network is "fast"`
	if ch.Group != "" || ch.Reason != want {
		t.Errorf("choice %q: %q, want %q", ch.Group, ch.Reason, want)
	}
	if got := Explain(Candidate{Offering: efaOff}); !strings.HasSuffix(got, "; network efa ×32, 3200 Gbps") {
		t.Errorf("Explain does not name the network: %q", got)
	}
}
