// Command testsummary reads the output of `go test -json` on stdin and
// prints it for people: one line per package as it finishes, the full
// output of every failed test, and at the end every skipped test with the
// reason it gave. It exits non-zero when a test or a package failed, when
// a test started but never finished, or when a test skipped without a
// matching entry in an allow-list, so that a skip is a reviewed decision
// and never a silent loss of coverage.
//
//	go test -json ./... 2>&1 | testsummary -allow .ci/skips-allowed.txt
//
// The allow-list has one entry a line (blank lines and # comments aside):
//
//	PACKAGE  TEST  REASON…
//
// PACKAGE is an import path or its tail below the module (cmd/fleetd),
// TEST a Go regular expression that must match the whole test name
// (subtests included: TestX/case), and REASON, required, says why the
// test cannot run where the list is used.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"
)

func main() {
	var lists []string
	flag.Func("allow", "allow-list `file` of skips (repeatable)", func(s string) error {
		lists = append(lists, s)
		return nil
	})
	flag.Parse()
	var rules []allowRule
	for _, name := range lists {
		rs, err := readAllowFile(name)
		if err != nil {
			fmt.Fprintln(os.Stderr, "testsummary:", err)
			os.Exit(2)
		}
		rules = append(rules, rs...)
	}
	os.Exit(summarize(os.Stdin, os.Stdout, rules))
}

// allowRule is one reviewed skip.
type allowRule struct {
	where  string // file:line, to point at in messages
	pkg    string
	test   *regexp.Regexp
	raw    string // the pattern as written
	reason string
	used   bool
}

func (r *allowRule) matches(pkg, test string) bool {
	return (pkg == r.pkg || strings.HasSuffix(pkg, "/"+r.pkg)) && r.test.MatchString(test)
}

func readAllowFile(name string) ([]allowRule, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("allow-list: %w", err)
	}
	defer f.Close()
	return parseAllowList(f, name)
}

func parseAllowList(r io.Reader, name string) ([]allowRule, error) {
	var rules []allowRule
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		where := fmt.Sprintf("%s:%d", name, n)
		fields := strings.Fields(line)
		if len(fields) < 3 {
			return nil, fmt.Errorf("%s: want PACKAGE TEST REASON, got %q", where, line)
		}
		re, err := regexp.Compile("^(?:" + fields[1] + ")$")
		if err != nil {
			return nil, fmt.Errorf("%s: test pattern: %w", where, err)
		}
		rules = append(rules, allowRule{where: where, pkg: fields[0], test: re, raw: fields[1], reason: strings.Join(fields[2:], " ")})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return rules, nil
}

// event is one line of `go test -json` (cmd/test2json), including the
// build events go test has emitted since Go 1.24.
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output, build-fail
	Test       string
	Elapsed    float64
	Output     string
}

type testRun struct {
	pkg, name string
	output    []string
	result    string // "" while running
	elapsed   float64
}

type skip struct {
	pkg, test, reason string
	rule              *allowRule
}

type summary struct {
	w         io.Writer
	rules     []allowRule
	running   map[string]*testRun // by package + "\x00" + test
	pkgOutput map[string][]string
	started   time.Time

	passed, failed int
	failures       []string // "pkg TestX", in order
	failedPkgs     []string
	unfinished     []string
	skips          []skip
	nonJSON        int
}

// summarize reads the event stream from r, writes the report to w and
// returns the exit code.
func summarize(r io.Reader, w io.Writer, rules []allowRule) int {
	s := &summary{w: w, rules: rules, running: map[string]*testRun{}, pkgOutput: map[string][]string{}, started: time.Now()}
	br := bufio.NewReaderSize(r, 1<<20)
	for {
		line, err := br.ReadString('\n')
		if line != "" {
			s.line(line)
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			fmt.Fprintf(w, "testsummary: read: %v\n", err)
			return 1
		}
	}
	return s.report()
}

