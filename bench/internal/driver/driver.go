// Package driver is what the recovery and elastic benchmarks share: the
// torchrun agents they run as local "nodes" (Torchrun), the fleetd dev
// daemon they run the same job under (Fleetd, Spec), and the notes that
// explain a recovery.
package driver

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// Note is one line of a recovery's explanation.
type Note struct {
	At   time.Time
	What string
}

// Between keeps the notes from from to to (inclusive).
func Between(notes []Note, from, to time.Time) []Note {
	var out []Note
	for _, n := range notes {
		if !n.At.Before(from) && !n.At.After(to) {
			out = append(out, n)
		}
	}
	return out
}

// Say prints a progress line with the wall-clock time.
func Say(format string, args ...any) {
	fmt.Printf("[%s] %s\n", time.Now().Format("15:04:05.0"), fmt.Sprintf(format, args...))
}

// Without returns list without x.
func Without(list []string, x string) []string {
	var out []string
	for _, s := range list {
		if s != x {
			out = append(out, s)
		}
	}
	return out
}

// Abs makes every path absolute (the benchmarks change directories for
// the processes they start).
func Abs(paths ...*string) error {
	for _, p := range paths {
		a, err := filepath.Abs(*p)
		if err != nil {
			return err
		}
		*p = a
	}
	return nil
}

// Run is a benchmark run's work directory, under os.TempDir.
type Run struct {
	Prog string
	Work string
	// Keep keeps the work directory at End; so does Failed (set by the
	// benchmark when a system errs or a scenario does not recover).
	Keep, Failed bool
	stop         context.CancelFunc
}

// Begin makes the run's work directory and a context that ends on an
// interrupt or SIGTERM (or at End). Defer End.
func Begin(prog string, keep bool) (*Run, context.Context, error) {
	work, err := os.MkdirTemp("", "fleetd-bench-"+prog+"-")
	if err != nil {
		return nil, nil, err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	return &Run{Prog: prog, Work: work, Keep: keep, stop: stop}, ctx, nil
}

// End ends the run's context and removes the work directory, or says
// where the logs are kept.
func (r *Run) End() {
	r.stop()
	if r.Keep || r.Failed {
		fmt.Printf("%s: logs kept in %s\n", r.Prog, r.Work)
		return
	}
	os.RemoveAll(r.Work)
}

// Latest holds the newest of a value rebuilt in the background (a
// timeline Follow rebuilds from the nodes' logs).
type Latest[T any] struct {
	mu sync.Mutex
	v  T
}

// Set replaces the value.
func (l *Latest[T]) Set(v T) {
	l.mu.Lock()
	l.v = v
	l.mu.Unlock()
}

// Get returns the newest value.
func (l *Latest[T]) Get() T {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.v
}
