// Package report formats benchmark figures as one summary line each,
//
//	FIGURE <name> = <value> <unit> (target <op> <t> <unit>) PASS|FAIL
//	FIGURE <name> = <value> <unit> (info)
//	FIGURE <name> = n/a <unit> (…) FAIL MISSING: <why>
//
// so a regression is visible at a glance and bench/run.sh can collect the
// lines of every benchmark program into one summary. A figure that could
// not be measured is a miss whether or not it has a target: a run that
// never recovers must not read as a pass. It also reads the process's own
// CPU time and resident memory from the kernel.
//
// BENCH_FORCE_MISS=<regexp> gives every figure whose name matches an
// impossible target, so that the path from a miss to a failing `make
// bench` can be exercised on demand (bench/run.sh documents it).
package report

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Op is how a figure is compared with its target.
type Op string

// Comparison operators of a target.
const (
	Less     Op = "<"
	AtMost   Op = "<="
	AtLeast  Op = ">="
	NoTarget Op = ""
)

const infoLabel = "info"

// Target is the bound a figure must meet.
type Target struct {
	Op    Op
	Value float64
}

// Figure is one measured number.
type Figure struct {
	Name   string  `json:"name"`
	Value  float64 `json:"value"`
	Unit   string  `json:"unit"`
	Target Target  `json:"-"`
	// Missing is set when the measurement could not be made (the
	// benchmark failed); the figure then fails its target.
	Missing string `json:"missing,omitempty"`
}

// HasTarget reports whether the figure is compared with a target.
func (f Figure) HasTarget() bool { return f.Target.Op != NoTarget }

// Miss reports whether the figure counts against the run: it was not
// measured, or it missed its target.
func (f Figure) Miss() bool { return f.Missing != "" || (f.HasTarget() && !f.Pass()) }

// Pass reports whether the figure meets its target (false when missing).
func (f Figure) Pass() bool {
	if f.Missing != "" || math.IsNaN(f.Value) {
		return false
	}
	switch f.Target.Op {
	case Less:
		return f.Value < f.Target.Value
	case AtMost:
		return f.Value <= f.Target.Value
	case AtLeast:
		return f.Value >= f.Target.Value
	}
	return true
}

// Line renders the summary line of f.
func (f Figure) Line() string {
	val := "n/a"
	if f.Missing == "" {
		val = Format(f.Value)
	}
	unit := ""
	if f.Unit != "" {
		unit = " " + f.Unit
	}
	if !f.HasTarget() {
		if f.Missing != "" {
			return fmt.Sprintf("FIGURE %s = %s%s (info) FAIL MISSING: %s", f.Name, val, unit, f.Missing)
		}
		return fmt.Sprintf("FIGURE %s = %s%s (info)", f.Name, val, unit)
	}
	verdict := "FAIL"
	if f.Pass() {
		verdict = "PASS"
	}
	s := fmt.Sprintf("FIGURE %s = %s%s (target %s %s%s) %s", f.Name, val, unit, f.Target.Op, Format(f.Target.Value), unit, verdict)
	if f.Missing != "" {
		s += " MISSING: " + f.Missing
	}
	return s
}

// Format prints a number with three significant decimals at most, without
// an exponent, so lines stay readable and diffable.
func Format(v float64) string {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return strconv.FormatFloat(v, 'f', -1, 64)
	case v == math.Trunc(v) && math.Abs(v) < 1e15:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case math.Abs(v) >= 100:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case math.Abs(v) >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strconv.FormatFloat(v, 'f', 3, 64)
}

// Reporter prints figures as they are measured and again, together, at the
// end; it can also save them as JSON for docs.
type Reporter struct {
	w     io.Writer
	mu    sync.Mutex
	figs  []Figure
	force *regexp.Regexp // BENCH_FORCE_MISS
}

// ForceMissEnv names the environment variable that forces misses.
const ForceMissEnv = "BENCH_FORCE_MISS"

// New returns a Reporter writing to w. It reads BENCH_FORCE_MISS: a
// regular expression, or, when it does not compile, a literal substring of
// the figure names to fail.
func New(w io.Writer) *Reporter {
	r := &Reporter{w: w}
	if pat := os.Getenv(ForceMissEnv); pat != "" {
		re, err := regexp.Compile(pat)
		if err != nil {
			re = regexp.MustCompile(regexp.QuoteMeta(pat))
		}
		r.force = re
	}
	return r
}

