package fleet

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetd/fleetd/fleet/budget"
)

// projectCollector exports per-project gauges from the allocator's last
// decision and the budget ledger (docs/projects.md); nothing when the
// daemon has no project and decided nothing.
type projectCollector struct {
	pa                                    projectsAPI
	quota, maxGPUs, used, borrowed, lent  *prometheus.Desc
	queued, spend, budgetTotal, burnRate  *prometheus.Desc
	budgetPerHour, budgetExhausted, queue *prometheus.Desc
}

func newProjectCollector(d *Daemon) *projectCollector {
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, []string{"project"}, nil)
	}
	return &projectCollector{pa: projectsAPI{d},
		quota:           desc("fleetd_project_quota_gpus", "GPUs guaranteed to the project (quota_gpus)."),
		maxGPUs:         desc("fleetd_project_max_gpus", "The project's borrowing ceiling in GPUs (max_gpus)."),
		used:            desc("fleetd_project_used_gpus", "GPUs the allocator gives the project's fleets."),
		borrowed:        desc("fleetd_project_borrowed_gpus", "GPUs the project uses above its quota (lent by others)."),
		lent:            desc("fleetd_project_lent_gpus", "GPUs of the project's quota other projects use."),
		queued:          desc("fleetd_project_queued_fleets", "The project's fleets waiting in the queue."),
		spend:           desc("fleetd_project_spend_usd", "What the project's fleets have cost, from the budget ledger (spot, on-demand and egress)."),
		burnRate:        desc("fleetd_project_burn_usd_per_hour", "The project's current spend rate in USD per hour."),
		budgetTotal:     desc("fleetd_project_budget_total_usd", "The project budget's total; absent without one."),
		budgetPerHour:   desc("fleetd_project_budget_per_hour_usd", "The project budget's per-hour cap; absent without one."),
		budgetExhausted: desc("fleetd_project_budget_exhausted", "1 while the project's budget is exhausted (its fleets pause or stop)."),
		queue:           prometheus.NewDesc("fleetd_queue_length", "Fleets waiting in the queue, all projects.", nil, nil),
	}
}

func (c *projectCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.quota, c.maxGPUs, c.used, c.borrowed, c.lent, c.queued, c.spend, c.burnRate,
		c.budgetTotal, c.budgetPerHour, c.budgetExhausted, c.queue} {
		ch <- d
	}
}

func (c *projectCollector) Collect(ch chan<- prometheus.Metric) {
	d := c.pa.d
	dec, ok := d.ctrl.Decision()
	if !ok && !d.projects.Config().Enabled() {
		return
	}
	dec = c.pa.decision()
	g := func(desc *prometheus.Desc, v float64, project string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, project)
	}
	ch <- prometheus.MustNewConstMetric(c.queue, prometheus.GaugeValue, float64(len(dec.Queue)))
	for _, u := range dec.Projects {
		p, _ := d.projects.Config().Get(u.Name)
		if !p.Unlimited {
			g(c.quota, float64(u.QuotaGPUs), u.Name)
			g(c.maxGPUs, float64(u.MaxGPUs), u.Name)
			g(c.borrowed, float64(u.BorrowedGPUs), u.Name)
			g(c.lent, float64(u.LentGPUs), u.Name)
		}
		g(c.used, float64(u.UsedGPUs), u.Name)
		g(c.queued, float64(u.Queued), u.Name)
		var lim budget.Limits
		if p.Budget != nil {
			lim = *p.Budget
		}
		st := d.ctrl.BudgetStatus("project", u.Name, lim)
		g(c.spend, st.Total, u.Name)
		g(c.burnRate, st.PerHour, u.Name)
		if p.Budget != nil {
			if lim.Total > 0 {
				g(c.budgetTotal, lim.Total, u.Name)
			}
			if lim.PerHour > 0 {
				g(c.budgetPerHour, lim.PerHour, u.Name)
			}
			ex := 0.0
			if st.State == budget.Exhausted {
				ex = 1
			}
			g(c.budgetExhausted, ex, u.Name)
		}
	}
}
