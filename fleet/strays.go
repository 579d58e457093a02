package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

// Strays: instances that carry this daemon's id but belong to no fleet it
// knows — left by a destroy that did not finish, or launched after the
// backup the state was restored from. A fleet's pass only lists its own
// name, so nothing else would ever see them. The daemon never touches
// them (they may be another copy's, see docs/security.md); it reports
// each once, as an event and in the log, for an operator to delete.

// defaultStrayScan is how often the scan runs (its first run is a minute
// after start, when a restored state is most likely).
const defaultStrayScan = 5 * time.Minute

type strayScan struct {
	mu       sync.Mutex
	last     time.Time
	reported map[string]bool // instance ids
}

// due reports whether a scan should run now, and marks it as run. The
// first scan waits min(every, strayFirstDelay) after the first pass, so
// a daemon's start (adoption of in-flight launches) is not crowded by
// an extra listing.
func (s *strayScan) due(now time.Time, every time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last.IsZero() {
		s.last = now.Add(-every + min(every, strayFirstDelay))
		return false
	}
	if now.Sub(s.last) < every {
		return false
	}
	s.last = now
	return true
}

const strayFirstDelay = time.Minute

func (s *strayScan) first(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reported == nil {
		s.reported = map[string]bool{}
	}
	if s.reported[id] {
		return false
	}
	s.reported[id] = true
	return true
}

// scanStrays lists, through each distinct provider configuration the
// current fleets use, the instances tagged with this daemon's id, and
// reports those whose fleet name is not a current fleet. (Other
// incarnations of a current fleet are the fleet's own other-incarnation
// alerts.)
func (d *Daemon) scanStrays(ctx context.Context, fleets []state.Fleet) {
	every := d.opts.StrayScan
	if every <= 0 {
		every = defaultStrayScan
	}
	if d.daemonID == "" || !d.strays.due(d.now(), every) {
		return
	}
	current := make(map[string]bool, len(fleets))
	for _, f := range fleets {
		current[f.Name] = true
	}
	seen := map[string]bool{} // provider + config: list each scope once
	d.eachProvider(ctx, fleets, func(_ state.Fleet, name string, p providers.Provider, cfg providers.Config) {
		key := name + "\x00" + string(cfg.Raw)
		if seen[key] {
			return
		}
		seen[key] = true
		lctx, cancel := context.WithTimeout(ctx, time.Minute)
		insts, err := p.List(lctx, cfg, map[string]string{providers.TagDaemonID: d.daemonID})
		cancel()
		if err != nil {
			d.log.Debug("stray scan: list", "provider", name, "err", err)
			return
		}
		sort.Slice(insts, func(i, j int) bool { return insts[i].ID < insts[j].ID })
		for _, in := range insts {
			fleet := in.Tags[providers.TagFleet]
			if in.State == providers.StateTerminated || in.State == providers.StateStopping || current[fleet] || !d.strays.first(in.ID) {
				continue
			}
			msg := fmt.Sprintf("instance %s (%s) carries this daemon's id and fleet %q, incarnation %q, node %q, but this daemon has no fleet %q: a destroy that did not finish, or a state restored from an older backup, left it; fleetd will not touch it — delete it by hand if it is stray",
				in.ID, in.Offering.Key(), fleet, in.Tags[providers.TagIncarnation], in.Tags[providers.TagNodeID], fleet)
			d.log.Warn("stray instance", "instance", in.ID, "fleet", fleet, "incarnation", in.Tags[providers.TagIncarnation])
			data, _ := json.Marshal(in.Tags)
			d.appendEvent(ctx, state.Event{Fleet: fleet, Incarnation: in.Tags[providers.TagIncarnation], Type: "instance.stray", Message: msg,
				Data: map[string]string{"instance": in.ID, "provider": name, "fleet": fleet, "tags": string(data)}})
		}
	})
}
