package rendezvous

import (
	"testing"
	"time"
)

// TestExcludeUntilCarriesDeadline: the round that replaces a running round
// after ExcludeUntil tells every survivor (and the excluded node) when the
// node with the notice goes away, and a snapshot keeps it.
func TestExcludeUntilCarriesDeadline(t *testing.T) {
	m, err := NewMachine(testConfig(2, 3), "run", t0)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "c"} {
		join(id)(m, t0)
	}
	if r, st := m.Round(); r != 1 || st != RoundClosed {
		t.Fatalf("round %d %s, want 1 closed", r, st)
	}
	deadline := t0.Add(2 * time.Minute)
	m.ExcludeUntil(t0.Add(time.Second), "c", "spot-interruption notice", deadline)
	for _, id := range []string{"a", "b"} {
		v := m.View(id)
		if v.State != NodeAssigned || v.Cause != CauseNotice || !v.NoticeDeadline.Equal(deadline) {
			t.Errorf("%s: view %+v, want assigned with cause notice and deadline %v", id, v, deadline)
		}
	}
	if v := m.View("c"); v.State != NodeExcluded || !v.NoticeDeadline.Equal(deadline) {
		t.Errorf("excluded node's view %+v, want its deadline", v)
	}
	_, s := snapshotJSON(t, m)
	r, err := Restore(s, t0.Add(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if v := r.View("a"); !v.NoticeDeadline.Equal(deadline) || v.Cause != CauseNotice {
		t.Errorf("restored view %+v, want the deadline", v)
	}
	if v := r.View("c"); !v.NoticeDeadline.Equal(deadline) {
		t.Errorf("restored excluded view %+v, want the deadline", v)
	}
	// A plain Exclude (no deadline) and a later round without a notice
	// carry none.
	join("d")(m, t0.Add(3*time.Second))
	m.Tick(t0.Add(10 * time.Second))
	if v := m.View("a"); v.Round == 2 || !v.NoticeDeadline.IsZero() || v.Cause != "" {
		t.Errorf("after a join: view %+v, want a later round without cause or deadline", v)
	}
	m.Exclude(t0.Add(11*time.Second), "d", "maintenance")
	if v := m.View("a"); v.Cause != CauseNotice || !v.NoticeDeadline.IsZero() {
		t.Errorf("after a plain Exclude: view %+v, want cause notice without a deadline", v)
	}
}
