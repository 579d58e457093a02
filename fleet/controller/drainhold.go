package controller

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fleetd/fleetd/fleet/allocator"
)

// drainHold caps a growing fleet's live nodes while GPUs the allocator
// gave it still run on draining nodes. The allocator counts only live
// nodes, so a reclaimed borrower's nodes leave its count when their drain
// starts; launching the newcomer's at once would hold more than the
// pool's (or the project's) max_gpus for up to drain_grace. The
// allocation itself is left alone: counting draining nodes as the
// borrower's would make the allocator reclaim them twice.
type drainHold struct {
	// Nodes is the most live nodes the fleet may have now (≥ its live
	// nodes: a hold never drains).
	Nodes int
	// Why names what it waits for, for status.
	Why string
}

func (h *drainHold) why() string {
	if h == nil {
		return ""
	}
	return h.Why
}

// occupancy is what a fleet's nodes hold of the pool when the decision is
// made: live nodes (as the allocator counts them) and draining ones whose
// instances still run.
type occupancy struct {
	project        string
	gpusPerNode    int
	live, draining int
	priority       int
	arrival        time.Time
}

// drainHolds grants each growing fleet's new nodes against what is free
// of the pool and of its project's max_gpus once draining nodes are
// counted, in the allocator's order of claim (priority, then arrival),
// and returns a hold for every fleet that cannot launch all of them yet.
// Fleets of an unlimited project are outside the pool.
func drainHolds(dec allocator.Decision, in allocator.Input, occ map[string]occupancy) map[string]drainHold {
	const pool = ""
	limit := map[string]int{pool: in.PoolGPUs}
	unlimited := map[string]bool{}
	for _, pr := range in.Projects {
		switch {
		case pr.Unlimited:
			unlimited[pr.Name] = true
		case pr.MaxGPUs > 0:
			limit[pr.Name] = pr.MaxGPUs
		}
	}
	used := map[string]int{}
	drainingIn := map[string][]string{} // scope → fleets with draining nodes
	for name, o := range occ {
		if unlimited[o.project] {
			continue
		}
		g := (o.live + o.draining) * o.gpusPerNode
		used[pool] += g
		used[o.project] += g
		if o.draining > 0 {
			drainingIn[pool] = append(drainingIn[pool], name)
			drainingIn[o.project] = append(drainingIn[o.project], name)
		}
	}
	grows := make([]allocator.Allocation, 0, len(dec.Fleets))
	for _, a := range dec.Fleets {
		o, ok := occ[a.Fleet]
		if ok && a.Action == allocator.Run && a.To > a.From && !unlimited[o.project] && o.gpusPerNode > 0 {
			grows = append(grows, a)
		}
	}
	slices.SortStableFunc(grows, func(x, y allocator.Allocation) int {
		ox, oy := occ[x.Fleet], occ[y.Fleet]
		return cmp.Or(cmp.Compare(oy.priority, ox.priority), ox.arrival.Compare(oy.arrival))
	})
	holds := map[string]drainHold{}
	for _, a := range grows {
		o := occ[a.Fleet]
		want := a.To - a.From
		can, short := want, ""
		for _, scope := range []string{pool, o.project} {
			lim, ok := limit[scope]
			if !ok || lim <= 0 {
				continue
			}
			if n := max(lim-used[scope], 0) / o.gpusPerNode; n < can {
				can, short = n, scope
			}
		}
		used[pool] += can * o.gpusPerNode
		used[o.project] += can * o.gpusPerNode
		if can == want {
			continue
		}
		where := "the pool's max_gpus"
		if short != pool {
			where = fmt.Sprintf("project %s's max_gpus", short)
		}
		why := fmt.Sprintf("%d of its %d new nodes wait until draining nodes free their GPUs (%s is full", want-can, want, where)
		if fl := drainingIn[short]; len(fl) > 0 {
			slices.Sort(fl)
			why += " until the draining nodes of " + strings.Join(fl, ", ") + " are gone"
		}
		holds[a.Fleet] = drainHold{Nodes: a.From + can, Why: why + ")"}
	}
	return holds
}
