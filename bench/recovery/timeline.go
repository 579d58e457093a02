package main

import (
	"maps"
	"math"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/fleetd/fleetd/bench/internal/driver"
)

// The recovery figures come from the workers' own output: every line of
// examples/pytorch/ddp_train.py is a JSON event stamped by the worker
// ("time", unix seconds), so neither log shipping nor the harness's
// polling adds to a measured duration.

// workerEvent is the part of a worker's JSON line the benchmark reads.
type workerEvent struct {
	Event     string  `json:"event"`
	Time      float64 `json:"time"`
	Step      int64   `json:"step"`
	WorldSize int     `json:"world_size"`
	Rank      int     `json:"rank"`
	GroupRank int     `json:"group_rank"`
	PID       int     `json:"pid"`
}

// parseWorkerLine extracts a worker event from a line of output
// (driver.WorkerEvent); an event has a name and a time.
func parseWorkerLine(line string) (workerEvent, bool) {
	ev, ok := driver.WorkerEvent[workerEvent](line)
	if !ok || ev.Event == "" || ev.Time <= 0 {
		return workerEvent{}, false
	}
	return ev, true
}

// stepPoint is one completed training step.
type stepPoint struct {
	At        time.Time
	Step      int64
	WorldSize int
}

// incarnation is one run of a node's worker process: from its "start"
// event to its exit.
type incarnation struct {
	Start     time.Time
	Rank      int
	GroupRank int
	WorldSize int
	Resume    int64 // step resumed from; -1 without a checkpoint
	Steps     []stepPoint
}

// Timeline holds every node's incarnations in order.
type Timeline struct {
	mu    sync.Mutex
	nodes map[string][]*incarnation
}

// NewTimeline returns an empty timeline.
func NewTimeline() *Timeline { return &Timeline{nodes: map[string][]*incarnation{}} }

// Add feeds one output line of node's worker, in the order the worker
// wrote it. A "start" event opens a new incarnation; lines before the
// first start are ignored.
func (t *Timeline) Add(node, line string) {
	ev, ok := parseWorkerLine(line)
	if !ok {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	incs := t.nodes[node]
	switch ev.Event {
	case "start":
		t.nodes[node] = append(incs, &incarnation{Start: driver.UnixTime(ev.Time), Rank: ev.Rank, GroupRank: ev.GroupRank, WorldSize: ev.WorldSize, Resume: -1})
	case "resume":
		if len(incs) > 0 {
			incs[len(incs)-1].Resume = ev.Step
		}
	case "step":
		if len(incs) > 0 {
			in := incs[len(incs)-1]
			in.Steps = append(in.Steps, stepPoint{At: driver.UnixTime(ev.Time), Step: ev.Step, WorldSize: ev.WorldSize})
		}
	}
}

// Reset forgets a node (its output is about to be fed again from the start).
func (t *Timeline) Reset(node string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.nodes, node)
}

// Nodes returns the nodes seen, sorted.
func (t *Timeline) Nodes() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Sorted(maps.Keys(t.nodes))
}

// Current returns a node's latest incarnation (zero value and false if none).
func (t *Timeline) Current(node string) (incarnation, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	incs := t.nodes[node]
	if len(incs) == 0 {
		return incarnation{}, false
	}
	return *incs[len(incs)-1], true
}

// Steady reports whether each node's latest incarnation runs at world
// size ws, has been stepping for at least span, and stepped within the
// last second before now.
func (t *Timeline) Steady(nodes []string, ws int, span time.Duration, now time.Time) bool {
	for _, n := range nodes {
		in, ok := t.Current(n)
		if !ok || len(in.Steps) == 0 || in.WorldSize != ws {
			return false
		}
		first, last := in.Steps[0].At, in.Steps[len(in.Steps)-1].At
		if last.Sub(first) < span || now.Sub(last) > time.Second {
			return false
		}
	}
	return true
}

// Recovery is what one scenario measured.
type Recovery struct {
	// Duration: from the event to the moment the last of the nodes ran a
	// training step again (in an incarnation started after the event).
	Duration time.Duration
	// LostSteps: steps completed before the event's restart that the
	// restarted workers did again (last step completed by any worker of an
	// older incarnation − the step the new incarnations resumed from).
	LostSteps int64
	// WorldSize of the new incarnations.
	WorldSize int
}

// Recovered looks, on each of nodes, for the first incarnation started
// after t0 (at world size ws when ws > 0) that completed a step. ok is
// false while some node has none.
func (t *Timeline) Recovered(nodes []string, t0 time.Time, ws int) (Recovery, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var rec Recovery
	resume := int64(math.MaxInt64)
	for _, n := range nodes {
		var found *incarnation
		for _, in := range t.nodes[n] {
			if in.Start.Before(t0) || len(in.Steps) == 0 || (ws > 0 && in.WorldSize != ws) {
				continue
			}
			found = in
			break
		}
		if found == nil {
			return Recovery{}, false
		}
		rec.Duration = max(rec.Duration, found.Steps[0].At.Sub(t0))
		rec.WorldSize = found.WorldSize
		resume = min(resume, found.Steps[0].Step-1)
	}
	// The newest step any earlier incarnation (of any node) completed.
	var last int64
	for _, incs := range t.nodes {
		for _, in := range incs {
			if !in.Start.Before(t0) {
				continue
			}
			for _, s := range in.Steps {
				last = max(last, s.Step)
			}
		}
	}
	rec.LostSteps = max(last-resume, 0)
	return rec, true
}

// Start is one worker start, for explaining a recovery.
type Start struct {
	Node      string
	At        time.Time
	Rank      int
	WorldSize int
	// FirstStep is when the incarnation completed its first step (zero if
	// it never did).
	FirstStep time.Time
}

// Starts lists the worker starts in [from, to], in time order.
func (t *Timeline) Starts(from, to time.Time) []Start {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Start
	for n, incs := range t.nodes {
		for _, in := range incs {
			if in.Start.Before(from) || in.Start.After(to) {
				continue
			}
			s := Start{Node: n, At: in.Start, Rank: in.Rank, WorldSize: in.WorldSize}
			if len(in.Steps) > 0 {
				s.FirstStep = in.Steps[0].At
			}
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out
}

// Stable is like Recovered but waits for the restart that lasts: on each
// node, the first incarnation started after t0 whose steps span at least
// span (later restarts, e.g. into a bigger round a moment later, are
// part of the recovery). It returns when the last node began that
// incarnation's first step, after t0.
func (t *Timeline) Stable(nodes []string, t0 time.Time, span time.Duration) (time.Duration, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var worst time.Duration
	for _, n := range nodes {
		found := false
		for _, in := range t.nodes[n] {
			if in.Start.Before(t0) || len(in.Steps) == 0 {
				continue
			}
			if in.Steps[len(in.Steps)-1].At.Sub(in.Steps[0].At) >= span {
				worst = max(worst, in.Steps[0].At.Sub(t0))
				found = true
				break
			}
		}
		if !found {
			return 0, false
		}
	}
	return worst, true
}
