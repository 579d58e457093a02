package allocator

import (
	"reflect"
	"testing"

	"github.com/fleetd/fleetd/fleet/budget"
	"github.com/fleetd/fleetd/fleet/projects"
	"github.com/fleetd/fleetd/fleet/spec"
)

func TestInputsFromConfigAndSpec(t *testing.T) {
	lim := budget.Limits{PerHour: 10, Total: 100, WarnAt: 0.8, OnExhausted: budget.Stop}
	cfg := projects.Config{MaxGPUs: 8, Projects: []projects.Project{
		{Name: "vision", QuotaGPUs: 4, MaxGPUs: 8, Priority: 10, Budget: &lim},
		{Name: "nlp", QuotaGPUs: 4, MaxGPUs: 4},
	}}
	var l budget.Ledger
	l.Run(t0, "resnet", "vision", 10, 0)
	asked := []string{}
	got := ProjectsOf(&cfg, func(p projects.Project) budget.Status {
		asked = append(asked, p.Name)
		return l.ProjectStatus(p.Name, *p.Budget, t0)
	})
	want := []Project{
		{Name: "vision", QuotaGPUs: 4, MaxGPUs: 8, Priority: 10, Budget: Budget{State: budget.Capped, PerHour: 10, OnExhausted: budget.Stop,
			Reason: "burns $10.00/h, at its $10.00/h cap: no nodes are added; the total runs out at 2026-11-28 22:00Z at this rate"}},
		{Name: "nlp", QuotaGPUs: 4, MaxGPUs: 4},
		{Name: "default", Unlimited: true},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("projects\n got %+v\nwant %+v", got, want)
	}
	if !reflect.DeepEqual(asked, []string{"vision"}) {
		t.Errorf("asked the ledger for %v", asked)
	}
	cfg.Projects = append(cfg.Projects, projects.Project{Name: "default", QuotaGPUs: 2, MaxGPUs: 2})
	if got := ProjectsOf(&cfg, nil); len(got) != 3 || got[2].Unlimited || got[2].QuotaGPUs != 2 {
		t.Errorf("a declared default project: %+v", got)
	}

	fl := &spec.Fleet{Name: "resnet", MinNodes: 2, MaxNodes: 8, DesiredNodes: 4, Node: spec.Node{GPUs: 8}, Training: spec.Training{Elastic: spec.ElasticInProcess}}
	f := FromSpec(fl)
	if !reflect.DeepEqual(f, Fleet{Name: "resnet", Project: "default", GPUsPerNode: 8, MinNodes: 2, MaxNodes: 8, Want: 4, Change: Change{InProcess: true}}) {
		t.Errorf("from spec: %+v", f)
	}
}
