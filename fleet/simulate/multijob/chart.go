package multijob

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"time"
)

// WriteGPUsCSV writes every job's allocation over time, one row per
// constant stretch: policy,job,app,from_s,to_s,gpus.
func WriteGPUsCSV(w io.Writer, results []Result) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintln(bw, "policy,job,app,from_s,to_s,gpus")
	for _, r := range results {
		for _, j := range r.Jobs {
			for i, s := range j.GPUs {
				if s.GPUs == 0 || i+1 >= len(j.GPUs) {
					continue
				}
				fmt.Fprintf(bw, "%s,%s,%s,%.0f,%.0f,%d\n", r.Policy, j.Name, j.App, s.At.Seconds(), j.GPUs[i+1].At.Seconds(), s.GPUs)
			}
		}
	}
	return bw.Flush()
}

// gpusAt is a job's GPUs at t.
func gpusAt(steps []Step, t time.Duration) int {
	i := sort.Search(len(steps), func(i int) bool { return steps[i].At > t })
	if i == 0 {
		return 0
	}
	return steps[i-1].GPUs
}

// WriteChart draws a policy's run as an SVG stacked chart: time across,
// GPUs up, every job a band (jobs stacked in workload order, coloured by
// application) for as long as it holds GPUs.
func WriteChart(w io.Writer, r Result) error {
	// The times where any job's allocation changes.
	var ts []time.Duration
	for _, j := range r.Jobs {
		for _, s := range j.GPUs {
			ts = append(ts, s.At)
		}
	}
	sort.Slice(ts, func(a, b int) bool { return ts[a] < ts[b] })
	ts = compactDur(ts)
	if len(ts) < 2 {
		return fmt.Errorf("chart of %s: no job held GPUs", r.Policy)
	}
	end := ts[len(ts)-1]
	peak := 1
	for _, t := range ts {
		sum := 0
		for _, j := range r.Jobs {
			sum += gpusAt(j.GPUs, t)
		}
		peak = max(peak, sum)
	}
	const width, height, left, bottom, top = 960.0, 400.0, 50.0, 30.0, 24.0
	x := func(t time.Duration) float64 { return left + (width-left-10)*t.Seconds()/end.Seconds() }
	y := func(g int) float64 { return height - bottom - (height-bottom-top)*float64(g)/float64(peak) }
	apps := map[string]int{}
	for _, j := range r.Jobs {
		if _, ok := apps[j.App]; !ok {
			apps[j.App] = len(apps)
		}
	}
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="11">`+"\n", width, height)
	fmt.Fprintf(bw, `<text x="%.0f" y="14">%s: GPUs per job over time (%d jobs, peak %d GPUs, %.1f h)</text>`+"\n", left, r.Policy, len(r.Jobs), peak, end.Hours())
	// One rectangle per job and stretch between change times, merged while
	// neither its offset nor its GPUs change.
	type open struct {
		from     time.Duration
		off, gpu int
	}
	cur := make([]open, len(r.Jobs))
	flush := func(k int, to time.Duration) {
		o := cur[k]
		if o.gpu == 0 || to <= o.from {
			return
		}
		hue := (apps[r.Jobs[k].App]*67 + k*7) % 360
		fmt.Fprintf(bw, `<rect x="%.2f" y="%.2f" width="%.2f" height="%.2f" fill="hsl(%d,60%%,%d%%)"><title>%s</title></rect>`+"\n",
			x(o.from), y(o.off+o.gpu), x(to)-x(o.from), y(o.off)-y(o.off+o.gpu), hue, 45+k%3*10, r.Jobs[k].Name)
	}
	for _, t := range ts {
		off := 0
		for k, j := range r.Jobs {
			g := gpusAt(j.GPUs, t)
			if g != cur[k].gpu || (g > 0 && off != cur[k].off) {
				flush(k, t)
				cur[k] = open{from: t, off: off, gpu: g}
			}
			off += g
		}
	}
	for k := range cur {
		flush(k, end)
	}
	fmt.Fprintf(bw, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="black"/>`+"\n", left, y(0), width-10, y(0))
	fmt.Fprintf(bw, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="black"/>`+"\n", left, y(0), left, y(peak))
	fmt.Fprintf(bw, `<text x="%.0f" y="%.0f" text-anchor="end">%d</text><text x="%.0f" y="%.0f" text-anchor="end">0</text>`+"\n", left-4, y(peak)+4, peak, left-4, y(0)+4)
	for h := 0.0; h <= end.Hours(); h += tickHours(end.Hours()) {
		t := time.Duration(h * float64(time.Hour))
		fmt.Fprintf(bw, `<text x="%.1f" y="%.0f" text-anchor="middle">%gh</text>`+"\n", x(t), height-bottom+14, h)
	}
	fmt.Fprintln(bw, "</svg>")
	return bw.Flush()
}

func tickHours(total float64) float64 {
	for _, s := range []float64{1, 2, 4, 6, 12, 24, 48} {
		if total/s <= 12 {
			return s
		}
	}
	return 96
}

func compactDur(ts []time.Duration) []time.Duration {
	out := ts[:0]
	for i, t := range ts {
		if i == 0 || t != ts[i-1] {
			out = append(out, t)
		}
	}
	return out
}
