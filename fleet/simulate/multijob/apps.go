// Package multijob simulates many training jobs sharing a GPU pool, the
// setting of Pollux (OSDI 2021): jobs arrive from a workload file, each
// is an application whose speed and statistical efficiency come from
// measurements (docs/sim.md, "Multi-job simulation"), and a policy
// decides every interval how many GPUs each job holds. The fleetd
// policy is fleet/allocator.Decide itself, the code the daemon runs.
package multijob

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// App is one application's model, loaded from a directory of
// measurements (placements.csv, scalability.csv, validation-B.csv).
type App struct {
	Name string
	// M0 is the reference batch size: the smallest validation-B.csv's B.
	// Progress is counted in M0-sized steps of statistical progress.
	M0 float64
	// MaxBatch is the largest validation-B.csv's B: the largest global
	// batch whose efficiency was measured, the adaptive policy's bound.
	MaxBatch float64
	// EpochSize is one epoch in progress units (the reference file's
	// progress per row: the dataset over M0).
	EpochSize float64
	// Epochs is the target: the reference file's rows (the run the
	// measurements followed to completion).
	Epochs int
	// MinLocal, MaxLocal bound the measured per-GPU batch sizes; above
	// MaxLocal a step accumulates gradients over several micro-batches.
	MinLocal, MaxLocal float64
	// AdaptLocal is the most per-GPU samples of one micro-batch when a
	// batch-size-adapting policy chooses the batch (limits.csv; MaxLocal
	// without one): above it the step accumulates.
	AdaptLocal float64
	// phi holds the gradient noise scale (samples) per epoch of each
	// validation file, by batch.
	phi []phiCurve
	// steps holds the measured step times per placement (key: nodes,
	// replicas; placements of one shape, such as 14 and 23, averaged),
	// sorted by local batch.
	steps map[placement][]point
	// compute is the single-GPU step time per local batch.
	compute []point
	// syncSingle, syncMulti are the mean sync times per replica count of
	// one-node and multi-node placements, sorted by replicas.
	syncSingle, syncMulti []point
}

type phiCurve struct {
	b   float64
	phi []float64
}

type placement struct{ nodes, replicas int }

type point struct{ x, y float64 }

// LoadApps loads every application directory under dir (a directory
// per application, named after it).
func LoadApps(dir string) (map[string]*App, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("application models: %w", err)
	}
	apps := map[string]*App{}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		a, err := LoadApp(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		apps[a.Name] = a
	}
	if len(apps) == 0 {
		return nil, fmt.Errorf("application models: no application directory in %s", dir)
	}
	return apps, nil
}

// LoadApp loads one application directory.
func LoadApp(dir string) (*App, error) {
	a := &App{Name: filepath.Base(dir), steps: map[placement][]point{}}
	fail := func(err error) (*App, error) { return nil, fmt.Errorf("application %s: %w", a.Name, err) }
	sums := map[placement][2]float64{} // sync time sum, count
	add := func(p placement, bsz, step, sync float64) {
		a.steps[p] = append(a.steps[p], point{bsz, step})
		s := sums[p]
		sums[p] = [2]float64{s[0] + sync, s[1] + 1}
		if a.MinLocal == 0 || bsz < a.MinLocal {
			a.MinLocal = bsz
		}
		a.MaxLocal = max(a.MaxLocal, bsz)
	}
	err := readCSV(filepath.Join(dir, "placements.csv"), []string{"placement", "local_bsz", "step_time", "sync_time"}, func(f []string, v []float64) error {
		p, err := parsePlacement(f[0])
		if err != nil {
			return err
		}
		add(p, v[1], v[2], v[3])
		return nil
	})
	if err != nil {
		return fail(err)
	}
	err = readCSV(filepath.Join(dir, "scalability.csv"), []string{"num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time"}, func(f []string, v []float64) error {
		if v[0] < 1 || v[1] < v[0] {
			return fmt.Errorf("num_nodes %s, num_replicas %s: want 1 <= nodes <= replicas", f[0], f[1])
		}
		add(placement{int(v[0]), int(v[1])}, v[2], v[3], v[4])
		return nil
	})
	if err != nil {
		return fail(err)
	}
	if _, ok := a.steps[placement{1, 1}]; !ok {
		return fail(fmt.Errorf("placements.csv has no single-GPU placement (1)"))
	}
	single, multi := map[int][2]float64{}, map[int][2]float64{}
	for p, pts := range a.steps {
		sort.Slice(pts, func(i, j int) bool { return pts[i].x < pts[j].x })
		a.steps[p] = dedupe(pts)
		m := single
		if p.nodes > 1 {
			m = multi
		}
		s, mean := m[p.replicas], sums[p][0]/sums[p][1]
		m[p.replicas] = [2]float64{s[0] + mean, s[1] + 1}
	}
	a.compute = a.steps[placement{1, 1}]
	a.syncSingle, a.syncMulti = means(single), means(multi)
	if err := a.loadLimits(dir); err != nil {
		return fail(err)
	}
	if err := a.loadValidation(dir); err != nil {
		return fail(err)
	}
	return a, nil
}

