package main

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleetd/bench/internal/driver"
)

// wev is one JSON line of examples/pytorch/elastic_train.py or of its
// helper fleetd_elastic, stamped by the worker itself.
type wev struct {
	Event     string  `json:"event"`
	What      string  `json:"what"`
	Time      float64 `json:"time"`
	Began     float64 `json:"began"`
	Step      int64   `json:"step"`
	WorldSize int     `json:"world_size"`
	Rank      int     `json:"rank"`
	Round     int     `json:"round"`
	PID       int     `json:"pid"`
	Bytes     int64   `json:"bytes"`
	Seconds   float64 `json:"seconds"`
	MiBs      float64 `json:"mib_per_s"`
	Sent      bool    `json:"sent"`
	Why       string  `json:"why"`
	StateMiB  float64 `json:"state_mib"`

	pid int    // the process that printed it (from the node's last start line)
	inc string // the incarnation: process and round
}

func (e wev) at() time.Time    { return driver.UnixTime(e.Time) }
func (e wev) began() time.Time { return driver.UnixTime(e.Began) }

// Timeline is every worker event of a run, per node.
type Timeline struct {
	mu     sync.Mutex
	byNode map[string][]wev
	sorted map[string]bool
}

func NewTimeline() *Timeline { return &Timeline{byNode: map[string][]wev{}, sorted: map[string]bool{}} }

// Add takes one output line of a node's worker.
func (t *Timeline) Add(node, line string) {
	e, ok := driver.WorkerEvent[wev](line)
	if !ok || e.Event == "" || e.Time == 0 {
		return
	}
	t.mu.Lock()
	t.byNode[node] = append(t.byNode[node], e)
	t.sorted[node] = false
	t.mu.Unlock()
}

// events returns a node's events in time order, each attributed to its
// process and incarnation.
func (t *Timeline) events(node string) []wev {
	t.mu.Lock()
	defer t.mu.Unlock()
	evs := t.byNode[node]
	if !t.sorted[node] {
		sort.SliceStable(evs, func(i, j int) bool { return evs[i].Time < evs[j].Time })
		pid := 0
		for i := range evs {
			if evs[i].Event == "start" && evs[i].PID > 0 {
				pid = evs[i].PID
			}
			evs[i].pid = pid
			evs[i].inc = fmt.Sprintf("%d/%d", pid, evs[i].Round)
		}
		t.sorted[node] = true
	}
	return append([]wev(nil), evs...)
}

// lastStep is the node's last step event before t (ok false: none).
func (t *Timeline) lastStep(node string, before time.Time) (wev, bool) {
	var last wev
	ok := false
	for _, e := range t.events(node) {
		if e.Event == "step" && e.at().Before(before) {
			last, ok = e, true
		}
	}
	return last, ok
}

// MaxStep is the highest step any of nodes completed.
func (t *Timeline) MaxStep(nodes []string) int64 {
	var m int64
	for _, n := range nodes {
		for _, e := range t.events(n) {
			if e.Event == "step" && e.Step > m {
				m = e.Step
			}
		}
	}
	return m
}

// Rank is the rank of the node's last step.
func (t *Timeline) Rank(node string) (int, bool) {
	e, ok := t.lastStep(node, time.Now().Add(time.Hour))
	return e.Rank, ok
}

// Steady reports whether every node completed steps at world size ws
// over the last span.
func (t *Timeline) Steady(nodes []string, ws int, span time.Duration, now time.Time) bool {
	for _, n := range nodes {
		var first, last time.Time
		for _, e := range t.events(n) {
			if e.Event != "step" {
				continue
			}
			if e.WorldSize != ws {
				first, last = time.Time{}, time.Time{}
				continue
			}
			if first.IsZero() {
				first = e.at()
			}
			last = e.at()
		}
		if first.IsZero() || now.Sub(first) < span || now.Sub(last) > span {
			return false
		}
	}
	return true
}

// StateMiB is the model's parameters plus optimizer state, as a worker
// reported it.
func (t *Timeline) StateMiB(nodes []string) float64 {
	for _, n := range nodes {
		for _, e := range t.events(n) {
			if e.Event == "ready" && e.StateMiB > 0 {
				return e.StateMiB
			}
		}
	}
	return 0
}

// Outcome is what one membership change cost.
type Outcome struct {
	// TrainAgain: from the event until every survivor (and the joiner)
	// began a step in a new incarnation (a new process, or in-process a
	// new round).
	TrainAgain float64
	// Pause: the longest time a survivor did not train: from its last
	// step of the old incarnation (or the event, if later) to its first
	// step of the new one.
	Pause float64
	// LostSteps: steps done before the change that were done again.
	LostSteps int64
	// CkptMiB: checkpoint data read by the new incarnations' workers.
	CkptMiB float64
	// JoinerTrains: from the event until the joiner began its first step.
	JoinerTrains float64
	// TransferMiBs, TransferMiB: the state handed to the joiner by
	// broadcast (from a survivor, or from rank 0 after it read the
	// checkpoint), as the receiving worker measured it.
	TransferMiBs, TransferMiB float64
	Recovered                 time.Time
	World                     int
}

