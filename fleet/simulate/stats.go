package simulate

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Summary aggregates one policy's results over the windows.
type Summary struct {
	Policy      string `json:"policy"`
	Description string `json:"description"`
	Windows     int    `json:"windows"`
	// Zones is how many zones a run may use.
	Zones         int     `json:"zones"`
	MeanCost      float64 `json:"mean_cost"`
	P50Cost       float64 `json:"p50_cost"`
	P90Cost       float64 `json:"p90_cost"`
	SpotHours     float64 `json:"mean_spot_hours"`
	OnDemandHours float64 `json:"mean_on_demand_hours"`
	Misses        int     `json:"deadline_misses"`
	Infeasible    int     `json:"infeasible,omitempty"`
	Migrations    float64 `json:"mean_migrations"`
	Preemptions   float64 `json:"mean_preemptions"`
	Restarts      float64 `json:"mean_restarts"`
	// EgressCost and CrossRegionRestores are the means of the runs'
	// checkpoint egress (in MeanCost) and restores from another region.
	EgressCost          float64 `json:"mean_egress_cost,omitempty"`
	CrossRegionRestores float64 `json:"mean_cross_region_restores,omitempty"`
	// Ratio is the mean cost over the optimum's mean cost; MeanRatio the
	// mean of the per-window ratios. Zero without an optimum.
	Ratio     float64 `json:"ratio_to_optimum"`
	MeanRatio float64 `json:"mean_window_ratio"`
	// BelowOptimum counts windows where this policy cost less than the
	// optimum (a broken lower bound; expected 0).
	BelowOptimum int     `json:"below_optimum"`
	Passes       float64 `json:"mean_passes,omitempty"`
}

// Summarize aggregates results per policy, in the order of policies.
func Summarize(policies []Policy, zones int, results []Result) []Summary {
	opt := map[int]float64{}
	optName := ""
	for _, p := range policies {
		if p.Optimum {
			optName = p.Name
			break
		}
	}
	for _, r := range results {
		if r.Policy == optName && !r.Infeasible {
			opt[r.Window] = r.Cost
		}
	}
	optMean := 0.0
	var out []Summary
	for _, p := range policies {
		s := Summary{Policy: p.Name, Description: p.Description, Zones: zones}
		if p.OneZone {
			s.Zones = 1
		}
		var costs, ratios []float64
		for _, r := range results {
			if r.Policy != p.Name {
				continue
			}
			s.Windows++
			if r.Infeasible {
				s.Infeasible++
				continue
			}
			costs = append(costs, r.Cost)
			s.SpotHours += r.SpotHours
			s.OnDemandHours += r.OnDemandHours
			s.Migrations += float64(r.Migrations)
			s.Preemptions += float64(r.Preemptions)
			s.Restarts += float64(r.Restarts)
			s.Passes += float64(r.Passes)
			s.EgressCost += r.EgressCost
			s.CrossRegionRestores += float64(r.CrossRegionRestores)
			if r.Missed {
				s.Misses++
			}
			if o, ok := opt[r.Window]; ok && o > 0 {
				ratios = append(ratios, r.Cost/o)
				if r.Cost < o*(1-1e-9) {
					s.BelowOptimum++
				}
			}
		}
		n := float64(len(costs))
		if n > 0 {
			s.MeanCost = mean(costs)
			s.P50Cost = quantile(costs, 0.5)
			s.P90Cost = quantile(costs, 0.9)
			s.SpotHours /= n
			s.OnDemandHours /= n
			s.Migrations /= n
			s.Preemptions /= n
			s.Restarts /= n
			s.Passes /= n
			s.EgressCost /= n
			s.CrossRegionRestores /= n
		}
		if len(ratios) > 0 {
			s.MeanRatio = mean(ratios)
		}
		if p.Name == optName {
			optMean = s.MeanCost
		}
		out = append(out, s)
	}
	if optMean > 0 {
		for i := range out {
			out[i].Ratio = out[i].MeanCost / optMean
		}
	}
	return out
}

func mean(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

// quantile is the nearest-rank q-quantile.
func quantile(xs []float64, q float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// Report is the outcome of `fleetd sim`.
type Report struct {
	Trace    string        `json:"trace"`
	Fleet    string        `json:"fleet"`
	Zones    []string      `json:"zones"`
	Tick     time.Duration `json:"tick"`
	Job      Job           `json:"job"`
	Windows  int           `json:"windows"`
	Seed     uint64        `json:"seed"`
	Interval time.Duration `json:"interval"`
	// Warm: each window's fleet started from the trace's market history
	// before the window (Setup.Warm).
	Warm bool `json:"warm,omitempty"`
	// NoEgress: placement did not see the checkpoint's egress (Setup.NoEgress).
	NoEgress bool          `json:"no_egress,omitempty"`
	Wall     time.Duration `json:"wall_time"`
	Policies []Summary     `json:"policies"`
	Results  []Result      `json:"results,omitempty"`
}

// WriteText renders the report as a table.
func (r Report) WriteText(w io.Writer) error {
	fmt.Fprintf(w, "trace %s: %d zones (%s), tick %s\n", r.Trace, len(r.Zones), strings.Join(r.Zones, ", "), r.Tick)
	history := ""
	if r.Warm {
		history = "; market history warm from the trace before each window"
	}
	fmt.Fprintf(w, "fleet %s: work %s, deadline %s, changeover %s (launch %s); %d windows, seed %d%s; %s\n\n",
		r.Fleet, hours(r.Job.Work), hours(r.Job.Deadline), r.Job.Changeover, r.Job.LaunchLatency, r.Windows, r.Seed, history, r.Wall.Round(time.Millisecond))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tzones\tmean $\tp50 $\tp90 $\tspot h\ton-demand h\tmisses\tmigrations\tpreemptions\t× optimum\t")
	for _, s := range r.Policies {
		ratio := "-"
		if s.Ratio > 0 {
			ratio = fmt.Sprintf("%.3f", s.Ratio)
		}
		misses := fmt.Sprint(s.Misses)
		if s.Infeasible > 0 {
			misses += fmt.Sprintf(" (%d infeasible)", s.Infeasible)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%.2f\t%.1f\t%.1f\t%s\t%.2f\t%.2f\t%s\t\n", s.Policy, s.Zones, s.MeanCost, s.P50Cost, s.P90Cost,
			s.SpotHours, s.OnDemandHours, misses, s.Migrations, s.Preemptions, ratio)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.Job.CheckpointBytes <= 0 {
		return nil
	}
	// The checkpoint's journey, when the job has one (the optimum does
	// not model it).
	seen := "priced by placement"
	if r.NoEgress {
		seen = "hidden from placement (-no-egress) but charged"
	}
	fmt.Fprintf(w, "\ncheckpoint %.0f GB in %s, restored at every (re)start at %.0f MiB/s (%s); egress %s; prices: %s, as of %s\n",
		float64(r.Job.CheckpointBytes)/1e9, r.Job.CheckpointRegion, r.Job.RestoreMiBps, r.Job.restoreTime().Round(time.Second), seen, r.Job.Egress.Source, r.Job.Egress.AsOf)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tmean egress $\tcross-region restores\t")
	for _, s := range r.Policies {
		if s.Policy == "optimum" {
			continue
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t\n", s.Policy, s.EgressCost, s.CrossRegionRestores)
	}
	return tw.Flush()
}

func hours(d time.Duration) string {
	if d%time.Hour == 0 {
		return fmt.Sprintf("%dh", int64(d/time.Hour))
	}
	return d.String()
}
