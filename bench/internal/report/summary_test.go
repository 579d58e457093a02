package report

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// benchLog is what one benchmark program printed: its figures through a
// real Reporter (which reads BENCH_FORCE_MISS), and its exit status as
// the program derives it from the summary.
func benchLog(t *testing.T, add func(r *Reporter)) (log string, status int) {
	t.Helper()
	var buf bytes.Buffer
	r := New(&buf)
	add(r)
	if r.Summary("elastic") > 0 {
		status = 1
	}
	return buf.String(), status
}

// TestBenchSummaryVerdict runs bench/summary.sh, the verdict of bench/run.sh
// and so of `make bench`, over logs of real Reporters: a forced miss, a
// scenario that never recovered or a crashed program make it exit 1.
func TestBenchSummaryVerdict(t *testing.T) {
	script, err := filepath.Abs(filepath.Join("..", "..", "summary.sh"))
	if err != nil {
		t.Fatal(err)
	}
	good := func(r *Reporter) {
		r.Check("x.kill.fleetd", 1.2, "s", AtMost, 5)
		r.Info("x.kill.torchrun", 40, "s")
	}
	for _, tc := range []struct {
		name     string
		env      []string // for the Reporter and the script
		figs     func(r *Reporter)
		none     bool // no program ran (figs nil: one crashed, printing no summary)
		wantCode int
		want     []string
	}{
		{name: "all met", figs: good, wantCode: 0, want: []string{"FIGURE x.kill.fleetd = 1.20 s (target <= 5 s) PASS", "targets: 1 passed, 0 missed"}},
		{name: "forced miss of a target", env: []string{ForceMissEnv + "=kill.fleetd"}, figs: good, wantCode: 1,
			want: []string{"FIGURE x.kill.fleetd = 1.20 s (target < -Inf s) FAIL", "targets: 0 passed, 1 missed", "bench: FAIL"}},
		{name: "forced miss of an at-least target", env: []string{ForceMissEnv + "=transfer"}, figs: func(r *Reporter) {
			r.Check("x.add.transfer", 900, "MiB/s", AtLeast, 200)
		}, wantCode: 1, want: []string{"FIGURE x.add.transfer = 900 MiB/s (target >= +Inf MiB/s) FAIL"}},
		{name: "forced miss of an info figure", env: []string{ForceMissEnv + "=torchrun$"}, figs: good, wantCode: 1,
			want: []string{"FIGURE x.kill.torchrun = 40 s (target < -Inf s) FAIL", "targets: 1 passed, 1 missed"}},
		{name: "a scenario that never recovered", figs: func(r *Reporter) {
			good(r)
			r.Missing("x.add.torchrun", "s", NoTarget, 0, "[a b] not training again within 4m0s")
		}, wantCode: 1, want: []string{"FIGURE x.add.torchrun = n/a s (info) FAIL MISSING: [a b] not training again", "targets: 1 passed, 1 missed"}},
		{name: "a crashed program", wantCode: 1, want: []string{"MISS elastic: no summary (exit status 2)", "targets: 0 passed, 1 missed"}},
		{name: "no benchmark ran", none: true, wantCode: 1, want: []string{"MISS: no benchmark ran", "targets: 0 passed, 1 missed"}},
		{name: "not strict: reported, exit 0", env: []string{ForceMissEnv + "=.", "BENCH_STRICT=0"}, figs: good, wantCode: 0,
			want: []string{"(target < -Inf s) FAIL", "targets: 0 passed, 2 missed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(ForceMissEnv, "")
			t.Setenv("BENCH_STRICT", "")
			for _, kv := range tc.env {
				k, v, _ := strings.Cut(kv, "=")
				t.Setenv(k, v)
			}
			log, status := "panic: boom\n", 2
			if tc.figs != nil {
				log, status = benchLog(t, tc.figs)
			}
			// As bench/run.sh leaves them for one program that ran.
			out := t.TempDir()
			if !tc.none {
				if err := os.WriteFile(filepath.Join(out, "elastic.log"), []byte(log), 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(out, "elastic.status"), []byte(strconv.Itoa(status)+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			b, err := exec.Command("bash", script, out).CombinedOutput()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			got := string(b)
			if code != tc.wantCode {
				t.Errorf("exit %d, want %d", code, tc.wantCode)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("summary lacks %q", w)
				}
			}
			if t.Failed() {
				t.Logf("summary.sh said:\n%s", got)
			}
		})
	}
}