// Recovered reports the outcome once every node of nodes (the survivors,
// and the joiner if any) trains in a new incarnation after t0. prev is the
// previous change (zero: none): a node that trained last before it was
// still recovering from it at t0, and its losses are counted there.
func (t *Timeline) Recovered(nodes []string, joiner string, t0, prev time.Time) (Outcome, bool) {
	var o Outcome
	for _, n := range nodes {
		evs := t.events(n)
		// old is the incarnation the node trained in at t0: none for a
		// joiner, nor for a node whose new process had not trained yet (it
		// was still recovering from an earlier change).
		old := ""
		if n != joiner {
			var start wev
			for _, e := range evs {
				if !e.at().Before(t0) {
					break
				}
				switch e.Event {
				case "step":
					old = e.inc
				case "start":
					start = e
				}
			}
			if start.PID != 0 && !strings.HasPrefix(old, fmt.Sprintf("%d/", start.PID)) {
				// A process started after the node's last step: the node was
				// still recovering at t0; that process is the incarnation
				// the event interrupts (its steps after t0 are in flight).
				old = fmt.Sprintf("%d/%d", start.PID, start.Round)
			} else if old != "" && !prev.IsZero() {
				var last time.Time
				for _, e := range evs {
					if e.Event == "step" && e.inc == old && e.at().Before(t0) {
						last = e.at()
					}
				}
				if last.Before(prev) {
					old = "" // it had not trained since the previous change (its restart had not printed yet)
				}
			}
		}
		var first *wev
		var lastOld wev
		hasOld := false
		for i, e := range evs {
			if e.Event != "step" {
				continue
			}
			if old != "" && e.inc == old {
				lastOld, hasOld = e, true // the old incarnation's steps, in flight at t0 included
				continue
			}
			if e.at().After(t0) {
				first = &evs[i]
				break
			}
		}
		if first == nil {
			return o, false
		}
		o.TrainAgain = max(o.TrainAgain, first.began().Sub(t0).Seconds())
		o.World = first.WorldSize
		if o.Recovered.Before(first.at()) {
			o.Recovered = first.at()
		}
		if n == joiner {
			o.JoinerTrains = first.began().Sub(t0).Seconds()
			continue
		}
		from := t0
		if hasOld && lastOld.at().After(from) {
			from = lastOld.at()
		}
		o.Pause = max(o.Pause, first.began().Sub(from).Seconds())
		// Steps the incarnation running at the event completed (in flight
		// at t0 included) and the new one does again. (Steps an earlier
		// change already lost count there, not here.)
		if hasOld {
			var done int64
			for _, e := range evs {
				if e.Event == "step" && e.inc == old {
					done = max(done, e.Step)
				}
			}
			o.LostSteps = max(o.LostSteps, done-(first.Step-1))
		}
	}
	// Checkpoint reads and the joiner's state, from t0 to the recovery.
	for _, n := range nodes {
		for _, e := range t.events(n) {
			if e.at().Before(t0) || e.at().After(o.Recovered) {
				continue
			}
			if e.Event == "resume" {
				o.CkptMiB += float64(e.Bytes) / (1 << 20)
			}
			if e.Event == "elastic" && e.What == "synced" && !e.Sent && (n == joiner || joiner == "") && e.Seconds > 0 {
				rate := float64(e.Bytes) / (1 << 20) / e.Seconds
				if o.TransferMiBs == 0 || rate < o.TransferMiBs {
					o.TransferMiBs, o.TransferMiB = rate, float64(e.Bytes)/(1<<20)
				}
			}
		}
	}
	return o, true
}

// Starts lists the worker processes started between from and to, with
// their first step, for the explanations.
func (t *Timeline) Starts(nodes []string, from, to time.Time) []note {
	var out []note
	for _, n := range nodes {
		evs := t.events(n)
		for i, e := range evs {
			if e.Event != "start" || e.at().Before(from) || e.at().After(to) {
				continue
			}
			w := fmt.Sprintf("worker start: node %s pid %d rank %d world size %d", n, e.PID, e.Rank, e.WorldSize)
			for _, f := range evs[i+1:] {
				if f.Event == "step" && f.pid == e.PID {
					w += fmt.Sprintf(", first step %d began %s", f.Step, f.began().Format("15:04:05.000"))
					break
				}
			}
			out = append(out, note{At: e.at(), What: w})
		}
	}
	return out
}