// loadLimits reads the optional limits.csv (`max_local_bsz`): the most
// samples per GPU in one micro-batch of a batch an adapting policy
// chose, below the largest measured batch for an application whose
// measurements go further, as yolov3's do (8 in Pollux's simulator,
// measured to 16): a larger per-GPU batch accumulates (Adapting). A
// requested batch still runs at its measured step time: the published
// baselines' averages are only matched that way (with the limit applied
// to them, our tiresias is 8–15 % slower than the published one on
// workloads 2–4).
func (a *App) loadLimits(dir string) error {
	a.AdaptLocal = a.MaxLocal
	path := filepath.Join(dir, "limits.csv")
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	rows := 0
	err := readCSV(path, []string{"max_local_bsz"}, func(f []string, v []float64) error {
		rows++
		if !(v[0] >= a.MinLocal) {
			return fmt.Errorf("max_local_bsz %s: want at least the smallest measured per-GPU batch (%g)", f[0], a.MinLocal)
		}
		a.AdaptLocal = min(a.MaxLocal, v[0])
		return nil
	})
	if err == nil && rows != 1 {
		err = fmt.Errorf("limits.csv: want one row, got %d", rows)
	}
	return err
}

// loadValidation reads the validation files: the noise scale per epoch
// at each measured batch, and from the reference (smallest) batch's file
// the epoch size and the target.
func (a *App) loadValidation(dir string) error {
	files, _ := filepath.Glob(filepath.Join(dir, "validation-*.csv"))
	type file struct {
		b    float64
		path string
	}
	var fs []file
	for _, f := range files {
		b, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "validation-"), ".csv"))
		if err != nil || b <= 0 {
			return fmt.Errorf("%s: want validation-B.csv with B a positive batch size", filepath.Base(f))
		}
		fs = append(fs, file{float64(b), f})
	}
	if len(fs) == 0 {
		return fmt.Errorf("no validation-B.csv in %s", dir)
	}
	sort.Slice(fs, func(i, j int) bool { return fs[i].b < fs[j].b })
	a.M0, a.MaxBatch = fs[0].b, fs[len(fs)-1].b
	for i, f := range fs {
		var phis []float64
		var last float64
		err := readCSV(f.path, []string{"progress", "iteration", "metric", "grad_sqr", "grad_var"}, func(c []string, v []float64) error {
			if !(v[3] >= 0 && v[4] >= 0) {
				return fmt.Errorf("grad_sqr %s, grad_var %s: want both >= 0", c[3], c[4])
			}
			// grad_var is the variance of the M0-batch gradient (AdaptDL
			// normalizes it to the initial batch); over the squared
			// gradient norm it is the noise at M0, so the noise scale in
			// samples is M0 times it. A zero norm (measured as 0 late in
			// a run) is all noise: efficiency 1 at any batch.
			phi := math.Inf(1)
			if v[3] > 0 {
				phi = a.M0 * v[4] / v[3]
			}
			phis = append(phis, phi)
			last = v[0]
			return nil
		})
		if err != nil {
			return err
		}
		if len(phis) == 0 || last <= 0 {
			return fmt.Errorf("%s: no epochs", filepath.Base(f.path))
		}
		if i == 0 {
			a.Epochs = len(phis)
			a.EpochSize = last / float64(len(phis))
		}
		a.phi = append(a.phi, phiCurve{b: f.b, phi: phis})
	}
	return nil
}

