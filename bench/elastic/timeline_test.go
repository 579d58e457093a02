package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/fleetd/fleetd/bench/internal/driver"
)

// stepLine is a worker's step line at unix time at (began 0.1 s earlier).
func stepLine(step, ws, round int, at float64) string {
	return fmt.Sprintf(`{"event":"step","step":%d,"world_size":%d,"round":%d,"began":%f,"time":%f}`, step, ws, round, at-0.1, at)
}

func TestRecoveredInProcess(t *testing.T) {
	tl := NewTimeline()
	base := 1000.0
	for _, n := range []string{"a", "b"} {
		tl.Add(n, fmt.Sprintf(`{"event":"start","pid":%d,"round":1,"time":%f}`, len(n)+10, base))
		for s := 1; s <= 10; s++ {
			tl.Add(n, stepLine(s, 3, 1, base+float64(s)))
		}
		// the event at base+10.5: step 11 was in flight and completes in round 1
		tl.Add(n, stepLine(11, 3, 1, base+11))
		tl.Add(n, stepLine(12, 2, 2, base+11.4)) // began 11.3: 0.3 s pause after 11.0
	}
	o, ok := tl.Recovered([]string{"a", "b"}, "", driver.UnixTime(base+10.5), time.Time{})
	if !ok {
		t.Fatal("not recovered")
	}
	if d := o.TrainAgain - 0.8; d > 1e-6 || d < -1e-6 {
		t.Errorf("train again %.3f, want 0.8", o.TrainAgain)
	}
	if d := o.Pause - 0.3; d > 1e-6 || d < -1e-6 {
		t.Errorf("pause %.3f, want 0.3", o.Pause)
	}
	if o.LostSteps != 0 || o.CkptMiB != 0 || o.World != 2 {
		t.Errorf("%+v: want no lost step, no checkpoint read, world 2", o)
	}
}

func TestRecoveredRestartWithJoiner(t *testing.T) {
	tl := NewTimeline()
	base := 2000.0
	tl.Add("a", `[default0]:{"event":"start","pid":1,"time":2000}`)
	for s := 1; s <= 30; s++ {
		tl.Add("a", "[default0]:"+stepLine(s, 2, 0, base+float64(s)*0.1))
	}
	t0 := driver.UnixTime(base + 3.05)
	tl.Add("a", `[default0]:{"event":"start","pid":2,"time":2005}`)
	tl.Add("a", `[default0]:{"event":"resume","step":25,"bytes":104857600,"time":2006}`)
	tl.Add("a", "[default0]:"+stepLine(26, 3, 0, base+7))
	tl.Add("j", `{"event":"start","pid":3,"time":2005}`)
	tl.Add("j", `{"event":"elastic","what":"synced","sent":false,"bytes":104857600,"seconds":0.5,"time":2006.5}`)
	tl.Add("j", stepLine(26, 3, 0, base+7.2))
	o, ok := tl.Recovered([]string{"a", "j"}, "j", t0, time.Time{})
	if !ok {
		t.Fatal("not recovered")
	}
	if o.LostSteps != 5 || o.CkptMiB != 100 || o.TransferMiBs != 200 || o.TransferMiB != 100 {
		t.Errorf("%+v: want 5 lost steps, 100 MiB read, 100 MiB handed at 200 MiB/s", o)
	}
	if d := o.JoinerTrains - (7.1 - 3.05); d > 1e-3 || d < -1e-3 {
		t.Errorf("joiner trains %.3f", o.JoinerTrains)
	}
	if _, ok := tl.Recovered([]string{"a", "j"}, "j", driver.UnixTime(base+8), time.Time{}); ok {
		t.Error("recovered before any step after the event")
	}
}

// TestLostStepsCountOnce: a change that comes while the survivors still
// recover from the previous one (they did not train since) loses nothing
// of its own.
func TestLostStepsCountOnce(t *testing.T) {
	tl := NewTimeline()
	tl.Add("a", `{"event":"start","pid":1,"time":100}`)
	for s := 1; s <= 75; s++ {
		tl.Add("a", stepLine(s, 3, 1, 100+float64(s)*0.1))
	}
	kill := driver.UnixTime(107.55)
	tl.Add("a", `{"event":"start","pid":2,"time":109}`) // restarted after the kill, from step 50
	join := driver.UnixTime(109.5)                      // a joiner comes before it trained
	tl.Add("a", `{"event":"start","pid":3,"time":110}`) // restarted again, from step 50
	tl.Add("a", stepLine(51, 3, 3, 111))
	o, ok := tl.Recovered([]string{"a"}, "", kill, time.Time{})
	if !ok || o.LostSteps != 25 {
		t.Errorf("kill: %+v, %v; want 25 lost steps", o, ok)
	}
	if o, ok := tl.Recovered([]string{"a"}, "", join, kill); !ok || o.LostSteps != 0 {
		t.Errorf("join: %+v, %v; want no lost step of its own", o, ok)
	}
	// The same when the new process had not even printed its start yet.
	tl2 := NewTimeline()
	tl2.Add("a", `{"event":"start","pid":1,"time":100}`)
	for s := 1; s <= 75; s++ {
		tl2.Add("a", stepLine(s, 3, 1, 100+float64(s)*0.1))
	}
	tl2.Add("a", `{"event":"start","pid":3,"time":110}`)
	tl2.Add("a", stepLine(51, 3, 3, 111))
	if o, ok := tl2.Recovered([]string{"a"}, "", join, kill); !ok || o.LostSteps != 0 {
		t.Errorf("join before the restart printed: %+v, %v; want no lost step of its own", o, ok)
	}
}

// TestPauseOfANodeStillRecovering: a join comes while the survivors'
// restart after a kill is under way; their restarted process does a step,
// then is restarted again for the join. The pause runs from that step.
func TestPauseOfANodeStillRecovering(t *testing.T) {
	tl := NewTimeline()
	tl.Add("a", `{"event":"start","pid":1,"round":1,"time":100}`)
	for s := 1; s <= 75; s++ {
		tl.Add("a", stepLine(s, 3, 1, 100+float64(s)*0.1))
	}
	kill := driver.UnixTime(107.55)
	tl.Add("a", `{"event":"start","pid":2,"round":2,"time":108}`)
	join := driver.UnixTime(109.0)
	tl.Add("a", stepLine(51, 2, 2, 109.1)) // began 109.0
	tl.Add("a", `{"event":"start","pid":3,"round":3,"time":109.5}`)
	tl.Add("a", stepLine(52, 3, 3, 110.6)) // began 110.5
	o, ok := tl.Recovered([]string{"a"}, "", join, kill)
	if !ok {
		t.Fatal("not recovered")
	}
	if d := o.Pause - 1.4; d > 1e-6 || d < -1e-6 {
		t.Errorf("pause %.3f, want 1.4 (from the step in flight at the join to the next process's first)", o.Pause)
	}
	if d := o.TrainAgain - 1.5; d > 1e-6 || d < -1e-6 || o.LostSteps != 0 {
		t.Errorf("%+v: want train again 1.5 s, no lost step", o)
	}
}
