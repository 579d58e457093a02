package agent

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/rendezvous"
)

func TestProgressTail(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(sec float64) string { return strconv.FormatFloat(float64(t0.Unix())+sec, 'f', 3, 64) }
	cases := []struct {
		name  string
		lines string
		// want
		reports             int
		step, first, total  int64
		samples, rate, rsec float64
		stepRate            float64
		loss                *float64
		bad                 int
		batch, noise        float64
	}{
		{name: "no file content"},
		{name: "one report: no rate yet", lines: `{"step": 10, "samples": 640, "time": ` + at(0) + "}\n",
			reports: 1, step: 10, first: 10, samples: 640},
		{name: "two reports: rate over both", lines: `{"step": 10, "samples": 640, "time": ` + at(0) + "}\n" +
			`{"step": 20, "samples": 1280, "time": ` + at(2) + "}\n",
			reports: 2, step: 20, first: 10, samples: 1280, rate: 320, rsec: 2, stepRate: 5},
		{name: "three reports: the start-up interval is left out", lines: `{"step": 0, "samples": 0, "time": ` + at(0) + "}\n" +
			`{"step": 1, "samples": 64, "time": ` + at(5) + "}\n" +
			`{"step": 21, "samples": 1344, "time": ` + at(7) + ", \"loss\": 0.5, \"total_steps\": 100}\n",
			reports: 3, step: 21, first: 0, samples: 1344, rate: 640, rsec: 2, stepRate: 10, total: 100, loss: ptr(0.5)},
		{name: "samples default to steps; tokens are samples", lines: `{"step": 4, "time": ` + at(0) + "}\n" +
			`{"step": 8, "tokens": 4000, "time": ` + at(1) + "}\n",
			reports: 2, step: 8, first: 4, samples: 4000, rate: 3996, rsec: 1, stepRate: 4},
		{name: "bad lines are skipped", lines: "hello\n{\"step\": -1}\n{\"step\": 1.5}\n{\"samples\": 3}\n{\"step\": 2, \"samples\": -4}\n" +
			`{"step": 3, "time": ` + at(0) + "}\n",
			reports: 1, step: 3, first: 3, samples: 3, bad: 5},
		{name: "a partial last line waits", lines: `{"step": 3, "time": ` + at(0) + "}\n{\"step\": 4",
			reports: 1, step: 3, first: 3, samples: 3},
		{name: "non-finite loss is dropped, not the report", lines: `{"step": 3, "loss": NaN, "time": ` + at(0) + "}\n",
			reports: 1, step: 3, first: 3, samples: 3, bad: 0},
		{name: "batch and noise scale: the latest report's", lines: `{"step": 3, "batch": 64, "noise_scale": 900, "time": ` + at(0) + "}\n" +
			`{"step": 4, "batch": 128, "noise_scale": 1250.5, "time": ` + at(1) + "}\n",
			reports: 2, step: 4, first: 3, samples: 4, rate: 1, rsec: 1, stepRate: 1, batch: 128, noise: 1250.5},
		{name: "a noise-dominated gradient (Infinity) or a bad batch is dropped, not the report",
			lines:   `{"step": 3, "batch": -2, "noise_scale": Infinity, "time": ` + at(0) + "}\n",
			reports: 1, step: 3, first: 3, samples: 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), ProgressFile)
			if c.lines != "" {
				if err := os.WriteFile(path, []byte(c.lines), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			tail := newProgressTail(path, rendezvous.Assignment{Round: 7, GroupWorldSize: 2, WorldSize: 4})
			tail.now = func() time.Time { return t0.Add(10 * time.Second) }
			tail.poll()
			p := tail.snapshot()
			bad, _ := tail.invalid()
			if bad != c.bad {
				t.Errorf("bad lines = %d, want %d", bad, c.bad)
			}
			if c.reports == 0 {
				if p != nil {
					t.Fatalf("snapshot = %+v, want nil", p)
				}
				return
			}
			if p == nil {
				t.Fatal("no snapshot")
			}
			if p.Nodes != 2 || p.WorldSize != 4 {
				t.Errorf("size %d nodes, world %d; want 2, 4", p.Nodes, p.WorldSize)
			}
			if p.Round != 7 || p.Reports != c.reports || p.Step != c.step || p.FirstStep != c.first || p.Samples != c.samples || p.TotalSteps != c.total {
				t.Errorf("snapshot %+v, want reports %d step %d first %d samples %g total %d", p, c.reports, c.step, c.first, c.samples, c.total)
			}
			if !near(p.SamplesPerSec, c.rate) || !near(p.RateSeconds, c.rsec) || !near(p.StepsPerSec, c.stepRate) {
				t.Errorf("rate %g/s over %gs (%g steps/s), want %g over %g (%g)", p.SamplesPerSec, p.RateSeconds, p.StepsPerSec, c.rate, c.rsec, c.stepRate)
			}
			if (p.Loss == nil) != (c.loss == nil) || (p.Loss != nil && *p.Loss != *c.loss) {
				t.Errorf("loss %v, want %v", p.Loss, c.loss)
			}
			if p.Batch != c.batch || p.NoiseScale != c.noise {
				t.Errorf("batch %g, noise scale %g; want %g, %g", p.Batch, p.NoiseScale, c.batch, c.noise)
			}
			if err := p.Validate(); err != nil {
				t.Errorf("snapshot does not validate: %v", err)
			}
		})
	}
}

