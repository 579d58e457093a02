package allocator

import (
	"github.com/fleetd/fleetd/fleet/budget"
	"github.com/fleetd/fleetd/fleet/projects"
	"github.com/fleetd/fleetd/fleet/spec"
)

// FromSpec fills the parts of a Fleet that its spec says: name, project,
// GPUs per node, min and max nodes, desired_nodes as Want, the elastic
// mode. The caller adds what it observes (live nodes, curve, prices,
// budget state, arrival).
func FromSpec(fl *spec.Fleet) Fleet {
	return Fleet{
		Name:        fl.Name,
		Project:     fl.ProjectName(),
		GPUsPerNode: fl.Node.GPUs,
		MinNodes:    fl.MinNodes,
		MaxNodes:    fl.MaxNodes,
		Want:        fl.DesiredNodes,
		Change:      Change{InProcess: fl.Training.Elastic == spec.ElasticInProcess},
	}
}

// BudgetOf is a ledger status as the allocator takes it.
func BudgetOf(st budget.Status) Budget {
	return Budget{State: st.State, PerHour: st.Limit.PerHour, OnExhausted: st.Limit.OnExhausted, Reason: st.Reason}
}

// ProjectsOf turns the daemon's project configuration into the
// allocator's projects, the undeclared default project included (not
// limited). status gives a project's budget status from the ledger; it
// is asked only for projects with a budget block.
func ProjectsOf(c *projects.Config, status func(p projects.Project) budget.Status) []Project {
	var out []Project
	declared := false
	for _, p := range c.Projects {
		ap := Project{Name: p.Name, QuotaGPUs: p.QuotaGPUs, MaxGPUs: p.MaxGPUs, Priority: p.Priority}
		if p.Budget != nil && status != nil {
			ap.Budget = BudgetOf(status(p))
		}
		declared = declared || p.Name == projects.Default
		out = append(out, ap)
	}
	if !declared {
		out = append(out, Project{Name: projects.Default, Unlimited: true})
	}
	return out
}