func (s *summary) line(line string) {
	var e event
	if !strings.HasPrefix(line, "{") || json.Unmarshal([]byte(line), &e) != nil {
		// go's own messages (downloads, vet, a crashed go command) are
		// not JSON: show them as they come.
		s.nonJSON++
		fmt.Fprint(s.w, line)
		return
	}
	switch e.Action {
	case "build-output":
		fmt.Fprint(s.w, e.Output)
		return
	case "build-fail":
		return // the package's own "fail" event follows
	}
	if e.Test == "" {
		s.packageEvent(e)
		return
	}
	key := e.Package + "\x00" + e.Test
	t := s.running[key]
	if t == nil {
		t = &testRun{pkg: e.Package, name: e.Test}
		s.running[key] = t
	}
	switch e.Action {
	case "output":
		t.output = append(t.output, e.Output)
	case "pass":
		s.passed++
		delete(s.running, key)
	case "fail":
		t.result, t.elapsed = "fail", e.Elapsed
		s.failed++
		s.failures = append(s.failures, e.Package+" "+e.Test)
		s.printTest("--- FAIL", t)
		delete(s.running, key)
	case "skip":
		sk := skip{pkg: e.Package, test: e.Test, reason: skipReason(t.output)}
		for i := range s.rules {
			if s.rules[i].matches(e.Package, e.Test) {
				s.rules[i].used = true
				sk.rule = &s.rules[i]
				break
			}
		}
		s.skips = append(s.skips, sk)
		delete(s.running, key)
	}
}

func (s *summary) packageEvent(e event) {
	switch e.Action {
	case "output":
		s.pkgOutput[e.Package] = append(s.pkgOutput[e.Package], e.Output)
	case "pass":
		fmt.Fprintf(s.w, "ok    %s\t%.1fs\n", e.Package, e.Elapsed)
		s.endPackage(e.Package, false)
	case "skip":
		s.endPackage(e.Package, false) // no test files
	case "fail":
		s.failedPkgs = append(s.failedPkgs, e.Package)
		// What the package printed outside any test: a panic, a timeout's
		// goroutine dump, "[build failed]", TestMain's messages.
		for _, l := range s.pkgOutput[e.Package] {
			if !strings.HasPrefix(l, "FAIL") && !strings.HasPrefix(l, "ok ") {
				fmt.Fprint(s.w, l)
			}
		}
		fmt.Fprintf(s.w, "FAIL  %s\t%.1fs\n", e.Package, e.Elapsed)
		s.endPackage(e.Package, true)
	}
}