// Target is the progress that completes a job of the application.
func (a *App) Target() float64 { return float64(a.Epochs) * a.EpochSize }

// Phi is the gradient noise scale at a progress for a job training at
// global batch m: each file's measurement for the epoch the progress
// falls in (its last past its end), interpolated linearly in log m
// between the two measured batches around m (the nearest outside them).
// The noise scale depends on the trajectory, and a job's follows the
// batch it trains at.
func (a *App) Phi(progress, m float64) float64 {
	e := max(int(progress/a.EpochSize), 0)
	at := func(c phiCurve) float64 { return c.phi[min(e, len(c.phi)-1)] }
	i := sort.Search(len(a.phi), func(i int) bool { return a.phi[i].b >= m })
	switch {
	case i == 0:
		return at(a.phi[0])
	case i == len(a.phi):
		return at(a.phi[len(a.phi)-1])
	}
	lo, hi := a.phi[i-1], a.phi[i]
	u := math.Log(m/lo.b) / math.Log(hi.b/lo.b)
	p, q := at(lo), at(hi)
	if math.IsInf(p, 1) || math.IsInf(q, 1) {
		if u < 0.5 {
			return p
		}
		return q
	}
	return p + (q-p)*u
}

// Efficiency is the statistical efficiency of global batch m at a
// progress: one sample at batch m is worth (phi+M0)/(phi+m) of one at
// M0 (Pollux's formula; 1 at M0, falling as m outgrows the noise scale).
func (a *App) Efficiency(m, progress float64) float64 {
	phi := a.Phi(progress, m)
	if math.IsInf(phi, 1) {
		return 1
	}
	return (phi + a.M0) / (phi + m)
}

// Adapting is the application as a batch-size-adapting policy runs it:
// micro-batches of at most AdaptLocal samples per GPU.
func (a *App) Adapting() *App {
	if a.AdaptLocal <= 0 || a.AdaptLocal >= a.MaxLocal {
		return a
	}
	c := *a
	c.MaxLocal = a.AdaptLocal
	return &c
}

// StepTime is the seconds of one step on replicas GPUs spread over
// nodes at per-GPU batch local. A measured placement interpolates its
// measurements linearly in the local batch; an unmeasured one is the
// single-GPU compute time at that batch plus the placement's sync time,
// interpolated linearly in the replica count among measured placements
// of its kind (one node, or several). Below the smallest measured batch
// a step costs what the smallest costs; above the largest, the step
// accumulates gradients over ceil(local/MaxLocal) micro-batches and
// syncs once.
func (a *App) StepTime(nodes, replicas int, local float64) float64 {
	if micro := math.Ceil(local / a.MaxLocal); micro > 1 {
		part := local / micro
		sync := a.sync(nodes, replicas)
		return micro*(a.StepTime(nodes, replicas, part)-sync) + sync
	}
	if pts, ok := a.steps[placement{nodes, replicas}]; ok {
		return interp(pts, local)
	}
	return interp(a.compute, local) + a.sync(nodes, replicas)
}

func (a *App) sync(nodes, replicas int) float64 {
	if replicas <= 1 {
		return 0
	}
	pts := a.syncSingle
	if nodes > 1 || len(pts) == 0 {
		pts = a.syncMulti
	}
	if len(pts) == 0 {
		return 0
	}
	return interp(pts, float64(replicas))
}

