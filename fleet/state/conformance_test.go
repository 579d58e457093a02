package state_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/fleet/state/statetest"
)

func TestConformance(t *testing.T) {
	stores := []struct {
		name string
		new  statetest.Factory
	}{
		{"bolt", func(t *testing.T, now func() time.Time) state.Store {
			// NoSync: these tests are about semantics; durability is
			// exercised by the reopen tests, which fsync.
			s, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{NoSync: true, Now: now})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		}},
		{"memory", func(t *testing.T, now func() time.Time) state.Store {
			s := state.NewMemoryWithClock(now)
			t.Cleanup(func() { _ = s.Close() })
			return s
		}},
	}
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) { statetest.Run(t, st.new) })
	}
}
