package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/fleetd/fleetd/bench/internal/driver"
)

func TestParseWorkerLine(t *testing.T) {
	tests := []struct {
		line string
		ok   bool
		want workerEvent
	}{
		{`{"event":"step","step":12,"world_size":3,"rank":1,"loss":0.5,"time":1700000000.25}`, true,
			workerEvent{Event: "step", Step: 12, WorldSize: 3, Rank: 1, Time: 1700000000.25}},
		{`[default0]:{"event":"start","rank":2,"world_size":3,"group_rank":2,"pid":77,"time":1700000001.5}`, true,
			workerEvent{Event: "start", Rank: 2, WorldSize: 3, GroupRank: 2, PID: 77, Time: 1700000001.5}},
		{`INFO:torch.distributed.elastic.agent.server.api:[default] Rendezvous'ing worker group`, false, workerEvent{}},
		{`  rdzv_configs     : {'is_host': '1', 'timeout': 900}`, false, workerEvent{}},
		{`[default0]:not json {`, false, workerEvent{}},
		{`{"event":"step","step":1}`, false, workerEvent{}}, // no time: not an event
		{`garbage {"event":"step","time":1}`, false, workerEvent{}},
	}
	for _, tt := range tests {
		got, ok := parseWorkerLine(tt.line)
		if ok != tt.ok || got != tt.want {
			t.Errorf("parseWorkerLine(%q) = %+v, %v; want %+v, %v", tt.line, got, ok, tt.want, tt.ok)
		}
	}
}

// feed writes a synthetic worker history: a start at startAt, an optional
// resume, then one step every 100 ms from firstStep.
func feed(tl *Timeline, node string, rank, ws int, startAt float64, resume int64, firstStep int64, steps int, stepAt float64) {
	tl.Add(node, fmt.Sprintf(`{"event":"start","rank":%d,"group_rank":%d,"world_size":%d,"time":%f}`, rank, rank, ws, startAt))
	if resume >= 0 {
		tl.Add(node, fmt.Sprintf(`[default0]:{"event":"resume","step":%d,"world_size":%d,"time":%f}`, resume, ws, startAt+0.5))
	}
	for i := range steps {
		tl.Add(node, fmt.Sprintf(`{"event":"step","step":%d,"world_size":%d,"rank":%d,"time":%f}`, firstStep+int64(i), ws, rank, stepAt+0.1*float64(i)))
	}
}

func TestRecovered(t *testing.T) {
	const t0 = 1000.0
	base := func() *Timeline {
		tl := NewTimeline()
		// Three nodes train steps 1..50 at world size 3 until t0-0.1.
		for i, n := range []string{"a", "b", "c"} {
			feed(tl, n, i, 3, t0-10, -1, 1, 50, t0-5)
		}
		return tl
	}
	tests := []struct {
		name   string
		build  func(tl *Timeline)
		nodes  []string
		ws     int
		ok     bool
		dur    time.Duration
		lost   int64
		wsWant int
	}{
		{"no restart yet", func(tl *Timeline) {}, []string{"a", "b"}, 0, false, 0, 0, 0},
		{"one survivor back", func(tl *Timeline) {
			feed(tl, "a", 0, 2, t0+3, 48, 49, 5, t0+6)
		}, []string{"a", "b"}, 0, false, 0, 0, 0},
		{"both back, slowest counts, 2 steps lost", func(tl *Timeline) {
			feed(tl, "a", 0, 2, t0+3, 48, 49, 5, t0+6)
			feed(tl, "b", 1, 2, t0+3, 48, 49, 5, t0+7.5)
		}, []string{"a", "b"}, 0, true, 7500 * time.Millisecond, 2, 2},
		{"started but not stepping does not count", func(tl *Timeline) {
			feed(tl, "a", 0, 2, t0+3, 50, 51, 5, t0+6)
			feed(tl, "b", 1, 2, t0+3, 50, 51, 0, 0)
		}, []string{"a", "b"}, 0, false, 0, 0, 0},
		{"world size filter skips the smaller round", func(tl *Timeline) {
			feed(tl, "a", 0, 2, t0+3, 50, 51, 3, t0+4)
			feed(tl, "b", 1, 2, t0+3, 50, 51, 3, t0+4)
			feed(tl, "a", 0, 3, t0+8, 53, 54, 3, t0+9)
			feed(tl, "b", 1, 3, t0+8, 53, 54, 3, t0+9)
			feed(tl, "d", 2, 3, t0+8, 53, 54, 3, t0+9.2)
		}, []string{"a", "b", "d"}, 3, true, 9200 * time.Millisecond, 0, 3},
		{"steps done after the event by the old incarnation are lost", func(tl *Timeline) {
			// torchrun after a notice: the old round keeps training to step 60.
			feed(tl, "a", 0, 3, t0-10, -1, 51, 10, t0+0.1)
			feed(tl, "a", 0, 2, t0+20, 55, 56, 2, t0+25)
			feed(tl, "b", 1, 2, t0+20, 55, 56, 2, t0+25)
		}, []string{"a", "b"}, 0, true, 25 * time.Second, 5, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tl := base()
			tt.build(tl)
			rec, ok := tl.Recovered(tt.nodes, driver.UnixTime(t0), tt.ws)
			if ok != tt.ok {
				t.Fatalf("ok = %v, want %v (%+v)", ok, tt.ok, rec)
			}
			if !ok {
				return
			}
			if d := rec.Duration - tt.dur; d < -time.Millisecond || d > time.Millisecond {
				t.Errorf("duration = %s, want %s", rec.Duration, tt.dur)
			}
			if rec.LostSteps != tt.lost || rec.WorldSize != tt.wsWant {
				t.Errorf("lost = %d, ws = %d; want %d, %d", rec.LostSteps, rec.WorldSize, tt.lost, tt.wsWant)
			}
		})
	}
}

