package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"os"
	"regexp"
	"sync"
	"time"

	"github.com/fleetd/fleetd/rendezvous"
)

// EnvProgress names the file global rank 0 appends its progress reports
// to: one JSON object per line, {"step", "samples", "loss", "total_steps",
// "time"} (docs/agent.md, "Progress reports"). It is per round:
// <log_dir>/round-N/progress.jsonl.
const EnvProgress = "FLEETD_PROGRESS"

// ProgressFile is the progress file's name in a round's log directory.
const ProgressFile = "progress.jsonl"

const (
	// maxProgressRead bounds what one poll reads; the rest waits for the
	// next one.
	maxProgressRead = 1 << 20
	// maxProgressLine: a longer line is not a report.
	maxProgressLine = 4096
	// clockSkewLimit: a report's own time further than this from the
	// agent's clock is ignored (the read time stands in).
	clockSkewLimit = 24 * time.Hour
)

// progressReport is one parsed line.
type progressReport struct {
	step, total int64
	samples     float64
	loss        *float64
	// batch and noise are the global batch and the gradient noise scale,
	// when the workers report them (0: not).
	batch, noise float64
	at           time.Time
}

// progressTail follows one round's progress file. poll reads what was
// appended since the last call; snapshot summarises the round. It is
// safe for concurrent use.
type progressTail struct {
	mu    sync.Mutex
	path  string
	round int
	// nodes and world are the round's size.
	nodes, world int
	off          int64
	partial      []byte
	n            int
	// first, second and last are the round's first, second and latest
	// valid reports.
	first, second, last progressReport
	bad                 int
	badLine             string
	now                 func() time.Time
}

func newProgressTail(path string, a rendezvous.Assignment) *progressTail {
	return &progressTail{path: path, round: a.Round, nodes: a.GroupWorldSize, world: a.WorldSize, now: time.Now}
}

// poll reads the lines appended since the last poll. A missing file is
// no report yet.
func (t *progressTail) poll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	f, err := os.Open(t.path)
	if err != nil {
		return
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() < t.off {
		// Truncated or replaced: start over.
		t.off, t.partial = 0, nil
	}
	if _, err := f.Seek(t.off, io.SeekStart); err != nil {
		return
	}
	buf := make([]byte, maxProgressRead)
	n, err := io.ReadFull(f, buf)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return
	}
	t.off += int64(n)
	data := append(t.partial, buf[:n]...)
	now := t.now()
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break
		}
		t.line(data[:i], now)
		data = data[i+1:]
	}
	if len(data) > maxProgressLine {
		t.bad++
		data = nil // never a report: drop it up to its newline
	}
	t.partial = append([]byte(nil), data...)
}

// line parses one report: step (required), samples (default: step),
// loss, total_steps, time (Unix seconds; default: when it was read),
// batch and noise_scale (AdaptiveBatch's).
func (t *progressTail) line(b []byte, readAt time.Time) {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return
	}
	var raw struct {
		Step       *float64 `json:"step"`
		Samples    *float64 `json:"samples"`
		Tokens     *float64 `json:"tokens"`
		Loss       *float64 `json:"loss"`
		TotalSteps *float64 `json:"total_steps"`
		Time       *float64 `json:"time"`
		Batch      *float64 `json:"batch"`
		NoiseScale *float64 `json:"noise_scale"`
	}
	// Python's json.dumps writes a diverged loss as NaN or Infinity, which
	// JSON lacks: such a value counts as absent, not the whole report.
	b = nonFinite.ReplaceAll(b, []byte("${1}null"))
	ok := len(b) <= maxProgressLine && json.Unmarshal(b, &raw) == nil && raw.Step != nil && wholeNonNeg(*raw.Step)
	var r progressReport
	if ok {
		r.step = int64(*raw.Step)
		r.samples = float64(r.step)
		switch {
		case raw.Samples != nil:
			r.samples = *raw.Samples
		case raw.Tokens != nil:
			r.samples = *raw.Tokens
		}
		ok = finite(r.samples) && r.samples >= 0
		if raw.TotalSteps != nil {
			ok = ok && wholeNonNeg(*raw.TotalSteps)
			r.total = int64(*raw.TotalSteps)
		}
		if raw.Loss != nil && finite(*raw.Loss) {
			l := *raw.Loss
			r.loss = &l
		}
		// Optional: a bad batch or noise scale is dropped, not the report.
		if raw.Batch != nil && finite(*raw.Batch) && *raw.Batch > 0 {
			r.batch = *raw.Batch
		}
		if raw.NoiseScale != nil && finite(*raw.NoiseScale) && *raw.NoiseScale >= 0 {
			r.noise = *raw.NoiseScale
		}
		r.at = readAt
		if raw.Time != nil && finite(*raw.Time) {
			sec, frac := math.Modf(*raw.Time)
			at := time.Unix(int64(sec), int64(frac*1e9))
			if d := at.Sub(readAt); d < clockSkewLimit && d > -clockSkewLimit {
				r.at = at
			}
		}
	}
	if !ok {
		t.bad++
		if t.badLine == "" {
			t.badLine = string(b[:min(len(b), 200)])
		}
		return
	}
	switch t.n {
	case 0:
		t.first = r
	case 1:
		t.second = r
	}
	t.last = r
	t.n++
}

// nonFinite matches Python's non-standard NaN, Infinity and -Infinity
// values.
var nonFinite = regexp.MustCompile(`(:\s*)-?(?:NaN|Infinity)\b`)

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func wholeNonNeg(v float64) bool { return finite(v) && v >= 0 && v == math.Trunc(v) && v < 1<<62 }

// snapshot is the round's progress for a heartbeat; nil before the first
// report.
func (t *progressTail) snapshot() *rendezvous.Progress {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == 0 {
		return nil
	}
	p := &rendezvous.Progress{Round: t.round, Nodes: t.nodes, WorldSize: t.world, Step: t.last.step, Samples: t.last.samples,
		Loss: t.last.loss, TotalSteps: t.last.total, FirstStep: t.first.step, Reports: t.n, Batch: t.last.batch, NoiseScale: t.last.noise}
	now := t.now()
	if age := now.Sub(t.last.at); age > 0 {
		p.AgeMS = age.Milliseconds()
	}
	if age := now.Sub(t.first.at); age > 0 {
		p.FirstAgeMS = age.Milliseconds()
	}
	// The first interval holds the workers' start-up (process group, first
	// batch): with a later report to measure from, it is left out.
	base := t.first
	if t.n >= 3 {
		base = t.second
	}
	if t.n >= 2 {
		if dt := t.last.at.Sub(base.at).Seconds(); dt > 0 {
			if ds := t.last.samples - base.samples; ds >= 0 {
				p.SamplesPerSec = ds / dt
			}
			if dst := t.last.step - base.step; dst >= 0 {
				p.StepsPerSec = float64(dst) / dt
			}
			p.RateSeconds = dt
		}
	}
	return p
}

// invalid reports the count of lines that were not reports and the
// first of them.
func (t *progressTail) invalid() (int, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.bad, t.badLine
}
