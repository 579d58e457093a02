// Package projects is the daemon configuration's project model: the
// `project "NAME" { … }` blocks and the pool's `max_gpus` (docs/projects.md).
//
// Decode reads them from the part of daemon.hcl the daemon's own schema
// leaves over, with positioned diagnostics; Config answers the questions
// the spec parser and the allocator ask about projects.
package projects

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"

	"github.com/fleetd/fleetd/fleet/budget"
)

// Default is the project of a fleet whose spec names none.
const Default = "default"

// Project is one project block.
type Project struct {
	Name string `json:"name"`
	// QuotaGPUs are guaranteed: the project always gets up to this many.
	QuotaGPUs int `json:"quota_gpus"`
	// MaxGPUs is the borrowing ceiling (≥ QuotaGPUs; defaults to it).
	MaxGPUs int `json:"max_gpus"`
	// Priority orders the queue and weights borrowing (higher first).
	Priority int `json:"priority,omitempty"`
	// Budget is nil without a budget block.
	Budget *budget.Limits `json:"budget,omitempty"`
	// Unlimited marks the implicit default project (not declared): its
	// fleets are sized as without projects, outside the pool.
	Unlimited bool      `json:"unlimited,omitempty"`
	DeclRange hcl.Range `json:"-"`
}

// Config is the projects part of the daemon configuration.
type Config struct {
	// MaxGPUs is the pool the projects share; 0 in the file means the
	// sum of the quotas (Pool gives the effective value).
	MaxGPUs  int       `json:"max_gpus,omitempty"`
	Projects []Project `json:"projects,omitempty"`
}

// Pool is the effective pool size: max_gpus, or the sum of the quotas.
func (c *Config) Pool() int {
	if c.MaxGPUs > 0 {
		return c.MaxGPUs
	}
	sum := 0
	for _, p := range c.Projects {
		sum += p.QuotaGPUs
	}
	return sum
}

// Enabled reports whether any project is declared: without one, fleets
// are sized as before projects existed.
func (c *Config) Enabled() bool { return len(c.Projects) > 0 }

// Get returns the named project. The default project exists even when
// not declared: then it is Unlimited. A nil Config has no projects.
func (c *Config) Get(name string) (Project, bool) {
	if name == "" {
		name = Default
	}
	if c == nil {
		c = &Config{}
	}
	for _, p := range c.Projects {
		if p.Name == name {
			return p, true
		}
	}
	if name == Default {
		return Project{Name: Default, Unlimited: true}, true
	}
	return Project{}, false
}

// Lookup is Get for the spec parser: a project's quota and ceiling in
// GPUs (0, 0 for an unlimited one).
func (c *Config) Lookup(name string) (quotaGPUs, maxGPUs int, ok bool) {
	p, ok := c.Get(name)
	return p.QuotaGPUs, p.MaxGPUs, ok
}

// Names lists the projects a spec may name, sorted.
func (c *Config) Names() []string {
	names := []string{Default}
	if c == nil {
		return names
	}
	for _, p := range c.Projects {
		if p.Name != Default {
			names = append(names, p.Name)
		}
	}
	sort.Strings(names)
	return names
}

var nameRE = regexp.MustCompile(`^[a-z]([a-z0-9-]*[a-z0-9])?$`)

// MaxNameLen bounds project names (they label metrics and tokens).
const MaxNameLen = 40

// Schema is what Decode reads; a daemon config's own schema must leave
// these to it.
var Schema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{{Name: "max_gpus"}},
	Blocks:     []hcl.BlockHeaderSchema{{Type: "project", LabelNames: []string{"name"}}},
}

var projectSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "quota_gpus", Required: true},
		{Name: "max_gpus"},
		{Name: "priority"},
	},
	Blocks: []hcl.BlockHeaderSchema{{Type: "budget"}},
}

