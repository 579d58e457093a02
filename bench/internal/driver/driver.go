// Package driver is what the recovery and elastic benchmarks share: the
// torchrun agents they run as local "nodes" (Torchrun), the fleetd dev
// daemon they run the same job under (Fleetd, Spec), the workers' event
// lines they time recoveries by (WorkerEvent), and the notes that explain
// a recovery.
package driver

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
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

// WorkerEvent decodes one output line of a worker, a JSON event stamped
// by the worker itself, into a T: raw (fleetd's per-rank log files) or
// behind torchrun's tee prefix ("[default0]:{...}"). ok is false for any
// other line; which events count is the caller's check.
func WorkerEvent[T any](line string) (ev T, ok bool) {
	line = strings.TrimSpace(line)
	i := strings.IndexByte(line, '{')
	if i < 0 || i > 0 && !teePrefix.MatchString(line[:i]) {
		return ev, false
	}
	if err := json.Unmarshal([]byte(line[i:]), &ev); err != nil {
		var zero T
		return zero, false
	}
	return ev, true
}

// teePrefix is what torchrun -t puts before each worker output line.
var teePrefix = regexp.MustCompile(`^\[[^\]]*\]:$`)

// UnixTime is a worker's time stamp (unix seconds) as a time.
func UnixTime(s float64) time.Time {
	sec, frac := math.Modf(s)
	return time.Unix(int64(sec), int64(frac*1e9))
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
