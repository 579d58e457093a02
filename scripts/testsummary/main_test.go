package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// goTestJSON runs the real `go test -json` on packages of the fixture
// module under testdata and returns its stream (stdout and stderr, as
// `make test` pipes them). Streams are cached: each case set is built once.
var (
	streamMu sync.Mutex
	streams  = map[string][]byte{}
)

func goTestJSON(t *testing.T, pkgs ...string) []byte {
	t.Helper()
	key := strings.Join(pkgs, " ")
	streamMu.Lock()
	defer streamMu.Unlock()
	if b, ok := streams[key]; ok {
		return b
	}
	cmd := exec.Command("go", append([]string{"test", "-json", "-count=1"}, pkgs...)...)
	cmd.Dir = filepath.Join("testdata", "fixture")
	// The fixture is its own module: no workspace, no flags of the outer run.
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=", "GOTOOLCHAIN=local")
	out, err := cmd.CombinedOutput()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("go test -json %s: %v\n%s", key, err, out)
	}
	streams[key] = out
	return out
}

func TestSummarize(t *testing.T) {
	allowAll := "fixture/pass TestSkip.*  the fixture's skips are its point\npass TestTable/skips  a subtest matched by its full name\n"
	for _, tc := range []struct {
		name     string
		pkgs     []string
		allow    string
		wantCode int
		want     []string // in the report, in this order
		notWant  []string
	}{
		{
			name: "every skip allowed", pkgs: []string{"./pass"}, allow: allowAll, wantCode: 0,
			want: []string{
				"ok    fixture/pass",
				"== skipped tests: 3",
				"allowed      fixture/pass TestSkipGPU\n    test says: needs a GPU\n    allowed:   the fixture's skips are its point (allow:1)",
				"allowed      fixture/pass TestSkipLong\n    test says: two-line reason: set FIXTURE_LONG=1",
				"allowed      fixture/pass TestTable/skips\n    test says: a subtest's own reason\n    allowed:   a subtest matched by its full name (allow:2)",
				"== 3 passed, 0 failed, 3 skipped (3 allowed)",
				"PASS",
			},
			notWant: []string{"NOT ALLOWED", "a passing test's log", "checked the machine first", "note:"},
		},
		{
			name: "a skip not in the list fails the run", pkgs: []string{"./pass"},
			allow: "pass TestSkipGPU needs a GPU, reviewed\npass TestTable/.* table skips\n", wantCode: 1,
			want: []string{
				"allowed      fixture/pass TestSkipGPU",
				"NOT ALLOWED  fixture/pass TestSkipLong\n    test says: two-line reason: set FIXTURE_LONG=1",
				"FAIL: 1 skips not in the allow-list",
			},
			notWant: []string{"NOT ALLOWED  fixture/pass TestSkipGPU", "\nPASS"},
		},
		{
			name: "no allow-list: every skip fails", pkgs: []string{"./pass"}, wantCode: 1,
			want: []string{"NOT ALLOWED  fixture/pass TestSkipGPU", "NOT ALLOWED  fixture/pass TestSkipLong", "NOT ALLOWED  fixture/pass TestTable/skips", "FAIL: 3 skips not in the allow-list"},
		},
		{
			name: "the pattern must match the whole name", pkgs: []string{"./pass"},
			allow: "pass Skip skips\npass TestTable table\nother/pass TestSkip.* another package\n", wantCode: 1,
			want: []string{"NOT ALLOWED  fixture/pass TestSkipGPU", "NOT ALLOWED  fixture/pass TestTable/skips", "note: allow:1 (pass Skip) matched no skip"},
		},
		{
			name: "a failed test fails and its output is shown", pkgs: []string{"./fail"}, wantCode: 1,
			want: []string{
				"--- FAIL: fixture/fail TestFail",
				"fail_test.go:8: the output of a failure",
				"fail_test.go:9: want 1, got 2",
				"FAIL  fixture/fail",
				"== failed tests (output above):\n    fixture/fail TestFail",
				"== 1 passed, 1 failed, 0 skipped",
				"FAIL: 1 failed tests; 1 failed packages",
			},
		},
		{
			name: "a build failure fails with the compiler's message", pkgs: []string{"./broken"}, wantCode: 1,
			want: []string{`broken_test.go:6:14: cannot use "not a number"`, "FAIL  fixture/broken", "== failed packages:\n    fixture/broken"},
		},
		{
			name: "a test binary that exits under a test fails", pkgs: []string{"./exit"}, wantCode: 1,
			want: []string{"--- DID NOT FINISH: fixture/exit TestExits", "exit_test.go:9: about to leave", "FAIL: 1 tests that did not finish; 1 failed packages"},
		},
		{
			name: "skips are reported when other packages fail", pkgs: []string{"./pass", "./fail"}, allow: allowAll, wantCode: 1,
			want: []string{"allowed      fixture/pass TestSkipGPU", "FAIL: 1 failed tests"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rules, err := parseAllowList(strings.NewReader(tc.allow), "allow")
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			code := summarize(bytes.NewReader(goTestJSON(t, tc.pkgs...)), &out, rules)
			report := out.String()
			if code != tc.wantCode {
				t.Errorf("exit %d, want %d", code, tc.wantCode)
			}
			rest := report
			for _, w := range tc.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Errorf("report lacks (or has out of order) %q", w)
					continue
				}
				rest = rest[i+len(w):]
			}
			for _, nw := range tc.notWant {
				if strings.Contains(report, nw) {
					t.Errorf("report has %q", nw)
				}
			}
			if t.Failed() {
				t.Logf("report:\n%s", report)
			}
		})
	}
}