// impossible is a target no measured value meets, in the figure's own
// direction where it has one.
func impossible(t Target) Target {
	if t.Op == AtLeast {
		return Target{AtLeast, math.Inf(1)}
	}
	return Target{Less, math.Inf(-1)}
}

// Add records and prints a figure.
func (r *Reporter) Add(f Figure) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.force != nil && r.force.MatchString(f.Name) {
		f.Target = impossible(f.Target)
	}
	r.figs = append(r.figs, f)
	fmt.Fprintln(r.w, f.Line())
}

// Info records a figure without a target.
func (r *Reporter) Info(name string, v float64, unit string) {
	r.Add(Figure{Name: name, Value: v, Unit: unit})
}

// Check records a figure with a target.
func (r *Reporter) Check(name string, v float64, unit string, op Op, target float64) {
	r.Add(Figure{Name: name, Value: v, Unit: unit, Target: Target{Op: op, Value: target}})
}

// Missing records a figure that could not be measured; it counts as a
// miss, with or without a target.
func (r *Reporter) Missing(name, unit string, op Op, target float64, why string) {
	r.Add(Figure{Name: name, Value: math.NaN(), Unit: unit, Target: Target{Op: op, Value: target}, Missing: why})
}

// Figures returns what was recorded, in order.
func (r *Reporter) Figures() []Figure {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Figure(nil), r.figs...)
}

// Summary prints every figure again under a header and returns how many
// figures missed (Figure.Miss).
func (r *Reporter) Summary(title string) int {
	figs := r.Figures()
	failed := 0
	fmt.Fprintf(r.w, "\n==== %s: summary ====\n", title)
	for _, f := range figs {
		fmt.Fprintln(r.w, f.Line())
		if f.Miss() {
			failed++
		}
	}
	return failed
}

// Finish ends a benchmark program's report: the summary (Summary), the
// figures written to jsonOut when it is set (a failed write is said on
// stderr, the figures stand), and a line saying how many missed, which it
// returns.
func (r *Reporter) Finish(title, jsonOut string) int {
	failed := r.Summary(title)
	if jsonOut != "" {
		if err := r.WriteJSON(jsonOut); err != nil {
			fmt.Fprintln(os.Stderr, "write json:", err)
		}
	}
	fmt.Fprintf(r.w, "%s: %d figure(s) missed their target\n", title, failed)
	return failed
}

// WriteJSON saves the figures (with their verdicts) to path.
func (r *Reporter) WriteJSON(path string) error {
	type out struct {
		Figure
		Target  string `json:"target,omitempty"`
		Verdict string `json:"verdict"`
	}
	var rows []out
	for _, f := range r.Figures() {
		o := out{Figure: f, Verdict: infoLabel}
		if math.IsNaN(o.Value) {
			o.Value = 0
		}
		if f.HasTarget() {
			o.Target = fmt.Sprintf("%s %s", f.Target.Op, Format(f.Target.Value))
			o.Verdict = "PASS"
		}
		if f.Miss() {
			o.Verdict = "FAIL"
		}
		rows = append(rows, o)
	}
	b, err := json.MarshalIndent(rows, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// CPUTime is the CPU time (user + system) this process has used so far.
func CPUTime() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	tv := func(t syscall.Timeval) time.Duration {
		return time.Duration(t.Sec)*time.Second + time.Duration(t.Usec)*time.Microsecond
	}
	return tv(ru.Utime) + tv(ru.Stime), nil
}

// RSS returns this process's resident set size (VmRSS) in bytes.
func RSS() (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	return parseStatusKB(b, "VmRSS")
}

// parseStatusKB reads a "<key>:   <n> kB" line of /proc/<pid>/status.
func parseStatusKB(status []byte, key string) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || k != key {
			continue
		}
		fields := strings.Fields(v)
		if len(fields) != 2 || fields[1] != "kB" {
			return 0, fmt.Errorf("/proc status %s: unexpected %q", key, v)
		}
		n, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc status %s: %w", key, err)
		}
		return n * 1024, nil
	}
	return 0, fmt.Errorf("/proc status has no %s line", key)
}

// Quantile returns the q-quantile (0..1, nearest rank) of ds; 0 when empty.
func Quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}