// Decode reads max_gpus and the project blocks from body (the daemon
// config's remaining body: anything else in it is reported as not
// expected). It reports every problem, positioned.
func Decode(body hcl.Body) (Config, hcl.Diagnostics) {
	var c Config
	if body == nil {
		return c, nil
	}
	content, diags := body.Content(Schema)
	errAt := func(r hcl.Range, summary, detail string) {
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: summary, Detail: detail, Subject: r.Ptr()})
	}
	attrErr := func(a *hcl.Attribute, summary, detail string) {
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: summary, Detail: detail, Subject: a.Expr.Range().Ptr(), Context: a.Range.Ptr()})
	}
	poolA := content.Attributes["max_gpus"]
	if v, ok := budget.EvalInt(poolA, nil, &diags); ok {
		if v < 1 {
			attrErr(poolA, "Invalid max_gpus", fmt.Sprintf("max_gpus is the GPUs all projects share and must be at least 1, got %d; omit it to use the sum of the quotas.", v))
		} else {
			c.MaxGPUs = v
		}
	}
	seen := map[string]hcl.Range{}
	for _, b := range content.Blocks {
		p := Project{Name: b.Labels[0], DeclRange: b.DefRange}
		if prev, dup := seen[p.Name]; dup {
			errAt(b.LabelRanges[0], "Duplicate project", fmt.Sprintf("Project %q was already declared at line %d.", p.Name, prev.Start.Line))
			continue
		}
		seen[p.Name] = b.DefRange
		if len(p.Name) > MaxNameLen || !nameRE.MatchString(p.Name) {
			errAt(b.LabelRanges[0], "Invalid project name",
				fmt.Sprintf("%q is not a valid project name: use at most %d lowercase letters, digits and dashes, starting with a letter and not ending with a dash.", p.Name, MaxNameLen))
		}
		pc, d := b.Body.Content(projectSchema)
		diags = append(diags, d...)
		a := pc.Attributes
		quotaOK := false
		if v, ok := budget.EvalInt(a["quota_gpus"], nil, &diags); ok {
			if v < 0 {
				attrErr(a["quota_gpus"], "Invalid quota_gpus", fmt.Sprintf("quota_gpus is the project's guaranteed GPUs and must be 0 or more, got %d.", v))
			} else {
				p.QuotaGPUs, quotaOK = v, true
			}
		}
		p.MaxGPUs = p.QuotaGPUs
		if v, ok := budget.EvalInt(a["max_gpus"], nil, &diags); ok {
			switch {
			case v < 1:
				attrErr(a["max_gpus"], "Invalid max_gpus", fmt.Sprintf("max_gpus is the most GPUs the project may hold, borrowing included, and must be at least 1, got %d.", v))
			case quotaOK && v < p.QuotaGPUs:
				attrErr(a["quota_gpus"], "quota_gpus is greater than max_gpus",
					fmt.Sprintf("quota_gpus (%d) must not exceed the project's max_gpus (%d, line %d): the quota is guaranteed, max_gpus is the ceiling with borrowing.", p.QuotaGPUs, v, a["max_gpus"].Range.Start.Line))
			default:
				p.MaxGPUs = v
			}
		}
		if v, ok := budget.EvalInt(a["priority"], nil, &diags); ok {
			p.Priority = v
		}
		var bb *hcl.Block
		for _, blk := range pc.Blocks {
			if bb != nil {
				errAt(blk.DefRange, "Duplicate budget block", fmt.Sprintf("A budget block was already declared at line %d; a project has at most one.", bb.DefRange.Start.Line))
				continue
			}
			bb = blk
			lim, d := budget.DecodeBlock(blk, nil)
			diags = append(diags, d...)
			p.Budget = &lim
		}
		c.Projects = append(c.Projects, p)
	}
	if c.MaxGPUs > 0 {
		for _, p := range c.Projects {
			if p.MaxGPUs > c.MaxGPUs {
				diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagWarning, Summary: "Project ceiling above the pool",
					Detail:  fmt.Sprintf("Project %q may hold %d GPUs, but the pool (max_gpus) has %d: it never gets more than the pool.", p.Name, p.MaxGPUs, c.MaxGPUs),
					Subject: p.DeclRange.Ptr()})
			}
		}
		if q := quotaSum(c.Projects); q > c.MaxGPUs {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagWarning, Summary: "Quotas exceed the pool",
				Detail: fmt.Sprintf("The projects' quotas add up to %d GPUs but max_gpus is %d: not every quota can be honoured at once (%s).",
					q, c.MaxGPUs, strings.Join(quotaList(c.Projects), ", ")),
				Subject: poolA.Expr.Range().Ptr()})
		}
	}
	// Top to bottom, as the spec parser reports.
	sort.SliceStable(diags, func(i, j int) bool {
		a, b := diags[i].Subject, diags[j].Subject
		if a == nil || b == nil {
			return a == nil && b != nil
		}
		return a.Start.Byte < b.Start.Byte
	})
	return c, diags
}

func quotaSum(ps []Project) int {
	s := 0
	for _, p := range ps {
		s += p.QuotaGPUs
	}
	return s
}

func quotaList(ps []Project) []string {
	var out []string
	for _, p := range ps {
		out = append(out, fmt.Sprintf("%s %d", p.Name, p.QuotaGPUs))
	}
	return out
}

// Validate checks a project built in code (an admin's change through the
// API); Decode reports the same rules with positions.
func Validate(p Project) error {
	var errs []string
	if len(p.Name) > MaxNameLen || !nameRE.MatchString(p.Name) {
		errs = append(errs, fmt.Sprintf("%q is not a valid project name: use at most %d lowercase letters, digits and dashes, starting with a letter and not ending with a dash", p.Name, MaxNameLen))
	}
	if p.QuotaGPUs < 0 {
		errs = append(errs, fmt.Sprintf("quota_gpus must be 0 or more, got %d", p.QuotaGPUs))
	}
	switch {
	case p.MaxGPUs < 1:
		errs = append(errs, fmt.Sprintf("max_gpus must be at least 1, got %d", p.MaxGPUs))
	case p.QuotaGPUs > p.MaxGPUs:
		errs = append(errs, fmt.Sprintf("quota_gpus (%d) must not exceed max_gpus (%d): the quota is guaranteed, max_gpus is the ceiling with borrowing", p.QuotaGPUs, p.MaxGPUs))
	}
	if p.Budget != nil {
		if err := p.Budget.Validate(); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("project %s: %s", p.Name, strings.Join(errs, "; "))
	}
	return nil
}

// Change is an admin's change to one project, made through the API and
// kept in the state store: it replaces the daemon.hcl project of the same
// name, adds one, or (Deleted) removes it.
type Change struct {
	Project Project `json:"project"`
	Deleted bool    `json:"deleted,omitempty"`
}

// With is c with the changes applied (c itself is not modified): a change
// replaces the project of its name whole, or appends it; a deletion drops
// it. Projects keep daemon.hcl's order, added ones follow in the order of
// changes. The pool (max_gpus) stays daemon.hcl's.
func (c *Config) With(changes []Change) *Config {
	out := &Config{}
	if c != nil {
		out.MaxGPUs = c.MaxGPUs
		out.Projects = append(out.Projects, c.Projects...)
	}
	for _, ch := range changes {
		i := -1
		for j, p := range out.Projects {
			if p.Name == ch.Project.Name {
				i = j
			}
		}
		switch {
		case ch.Deleted && i >= 0:
			out.Projects = append(out.Projects[:i:i], out.Projects[i+1:]...)
		case ch.Deleted:
		case i >= 0:
			out.Projects[i] = ch.Project
		default:
			out.Projects = append(out.Projects, ch.Project)
		}
	}
	return out
}
