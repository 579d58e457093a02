package placement

import (
	"fmt"
	"sort"
	"strings"

	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/providers"
)

// Filter returns the offerings that satisfy f's node constraints, from the
// providers f names, in their input order.
//
// On-demand offerings pass when the spec asks for on-demand nodes or when
// its fallback policy may use them (anything but "never"); whether they
// are used at a given moment is DecideCapacity's call.
func Filter(f *spec.Fleet, offs []providers.Offering) []providers.Offering {
	out := make([]providers.Offering, 0, len(offs))
	for _, o := range offs {
		if Exclusion(f, o) == "" {
			out = append(out, o)
		}
	}
	return out
}

// Exclusion says why o does not fit f, or "" when it does.
func Exclusion(f *spec.Fleet, o providers.Offering) string {
	if f == nil {
		return "no fleet spec"
	}
	if _, ok := f.Provider(o.Provider); !ok {
		return fmt.Sprintf("provider %q is not in the fleet", o.Provider)
	}
	n := f.Node
	// Multi-GPU nodes are specific shapes (NCCL topology, nproc_per_node),
	// so the GPU count must match exactly rather than be at least n.GPUs.
	if n.GPUs > 0 && o.GPUs != n.GPUs {
		return fmt.Sprintf("has %d GPUs, node needs %d", o.GPUs, n.GPUs)
	}
	if len(n.GPUTypes) > 0 && !containsFold(n.GPUTypes, o.GPUType) {
		return fmt.Sprintf("GPU type %q not in %v", o.GPUType, n.GPUTypes)
	}
	if n.MinVCPUs > 0 && o.VCPUs < n.MinVCPUs {
		return fmt.Sprintf("%d vCPUs < min_vcpus %d", o.VCPUs, n.MinVCPUs)
	}
	if n.MinMemoryGiB > 0 && o.MemoryGiB < n.MinMemoryGiB {
		return fmt.Sprintf("%g GiB < min_memory_gib %g", o.MemoryGiB, n.MinMemoryGiB)
	}
	if n.MaxPricePerGPUHour > 0 && o.PricePerGPUHour() > n.MaxPricePerGPUHour {
		return fmt.Sprintf("$%.4f/GPU-h > max_price_per_gpu_hour %g", o.PricePerGPUHour(), n.MaxPricePerGPUHour)
	}
	if why := networkExclusion(n, o); why != "" {
		return why
	}
	if why := dataExclusion(f, o); why != "" {
		return why
	}
	switch o.CapacityType {
	case providers.Spot:
		if !n.Spot {
			return "spot, node asks for on-demand"
		}
	case providers.OnDemand:
		if n.Spot && f.Placement.Fallback == spec.FallbackNever {
			return "on-demand, fallback is never"
		}
	default:
		return fmt.Sprintf("unknown capacity type %q", o.CapacityType)
	}
	return ""
}

// ExclusionSummary counts why offerings do not fit f, most common reason
// first, at most three: "6 × no fast network (EFA, GPUDirect) on
// p3.16xlarge, …; 2 × has 4 GPUs, node needs 8". "" when all fit.
func ExclusionSummary(f *spec.Fleet, offs []providers.Offering) string {
	count := map[string]int{}
	for _, o := range offs {
		if why := Exclusion(f, o); why != "" {
			count[why]++
		}
	}
	reasons := make([]string, 0, len(count))
	for r := range count {
		reasons = append(reasons, r)
	}
	sort.Slice(reasons, func(i, j int) bool {
		if count[reasons[i]] != count[reasons[j]] {
			return count[reasons[i]] > count[reasons[j]]
		}
		return reasons[i] < reasons[j]
	})
	var parts []string
	for i, r := range reasons {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("%d more reasons", len(reasons)-3))
			break
		}
		parts = append(parts, fmt.Sprintf("%d × %s", count[r], r))
	}
	return strings.Join(parts, "; ")
}

func containsFold(list []string, s string) bool {
	for _, x := range list {
		if strings.EqualFold(strings.TrimSpace(x), strings.TrimSpace(s)) {
			return true
		}
	}
	return false
}
