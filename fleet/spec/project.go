package spec

import (
	"fmt"
	"strings"

	"github.com/hashicorp/hcl/v2"

	"github.com/fleetd/fleetd/fleet/budget"
)

// decodeProject reads the fleet's project attribute and budget block and
// checks the project against Options.Projects: it must exist, and the
// fleet's min_nodes must fit in it (sized says min_nodes and node.gpus
// are valid).
func decodeProject(p *parser, a *hcl.Attribute, blocks hcl.Blocks, fl *Fleet, sized bool) {
	if bb := p.singleBlock(blocks, "budget"); bb != nil {
		lim, diags := budget.DecodeBlock(bb, p.ctx)
		p.diags = append(p.diags, diags...)
		if !diags.HasErrors() {
			fl.Budget = &lim
		}
	}
	if a != nil && p.stringAttr(a, &fl.Project) && fl.Project == "" {
		p.attrError(a, "Empty project", fmt.Sprintf("project must name one of the daemon's projects; omit it for the %q project.", DefaultProject))
		return
	}
	set := p.opts.Projects
	if set == nil {
		return
	}
	quota, ceiling, ok := set.Lookup(fl.ProjectName())
	if !ok {
		detail := fmt.Sprintf("The daemon has no project named %q.", fl.Project)
		if sug := suggest(fl.Project, set.Names()); sug != "" {
			detail += fmt.Sprintf(" Did you mean %q?", sug)
		} else if names := set.Names(); len(names) > 0 {
			detail += " Its projects: " + strings.Join(names, ", ") + "."
		}
		if a == nil {
			p.errorAt(fl.DeclRange, "Unknown project", detail)
		} else {
			p.attrError(a, "Unknown project", detail)
		}
		return
	}
	if !sized || ceiling == 0 {
		return
	}
	need := fl.MinNodes * max(fl.Node.GPUs, 0)
	subject := a
	if subject == nil {
		return // the default project, declared: its limits are the daemon's business
	}
	switch {
	case need > ceiling:
		p.attrError(subject, "Fleet cannot fit its project",
			fmt.Sprintf("min_nodes × node.gpus = %d GPUs, but project %q may hold at most %d (its max_gpus): the fleet could never start.", need, fl.Project, ceiling))
	case need > quota:
		p.attrWarning(subject, "min_nodes above the project's quota",
			fmt.Sprintf("min_nodes × node.gpus = %d GPUs exceeds project %q's quota of %d: a fleet's min_nodes are never borrowed, so it waits in the queue until GPUs no project's quota reserves are free.", need, fl.Project, quota))
	}
}