// endPackage reports the tests of pkg that started and never ended (the
// test binary died or timed out under them).
func (s *summary) endPackage(pkg string, failed bool) {
	delete(s.pkgOutput, pkg)
	var keys []string
	for k, t := range s.running {
		if t.pkg == pkg {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		t := s.running[k]
		delete(s.running, k)
		if len(t.output) == 0 && !failed {
			continue
		}
		s.unfinished = append(s.unfinished, t.pkg+" "+t.name)
		s.printTest("--- DID NOT FINISH", t)
	}
}

func (s *summary) printTest(head string, t *testRun) {
	fmt.Fprintf(s.w, "%s: %s %s (%.2fs)\n", head, t.pkg, t.name, t.elapsed)
	for _, l := range t.output {
		if strings.HasPrefix(l, "=== ") {
			continue
		}
		fmt.Fprint(s.w, "    "+l)
	}
}

// fileLineRE matches the "    x_test.go:12: " prefix the testing package
// puts before a t.Log/t.Skip message.
var fileLineRE = regexp.MustCompile(`^\s+[\w.\-]+\.go:\d+: `)

// skipReason is the message of the t.Skip call: the last logged message
// before the "--- SKIP" line, with its continuation lines.
func skipReason(output []string) string {
	end := len(output)
	for i := len(output) - 1; i >= 0; i-- {
		if strings.HasPrefix(strings.TrimSpace(output[i]), "--- SKIP") {
			end = i
			break
		}
	}
	for i := end - 1; i >= 0; i-- {
		if loc := fileLineRE.FindStringIndex(output[i]); loc != nil {
			parts := []string{strings.TrimSpace(output[i][loc[1]:])}
			for _, l := range output[i+1 : end] {
				if !strings.HasPrefix(l, "=== ") {
					parts = append(parts, strings.TrimSpace(l))
				}
			}
			return strings.Join(parts, " ")
		}
	}
	return ""
}

func (s *summary) report() int {
	// Tests of packages that never reported an end: the stream was cut.
	for _, pkg := range s.openPackages() {
		s.endPackage(pkg, true)
		s.failedPkgs = append(s.failedPkgs, pkg+" (no result)")
	}
	w := s.w
	var notAllowed int
	fmt.Fprintf(w, "\n== skipped tests: %d\n", len(s.skips))
	slices.SortFunc(s.skips, func(a, b skip) int {
		return strings.Compare(a.pkg+" "+a.test, b.pkg+" "+b.test)
	})
	for _, sk := range s.skips {
		reason := sk.reason
		if reason == "" {
			reason = "(the test gave no reason)"
		}
		if sk.rule == nil {
			notAllowed++
			fmt.Fprintf(w, "NOT ALLOWED  %s %s\n    test says: %s\n", sk.pkg, sk.test, reason)
			continue
		}
		fmt.Fprintf(w, "allowed      %s %s\n    test says: %s\n    allowed:   %s (%s)\n", sk.pkg, sk.test, reason, sk.rule.reason, sk.rule.where)
	}
	for _, r := range s.rules {
		if !r.used {
			fmt.Fprintf(w, "note: %s (%s %s) matched no skip in this run\n", r.where, r.pkg, r.raw)
		}
	}
	var bad []string
	if s.failed > 0 {
		bad = append(bad, fmt.Sprintf("%d failed tests", s.failed))
		fmt.Fprintln(w, "\n== failed tests (output above):")
		for _, f := range s.failures {
			fmt.Fprintln(w, "   ", f)
		}
	}
	if len(s.unfinished) > 0 {
		bad = append(bad, fmt.Sprintf("%d tests that did not finish", len(s.unfinished)))
		fmt.Fprintln(w, "\n== tests that started and did not finish:")
		for _, f := range s.unfinished {
			fmt.Fprintln(w, "   ", f)
		}
	}
	if len(s.failedPkgs) > 0 {
		bad = append(bad, fmt.Sprintf("%d failed packages", len(s.failedPkgs)))
		fmt.Fprintln(w, "\n== failed packages:")
		for _, p := range s.failedPkgs {
			fmt.Fprintln(w, "   ", p)
		}
	}
	if notAllowed > 0 {
		bad = append(bad, fmt.Sprintf("%d skips not in the allow-list (make the test run here, or add a reviewed entry with its reason)", notAllowed))
	}
	if s.passed+s.failed+len(s.skips) == 0 && len(s.failedPkgs) == 0 {
		bad = append(bad, "no test ran (is the input `go test -json` output?)")
	}
	fmt.Fprintf(w, "\n== %d passed, %d failed, %d skipped (%d allowed) in %s\n",
		s.passed, s.failed, len(s.skips), len(s.skips)-notAllowed, time.Since(s.started).Round(time.Second))
	if len(bad) > 0 {
		fmt.Fprintf(w, "FAIL: %s\n", strings.Join(bad, "; "))
		return 1
	}
	fmt.Fprintln(w, "PASS")
	return 0
}

func (s *summary) openPackages() []string {
	var pkgs []string
	for _, t := range s.running {
		if !slices.Contains(pkgs, t.pkg) {
			pkgs = append(pkgs, t.pkg)
		}
	}
	slices.Sort(pkgs)
	return pkgs
}
