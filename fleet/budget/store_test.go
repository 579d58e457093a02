package budget_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/budget"
	"github.com/fleetd/fleetd/fleet/state"
)

// TestLedgerInStateFile: the ledger saved in the daemon's bbolt state
// file is there after the file is closed and opened again (a restart),
// with its spend and its alert memory.
func TestLedgerInStateFile(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.db")
	t0 := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	limits := func(kind, name string) (budget.Limits, bool) { return budget.Limits{Total: 10}, kind == "project" }

	st, err := state.Open(path, state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Update(ctx, func(tx state.Tx) error {
		l, err := budget.Load(tx)
		if err != nil {
			return err
		}
		l.Observe(t0, "resnet", "vision", budget.Spend{Spot: 6, OnDemand: 2.5}, budget.Spend{Spot: 1})
		if a := l.Alerts(t0, limits); len(a) != 1 || a[0].To != budget.Warn {
			t.Errorf("alerts %+v", a)
		}
		return l.Save(tx)
	}); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	st, err = state.Open(path, state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.View(ctx, func(tx state.Tx) error {
		l, err := budget.Load(tx)
		if err != nil {
			return err
		}
		s := l.ProjectStatus("vision", budget.Limits{Total: 10}, t0.Add(30*time.Minute))
		if s.Total != 9 || s.State != budget.Warn {
			t.Errorf("after reopening: $%g %s, want $9 warn", s.Total, s.State)
		}
		if a := l.Alerts(t0.Add(30*time.Minute), limits); len(a) != 0 {
			t.Errorf("the warning is raised again after a restart: %+v", a)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
