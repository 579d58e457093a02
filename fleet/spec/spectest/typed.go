package spectest

import (
	"time"

	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/providers"
)

// TypedFleet is the decoded fleet the pure decision code's tests (placement,
// reconcile) start from: "bert", minN to maxN spot nodes of 8 GPUs on the
// named providers, placed by price and capacity in one zone, with on-demand
// allowed after 10 minutes below min. Tests set what their scenario varies.
func TypedFleet(minN, maxN int, providerNames ...string) *spec.Fleet {
	f := &spec.Fleet{
		Name: "bert", MinNodes: minN, MaxNodes: maxN,
		Node: spec.Node{GPUs: 8, Spot: true},
		Placement: spec.Placement{
			Strategy: spec.StrategyPriceCapacity, Colocate: spec.ColocateZone,
			Fallback: spec.FallbackAfter, FallbackAfter: 10 * time.Minute,
		},
	}
	for _, name := range providerNames {
		f.Providers = append(f.Providers, spec.Provider{Name: name})
	}
	return f
}

// Offering is an 8-GPU A100 machine prov sells in zone, whose region is the
// zone less its last letter ("us-east-1a" is in "us-east-1"); avail -1 means
// the provider does not know how many are left.
func Offering(prov, zone, typ string, ct providers.CapacityType, price float64, avail int) providers.Offering {
	return providers.Offering{
		Provider: prov, Region: zone[:len(zone)-1], Zone: zone, InstanceType: typ, CapacityType: ct,
		PricePerHour: price, GPUs: 8, GPUType: "A100", VCPUs: 96, MemoryGiB: 1152, Available: avail,
	}
}