// TestProgressTailFollows appends in pieces, as a worker does, and
// starts over when the file is replaced.
func TestProgressTailFollows(t *testing.T) {
	path := filepath.Join(t.TempDir(), ProgressFile)
	tail := newProgressTail(path, rendezvous.Assignment{Round: 1})
	tail.now = func() time.Time { return time.Unix(1_700_000_002, 0) }
	tail.poll() // no file yet
	if tail.snapshot() != nil {
		t.Fatal("a report before the file exists")
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	write := func(s string) {
		if _, err := f.WriteString(s); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"step": 1, "sam`)
	tail.poll()
	if tail.snapshot() != nil {
		t.Fatal("half a line counted")
	}
	write("ples\": 10, \"time\": 1700000000}\n{\"step\": 2, \"samples\": 20, \"time\": 1700000001}\n")
	tail.poll()
	if p := tail.snapshot(); p == nil || p.Step != 2 || p.Reports != 2 || !near(p.SamplesPerSec, 10) {
		t.Fatalf("after the rest: %+v", p)
	}
	f.Close()
	// Replaced by a shorter file: read from its start.
	if err := os.WriteFile(path, []byte("{\"step\": 9}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tail.poll()
	if p := tail.snapshot(); p == nil || p.Step != 9 || p.Reports != 3 {
		t.Fatalf("after replacing the file: %+v", p)
	}
}

func ptr(v float64) *float64 { return &v }

func near(a, b float64) bool {
	d := a - b
	return d < 1e-6 && d > -1e-6
}

// TestProgressForwardedAndFinishedCheckpointExplained runs the example
// trainer (which reports through examples/fleetd_progress.py) under a real
// agent: its heartbeats carry the round's progress to the rendezvous. A
// second run on the same checkpoint ends at once, and the agent says why:
// the checkpoint already held a finished job.
func TestProgressForwardedAndFinishedCheckpointExplained(t *testing.T) {
	addrs := loopbackAddrs(t, 1)
	ckpt := t.TempDir()
	const steps = 60
	d := newFakeDaemon(t, rdzvConfig(t, 1, 1), trainerJob(t, steps, ckpt, "--ckpt-every", "50"))
	a := startAgent(t, d, "n0", addrs[0])
	var seen *rendezvous.Progress
	waitFor(t, 30*time.Second, "a progress report with a rate in the rendezvous", func() bool {
		st, err := d.service().Status(testFleet)
		if err != nil || len(st.Members) == 0 {
			return false
		}
		if p := st.Members[0].Progress; p != nil && p.Reports >= 2 && p.SamplesPerSec > 0 {
			seen = p
			return true
		}
		return false
	})
	if seen.Round != 1 || seen.Nodes != 1 || seen.WorldSize != 1 || seen.TotalSteps != steps || seen.Step <= 0 || seen.Loss == nil {
		t.Errorf("progress %+v: want round 1 at 1 node, total %d, a step and a loss", seen, steps)
	}
	// 64 samples per step (the global batch).
	if per := seen.SamplesPerSec / seen.StepsPerSec; per < 63.9 || per > 64.1 {
		t.Errorf("%.1f samples per step, want 64", per)
	}
	waitAll(t, 45*time.Second, a)
	if rep := wantDone(t, d, true); strings.Contains(rep.req.Detail, "already held") {
		t.Errorf("a job that trained says it was done before: %q", rep.req.Detail)
	}

	d2 := newFakeDaemon(t, rdzvConfig(t, 1, 1), trainerJob(t, steps, ckpt))
	a2 := startAgent(t, d2, "n0", addrs[0])
	waitAll(t, 45*time.Second, a2)
	rep := wantDone(t, d2, true)
	if !strings.Contains(rep.req.Detail, "already held a finished job") || !strings.Contains(rep.req.Detail, filepath.Join(ckpt, DoneMarker)) {
		t.Errorf("done detail %q does not say the checkpoint held a finished job", rep.req.Detail)
	}
}

// TestProgressHelperCarriesBatchAndNoiseScale: the example's progress
// helper writes what fleetd_elastic.AdaptiveBatch.progress_fields() gives
// (the global batch and the gradient noise scale), and the agent's
// parser hands both on; an infinite noise scale is left out.
func TestProgressHelperCarriesBatchAndNoiseScale(t *testing.T) {
	py := torchPython(t)
	path := filepath.Join(t.TempDir(), ProgressFile)
	script := `import sys
sys.path.insert(0, sys.argv[2])
import fleetd_progress as fp
r = fp.Reporter(path=sys.argv[1], rank=0)
r.report(1, samples=64, batch=64, noise_scale=512.5, force=True)
r.report(2, samples=192, batch=128, noise_scale=float("inf"), force=True)
r.close()
`
	if out, err := exec.Command(py, "-c", script, path, filepath.Join("..", "examples")).CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	tail := newProgressTail(path, rendezvous.Assignment{Round: 1, GroupWorldSize: 2, WorldSize: 2})
	tail.poll()
	if bad, line := tail.invalid(); bad != 0 {
		t.Fatalf("%d bad lines (%s)", bad, line)
	}
	p := tail.snapshot()
	if p == nil || p.Step != 2 || p.Batch != 128 || p.NoiseScale != 0 {
		t.Fatalf("snapshot %+v: want step 2, batch 128, no noise scale (it was infinite)", p)
	}
	b, _ := os.ReadFile(path)
	if !strings.Contains(string(b), `"noise_scale":512.5`) {
		t.Errorf("the first report lacks its noise scale:\n%s", b)
	}
}