func TestSummarizeInputs(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		wantCode int
		want     string
	}{
		{"empty input is not a pass", "", 1, "no test ran"},
		{"go's own text is shown", "go: downloading example.com/m v1.0.0\n", 1, "go: downloading example.com/m v1.0.0\n"},
		{"a cut stream fails the package", `{"Action":"run","Package":"p","Test":"TestA"}` + "\n" +
			`{"Action":"output","Package":"p","Test":"TestA","Output":"    a_test.go:3: working\n"}` + "\n", 1, "p (no result)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			if code := summarize(strings.NewReader(tc.in), &out, nil); code != tc.wantCode {
				t.Errorf("exit %d, want %d", code, tc.wantCode)
			}
			if !strings.Contains(out.String(), tc.want) {
				t.Errorf("report lacks %q:\n%s", tc.want, out.String())
			}
		})
	}
}

func TestParseAllowList(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		wantErr  string
		wantN    int
	}{
		{"comments and blanks", "# reviewed skips\n\n  cmd/fleetd TestA  needs make  \n", "", 1},
		{"a reason is required", "cmd/fleetd TestA\n", "allow:1: want PACKAGE TEST REASON", 0},
		{"a bad pattern is an error", "# x\ncmd/fleetd Test( reason\n", "allow:2: test pattern", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rules, err := parseAllowList(strings.NewReader(tc.in), "allow")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(rules) != tc.wantN {
				t.Fatalf("%d rules, want %d", len(rules), tc.wantN)
			}
			if r := rules[0]; r.pkg != "cmd/fleetd" || r.reason != "needs make" || !r.matches("github.com/x/cmd/fleetd", "TestA") || r.matches("github.com/x/cmd/fleetd", "TestAB") {
				t.Errorf("rule %+v", r)
			}
		})
	}
}

// TestRepoAllowList parses the list `make test` uses, so a malformed entry
// fails here and not only at the end of a CI run.
func TestRepoAllowList(t *testing.T) {
	rules, err := readAllowFile(filepath.Join("..", "..", ".ci", "skips-allowed.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules {
		if len(r.reason) < 15 {
			t.Errorf("%s: reason %q is too short to be reviewed", r.where, r.reason)
		}
	}
}
