package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestFigureLine(t *testing.T) {
	tests := []struct {
		name string
		f    Figure
		want string
		pass bool
	}{
		{"pass below", Figure{Name: "a", Value: 0.4321, Unit: "s", Target: Target{Less, 1}}, "FIGURE a = 0.432 s (target < 1 s) PASS", true},
		{"fail at bound", Figure{Name: "a", Value: 1, Unit: "s", Target: Target{Less, 1}}, "FIGURE a = 1 s (target < 1 s) FAIL", false},
		{"at most", Figure{Name: "b", Value: 5, Unit: "s", Target: Target{AtMost, 5}}, "FIGURE b = 5 s (target <= 5 s) PASS", true},
		{"at least fails", Figure{Name: "c", Value: 3527.25, Unit: "events/s", Target: Target{AtLeast, 5000}}, "FIGURE c = 3527.2 events/s (target >= 5000 events/s) FAIL", false},
		{"ratio", Figure{Name: "r", Value: 12.345, Unit: "x", Target: Target{AtLeast, 4}}, "FIGURE r = 12.35 x (target >= 4 x) PASS", true},
		{"info", Figure{Name: "d", Value: 12.5, Unit: "MiB"}, "FIGURE d = 12.50 MiB (info)", true},
		{"missing", Figure{Name: "e", Value: math.NaN(), Unit: "s", Target: Target{AtMost, 5}, Missing: "agent never joined"}, "FIGURE e = n/a s (target <= 5 s) FAIL MISSING: agent never joined", false},
		{"missing info", Figure{Name: "f", Value: math.NaN(), Unit: "s", Missing: "never recovered"}, "FIGURE f = n/a s (info) FAIL MISSING: never recovered", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.f.Line(); got != tt.want {
				t.Errorf("Line() = %q, want %q", got, tt.want)
			}
			if got := tt.f.Pass(); got != tt.pass {
				t.Errorf("Pass() = %v, want %v", got, tt.pass)
			}
		})
	}
}

func TestSummaryCountsFailures(t *testing.T) {
	var buf bytes.Buffer
	r := New(&buf)
	r.Check("ok", 1, "s", Less, 2)
	r.Check("bad", 3, "s", Less, 2)
	r.Info("info", 7, "")
	r.Missing("gone", "s", AtMost, 5, "no data")
	r.Missing("gone_info", "s", NoTarget, 0, "never recovered")
	if n := r.Summary("t"); n != 3 {
		t.Fatalf("Summary = %d failures, want 3", n)
	}
	if c := strings.Count(buf.String(), "FIGURE bad ="); c != 2 {
		t.Errorf("figure printed %d times, want 2 (as measured and in the summary):\n%s", c, buf.String())
	}
}

func TestParseStatusKB(t *testing.T) {
	status := []byte("Name:\tscale\nVmPeak:\t  200 kB\nVmRSS:\t   12345 kB\nThreads:\t9\n")
	tests := []struct {
		key     string
		want    int64
		wantErr bool
	}{
		{"VmRSS", 12345 * 1024, false},
		{"VmPeak", 200 * 1024, false},
		{"VmSwap", 0, true},
		{"Threads", 0, true},
	}
	for _, tt := range tests {
		got, err := parseStatusKB(status, tt.key)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("parseStatusKB(%s) = %d, %v; want %d, err %v", tt.key, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestSelfMeasurements(t *testing.T) {
	rss, err := RSS()
	if err != nil || rss < 1<<20 {
		t.Fatalf("RSS = %d, %v; want at least 1 MiB", rss, err)
	}
	before, err := CPUTime()
	if err != nil {
		t.Fatal(err)
	}
	x := 0.0
	for deadline := time.Now().Add(30 * time.Millisecond); time.Now().Before(deadline); {
		x += math.Sqrt(x + 1)
	}
	after, _ := CPUTime()
	if after <= before {
		t.Errorf("CPU time did not advance over a busy loop: %s → %s (x=%v)", before, after, x)
	}
}

func TestQuantile(t *testing.T) {
	ds := []time.Duration{5, 1, 4, 2, 3}
	tests := []struct {
		q    float64
		want time.Duration
	}{{0, 1}, {0.5, 3}, {0.99, 5}, {1, 5}}
	for _, tt := range tests {
		if got := Quantile(ds, tt.q); got != tt.want {
			t.Errorf("Quantile(%v) = %v, want %v", tt.q, got, tt.want)
		}
	}
	if Quantile(nil, 0.5) != 0 {
		t.Error("Quantile of nothing is not 0")
	}
}

// TestFinish: the summary, the JSON file and the closing count, which it
// returns (a program exits 1 on more than none).
func TestFinish(t *testing.T) {
	t.Setenv(ForceMissEnv, "")
	for _, tc := range []struct {
		name     string
		add      func(r *Reporter)
		wantMiss int
	}{
		{"all pass", func(r *Reporter) { r.Check("p.a", 1, "s", AtMost, 5); r.Info("p.b", 2, "x") }, 0},
		{"one miss", func(r *Reporter) { r.Check("p.a", 9, "s", AtMost, 5); r.Missing("p.c", "s", AtMost, 5, "gone") }, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			r := New(&buf)
			tc.add(r)
			file := filepath.Join(t.TempDir(), "p.json")
			if n := r.Finish("prog", file); n != tc.wantMiss {
				t.Errorf("Finish = %d, want %d", n, tc.wantMiss)
			}
			want := "==== prog: summary ====\n"
			if !strings.Contains(buf.String(), want) || !strings.HasSuffix(buf.String(), fmt.Sprintf("prog: %d figure(s) missed their target\n", tc.wantMiss)) {
				t.Errorf("output lacks the summary or the closing count:\n%s", buf.String())
			}
			b, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			var rows []map[string]any
			if err := json.Unmarshal(b, &rows); err != nil || len(rows) != len(r.Figures()) {
				t.Errorf("JSON %s: %d rows (err %v), want %d", b, len(rows), err, len(r.Figures()))
			}
		})
	}
}
