package rendezvous

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

// snapshotCases builds machines in each interesting state.
func snapshotCases(t *testing.T) map[string]*Machine {
	s := time.Second
	out := map[string]*Machine{}
	run := func(name string, cfg Config, steps []step) {
		h := newHarness(t, cfg)
		for _, st := range steps {
			h.advance(t0.Add(st.at))
			if st.op != nil {
				st.op(h.m, h.now)
			}
		}
		out[name] = h.m
	}
	run("closed with standbys and exclusions", testConfig(2, 3), []step{
		{at: 0, op: joinZ("a", "z1", 2)}, {at: 0, op: joinZ("b", "z2", 2)}, {at: 0, op: joinZ("c", "z1", 4)},
		{at: s, op: exclude("b")}, {at: 2 * s, op: join("d")}, {at: 7 * s}, {at: 8 * s, op: join("e")},
		{at: 9 * s, op: exclude("never-joined")},
	})
	run("closed right after a notice", testConfig(2, 3), []step{
		{at: 0, op: join("a")}, {at: 0, op: join("b")}, {at: 0, op: join("c")}, {at: s, op: exclude("c")},
	})
	run("open after a loss below min", testConfig(3, 4), []step{
		{at: 0, op: join("a")}, {at: 0, op: join("b")}, {at: 0, op: join("c")}, {at: 5 * s},
		{at: 6 * s, op: leave("b")},
	})
	run("open in last call", testConfig(2, 4), []step{
		{at: 0, op: join("a")}, {at: s, op: join("b")},
	})
	run("finished", testConfig(1, 4), []step{
		{at: 0, op: join("a")}, {at: 5 * s}, {at: 6 * s, op: finish(false)},
	})
	return out
}

func TestSnapshotRestoreExact(t *testing.T) {
	for name, m := range snapshotCases(t) {
		t.Run(name, func(t *testing.T) {
			r := checkRestore(t, m, t0.Add(10*time.Hour)) // the daemon was down for hours
			checkInvariants(t, r)
			for _, id := range []string{"a", "b", "c", "d", "e", "never-joined", "zz"} {
				v1, v2 := m.View(id), r.View(id)
				j1, _ := json.Marshal(v1)
				j2, _ := json.Marshal(v2)
				if !bytes.Equal(j1, j2) {
					t.Errorf("view of %s: %s, restored %s", id, j1, j2)
				}
			}
		})
	}
}

func TestRestoreGivesGraceAndKeepsRounds(t *testing.T) {
	m := snapshotCases(t)["closed with standbys and exclusions"]
	round, _ := m.Round()
	members := len(m.members)
	later := t0.Add(10 * time.Hour)
	r, err := Restore(m.Snapshot(), later)
	if err != nil {
		t.Fatal(err)
	}
	if eff := r.Tick(later); len(eff.Events) != 0 {
		t.Fatalf("restore dropped members for the daemon's downtime: %v", eff.Events)
	}
	if n := r.Next(later); !n.Equal(later.Add(r.cfg.DeadAfter)) {
		t.Fatalf("Next after restore %s, want now+dead_after", n.Sub(later))
	}
	if len(r.members) != members {
		t.Fatalf("%d members after restore, want %d", len(r.members), members)
	}
	// Silent for dead_after from the restore: everyone goes, and the round
	// number continues where it was.
	r.Tick(later.Add(r.cfg.DeadAfter))
	if got, st := r.Round(); got != round+1 || st != RoundOpen || len(r.members) != 0 {
		t.Fatalf("after silence: round %d %s with %d members, want round %d open and empty", got, st, len(r.members), round+1)
	}
}

func TestRestoreRejectsBadSnapshots(t *testing.T) {
	good := snapshotCases(t)["closed with standbys and exclusions"].Snapshot()
	for name, mut := range map[string]func(*Snapshot){
		"version":        func(s *Snapshot) { s.Version = 99 },
		"config":         func(s *Snapshot) { s.Config.MinNodes = 0 },
		"round":          func(s *Snapshot) { s.Round = 0 },
		"state":          func(s *Snapshot) { s.State = "paused" },
		"duplicate":      func(s *Snapshot) { s.Members = append(s.Members, s.Members[0]) },
		"unknown ranked": func(s *Snapshot) { s.Order = append(s.Order, "ghost") },
		"bad member":     func(s *Snapshot) { s.Members[0].Addr = "nowhere" },
	} {
		s := good
		s.Members = append([]SnapshotMember(nil), good.Members...)
		s.Order = append([]string(nil), good.Order...)
		mut(&s)
		if _, err := Restore(s, t0); err == nil {
			t.Errorf("%s: restored", name)
		}
	}
}
