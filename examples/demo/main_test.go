package main

import (
	"slices"
	"testing"
)

func TestLostSteps(t *testing.T) {
	p := progress{}
	add := func(round, from, to int64, resumed bool) {
		if resumed {
			p.add(round, stepLine{Event: "resume", Step: from - 1})
		}
		for s := from; s <= to; s++ {
			p.add(round, stepLine{Event: "step", Step: s, WorldSize: 2})
		}
	}
	add(1, 1, 100, false)
	for range 3 { // the demo reads the same lines at every poll
		p.add(1, stepLine{Event: "checkpointed", Step: 100, Rank: 0})
		p.add(1, stepLine{Event: "checkpointed", Step: 100, Rank: 1})
	}
	add(2, 91, 150, true) // resumed at 90 after 100: 10 lost
	p.add(3, stepLine{Event: "resume", Step: 150})
	add(4, 151, 200, true) // round 3 ran nothing; round 4 resumed at 150 after 150: 0 lost
	add(5, 191, 195, true) // 5 lost: it ran 191..195, all run before
	chs, lost := p.changes()
	want := []change{
		{round: 2, from: 1, reached: 100, resumed: 90, lost: 10},
		{round: 4, from: 2, reached: 150, resumed: 150, lost: 0},
		{round: 5, from: 4, reached: 200, resumed: 190, lost: 5},
	}
	if !slices.Equal(chs, want) || lost != 15 {
		t.Fatalf("changes %+v, lost %d; want %+v, 15", chs, lost, want)
	}
	if r := p[1]; r.confirmed != 100 || len(r.confirmedBy) != 2 {
		t.Fatalf("round 1 confirmed step %d by %v, want 100 by ranks 0 and 1", r.confirmed, r.confirmedBy)
	}
}