// Packed is the placement of n GPUs on nodes of perNode GPUs, as few
// nodes as possible.
func Packed(n, perNode int) (nodes, replicas int) {
	return (n + perNode - 1) / perNode, n
}

// Throughput is samples per second at global batch m on n GPUs packed
// on nodes of perNode GPUs.
func (a *App) Throughput(n, perNode int, m float64) float64 {
	if n <= 0 || m <= 0 {
		return 0
	}
	nodes, r := Packed(n, perNode)
	return m / a.StepTime(nodes, r, m/float64(n))
}

// GoodputOn is Goodput with the job's replicas GPUs on the given
// number of nodes.
func (a *App) GoodputOn(nodes, replicas int, m, progress float64) float64 {
	if nodes <= 0 || replicas <= 0 || m <= 0 {
		return 0
	}
	return m / a.StepTime(nodes, replicas, m/float64(replicas)) * a.Efficiency(m, progress) / a.M0
}

// Goodput is progress units per second: throughput times efficiency,
// over M0.
func (a *App) Goodput(n, perNode int, m, progress float64) float64 {
	return a.Throughput(n, perNode, m) * a.Efficiency(m, progress) / a.M0
}

// interp is piecewise linear over points sorted by x, flat outside.
func interp(pts []point, x float64) float64 {
	i := sort.Search(len(pts), func(i int) bool { return pts[i].x >= x })
	switch {
	case i == 0:
		return pts[0].y
	case i == len(pts):
		return pts[len(pts)-1].y
	}
	p, q := pts[i-1], pts[i]
	return p.y + (q.y-p.y)*(x-p.x)/(q.x-p.x)
}

// dedupe averages repeated measurements of one x.
func dedupe(pts []point) []point {
	var out []point
	n := 0
	for _, p := range pts {
		if len(out) > 0 && out[len(out)-1].x == p.x {
			l := &out[len(out)-1]
			n++
			l.y += (p.y - l.y) / float64(n)
			continue
		}
		out, n = append(out, p), 1
	}
	return out
}

func means(m map[int][2]float64) []point {
	var out []point
	for r, s := range m {
		out = append(out, point{float64(r), s[0] / s[1]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].x < out[j].x })
	return out
}

// parsePlacement reads a placement's digits (GPUs per node).
func parsePlacement(s string) (placement, error) {
	var p placement
	for _, c := range s {
		if c < '1' || c > '9' {
			return p, fmt.Errorf("placement %q: want one digit 1-9 per node", s)
		}
		p.nodes++
		p.replicas += int(c - '0')
	}
	if p.nodes == 0 {
		return p, fmt.Errorf("empty placement")
	}
	return p, nil
}

// readCSV checks the header and hands each row with its fields parsed
// as numbers: all but the first and the text columns must be.
func readCSV(path string, header []string, row func(f []string, v []float64) error, text ...int) error {
	fh, err := os.Open(path)
	if err != nil {
		return err
	}
	defer fh.Close()
	r := csv.NewReader(fh)
	r.FieldsPerRecord = len(header)
	head, err := r.Read()
	if err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	if strings.Join(head, ",") != strings.Join(header, ",") {
		return fmt.Errorf("%s: header %q, want %q", filepath.Base(path), strings.Join(head, ","), strings.Join(header, ","))
	}
	for line := 2; ; line++ {
		f, err := r.Read()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", filepath.Base(path), err)
		}
		v := make([]float64, len(f))
		for i, s := range f {
			x, err := strconv.ParseFloat(s, 64)
			if err != nil && i > 0 && !slices.Contains(text, i) {
				return fmt.Errorf("%s:%d: %s %q is not a number", filepath.Base(path), line, header[i], s)
			}
			v[i] = x
		}
		if err := row(f, v); err != nil {
			return fmt.Errorf("%s:%d: %w", filepath.Base(path), line, err)
		}
	}
}
