package controller

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/state"
)

// Concurrent launch outcomes share transactions; each caller learns its own
// body's result, and a failing body costs only its own writes.
func TestGroupCommitterIsolatesFailures(t *testing.T) {
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	c := New(Options{Store: st})
	for _, tc := range []struct {
		name    string
		bodies  int
		failing map[int]bool
	}{
		{"one", 1, nil},
		{"many", 300, nil},
		{"one fails", 1, map[int]bool{0: true}},
		{"some fail among many", 300, map[int]bool{0: true, 17: true, 299: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			bad := errors.New("invalid body")
			key := func(i int) string { return fmt.Sprintf("groupcommit-test/%s/%d", tc.name, i) }
			in := c.groupCommitter(ctx)
			errs := make([]error, tc.bodies)
			var wg sync.WaitGroup
			for i := range tc.bodies {
				wg.Go(func() {
					done := make(chan error, 1)
					in <- groupedUpdate{done: done, fn: func(tx state.Tx) error {
						if err := tx.SetMeta(key(i), []byte("x")); err != nil {
							return err
						}
						if tc.failing[i] {
							return bad
						}
						return nil
					}}
					errs[i] = <-done
				})
			}
			wg.Wait()
			close(in)
			err := st.View(ctx, func(tx state.Tx) error {
				for i := range tc.bodies {
					v, err := tx.Meta(key(i))
					if err != nil {
						return err
					}
					if tc.failing[i] {
						if !errors.Is(errs[i], bad) || len(v) != 0 {
							t.Errorf("failing body %d: err %v, written %q", i, errs[i], v)
						}
					} else if errs[i] != nil || string(v) != "x" {
						t.Errorf("body %d: err %v, written %q", i, errs[i], v)
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