func TestSteady(t *testing.T) {
	tl := NewTimeline()
	feed(tl, "a", 0, 3, 100, -1, 1, 40, 101) // steps 101.0 .. 104.9
	feed(tl, "b", 1, 3, 100, -1, 1, 10, 104) // steps 104.0 .. 104.9
	tests := []struct {
		nodes []string
		ws    int
		now   float64
		want  bool
	}{
		{[]string{"a"}, 3, 105, true},
		{[]string{"a", "b"}, 3, 105, false}, // b stepped for under 3 s
		{[]string{"a"}, 2, 105, false},      // wrong world size
		{[]string{"a"}, 3, 107, false},      // stalled
		{[]string{"a", "x"}, 3, 105, false}, // unknown node
	}
	for _, tt := range tests {
		if got := tl.Steady(tt.nodes, tt.ws, 3*time.Second, driver.UnixTime(tt.now)); got != tt.want {
			t.Errorf("Steady(%v, %d, now=%v) = %v, want %v", tt.nodes, tt.ws, tt.now, got, tt.want)
		}
	}
}

func TestStable(t *testing.T) {
	const t0 = 1000.0
	tl := NewTimeline()
	for i, n := range []string{"a", "b"} {
		feed(tl, n, i, 3, t0-10, -1, 1, 50, t0-5)
	}
	// Both restart at world size 2 for 2 s, then into a round of 3 that
	// lasts; b's second restart starts stepping later.
	feed(tl, "a", 0, 2, t0+2, 50, 51, 20, t0+3)
	feed(tl, "b", 1, 2, t0+2, 50, 51, 20, t0+3)
	if _, ok := tl.Stable([]string{"a", "b"}, driver.UnixTime(t0), 5*time.Second); ok {
		t.Fatal("stable before any incarnation ran 5 s")
	}
	feed(tl, "a", 0, 3, t0+6, 70, 71, 60, t0+8)
	feed(tl, "b", 1, 3, t0+6, 70, 71, 60, t0+8.5)
	d, ok := tl.Stable([]string{"a", "b"}, driver.UnixTime(t0), 5*time.Second)
	if !ok || d < 8499*time.Millisecond || d > 8501*time.Millisecond {
		t.Fatalf("Stable = %s, %v; want 8.5s", d, ok)
	}
	// The first, short restart is what Recovered reports.
	if rec, ok := tl.Recovered([]string{"a", "b"}, driver.UnixTime(t0), 0); !ok || rec.Duration != 3*time.Second {
		t.Fatalf("Recovered = %+v, %v; want 3s", rec, ok)
	}
}
