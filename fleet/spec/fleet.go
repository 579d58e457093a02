package spec

import (
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"

	"github.com/fleetd/fleetd/providers"
)

var fleetSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "min_nodes", Required: true},
		{Name: "max_nodes", Required: true},
		{Name: "desired_nodes"},
		{Name: "deadline"},
		{Name: "work"},
		{Name: "project"},
	},
	Blocks: []hcl.BlockHeaderSchema{
		{Type: "budget"},
		{Type: "node"},
		{Type: "placement"},
		{Type: "provider", LabelNames: []string{"name"}},
		{Type: "training"},
		{Type: "rendezvous"},
	},
}

var nodeSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "gpus", Required: true},
		{Name: "gpu_types"},
		{Name: "min_vcpus"},
		{Name: "min_memory_gib"},
		{Name: "spot"},
		{Name: "max_price_per_gpu_hour"},
		{Name: "network"},
	},
}

var placementSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "strategy"},
		{Name: "colocate"},
		{Name: "on_demand_fallback"},
		{Name: "egress_per_gb"},
		{Name: "scale"},
	},
}

var trainingSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "command", Required: true},
		{Name: "setup"},
		{Name: "workdir"},
		{Name: "nproc_per_node"},
		{Name: "max_restarts"},
		{Name: "master_port"},
		{Name: "drain_grace"},
		{Name: "checkpoint_uri"},
		{Name: "env"},
		{Name: "warm_start"},
		{Name: "elastic"},
		{Name: "gradient_mb"},
		{Name: "peer_port"},
	},
	Blocks: []hcl.BlockHeaderSchema{
		{Type: "checkpoint"},
		{Type: "data"},
	},
}

var rendezvousSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "last_call"},
		{Name: "heartbeat"},
		{Name: "dead_after"},
	},
}

// MaxFleetNameLen bounds fleet names: they become cloud tags and labels
// together with a node suffix, and GCE labels stop at 63 characters.
const MaxFleetNameLen = 40

var fleetNameRE = regexp.MustCompile(`^[a-z]([a-z0-9-]*[a-z0-9])?$`)

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// reservedEnv are set by the agent for every worker (torchrun's contract);
// a spec that overrides them would break the job's coordination.
var reservedEnv = map[string]bool{
	"RANK": true, "LOCAL_RANK": true, "WORLD_SIZE": true, "LOCAL_WORLD_SIZE": true,
	"GROUP_RANK": true, "GROUP_WORLD_SIZE": true, "ROLE_NAME": true, "ROLE_RANK": true,
	"ROLE_WORLD_SIZE": true, "MASTER_ADDR": true, "MASTER_PORT": true,
}

var reservedEnvPrefixes = []string{"TORCHELASTIC_", "FLEETD_"}

var (
	strategies = []string{string(StrategyPriceCapacity), string(StrategyLowestPrice), string(StrategyCapacity)}
	colocates  = []string{string(ColocateZone), string(ColocateRegion), string(ColocateNone)}
	scales     = []string{string(ScaleGoodput), string(ScaleMax)}
)

// ValidFleetName reports whether name can be a fleet name.
func ValidFleetName(name string) bool {
	return len(name) <= MaxFleetNameLen && fleetNameRE.MatchString(name)
}

func (p *parser) decodeFleet(b *hcl.Block) *Fleet {
	fl := &Fleet{Name: b.Labels[0], DeclRange: b.DefRange}
	if !ValidFleetName(fl.Name) {
		p.errorAt(b.LabelRanges[0], "Invalid fleet name",
			fmt.Sprintf("%q is not a valid fleet name: it becomes a cloud tag and label, so use at most %d lowercase letters, digits and dashes, starting with a letter and not ending with a dash.", fl.Name, MaxFleetNameLen))
	}
	content, diags := b.Body.Content(fleetSchema)
	p.diags = append(p.diags, diags...)
	attrs := content.Attributes

	minA, maxA, desA := attrs["min_nodes"], attrs["max_nodes"], attrs["desired_nodes"]
	p.requireValue(minA)
	p.requireValue(maxA)
	minOK := p.intAttr(minA, &fl.MinNodes)
	if minOK && fl.MinNodes < 1 {
		p.attrError(minA, "Invalid min_nodes", fmt.Sprintf("min_nodes must be at least 1, got %d.", fl.MinNodes))
		minOK = false
	}
	maxOK := p.intAttr(maxA, &fl.MaxNodes)
	if maxOK && fl.MaxNodes < 1 {
		p.attrError(maxA, "Invalid max_nodes", fmt.Sprintf("max_nodes must be at least 1, got %d.", fl.MaxNodes))
		maxOK = false
	}
	if minOK && maxOK && fl.MinNodes > fl.MaxNodes {
		p.attrError(minA, "min_nodes is greater than max_nodes",
			fmt.Sprintf("min_nodes (%d) must not exceed max_nodes (%d, %s).", fl.MinNodes, fl.MaxNodes, p.where(maxA.Expr.Range())))
		// The range is broken; checking desired_nodes against it would
		// only repeat the same mistake.
		minOK, maxOK = false, false
	}
	if p.intAttr(desA, &fl.DesiredNodes) {
		switch {
		case fl.DesiredNodes < 1:
			p.attrError(desA, "Invalid desired_nodes", fmt.Sprintf("desired_nodes must be at least 1, got %d; omit it to let the autoscaler choose.", fl.DesiredNodes))
		case minOK && fl.DesiredNodes < fl.MinNodes:
			p.attrError(desA, "desired_nodes is below min_nodes", fmt.Sprintf("desired_nodes (%d) must be within [min_nodes, max_nodes] = [%d, %d].", fl.DesiredNodes, fl.MinNodes, fl.MaxNodes))
		case maxOK && fl.DesiredNodes > fl.MaxNodes:
			p.attrError(desA, "desired_nodes is above max_nodes", fmt.Sprintf("desired_nodes (%d) must be within [min_nodes, max_nodes] = [%d, %d].", fl.DesiredNodes, fl.MinNodes, fl.MaxNodes))
		}
	}

	deadlineA := attrs["deadline"]
	var deadline string
	if p.stringAttr(deadlineA, &deadline) {
		t, err := time.Parse(time.RFC3339, deadline)
		if err != nil {
			p.attrError(deadlineA, "Invalid deadline",
				fmt.Sprintf("deadline must be an RFC 3339 timestamp such as \"2026-12-01T00:00:00Z\", got %q.", deadline))
		} else {
			fl.Deadline = &t
		}
	}
	workA := attrs["work"]
	p.durationAttr(workA, &fl.Work, false)

	nodeA := p.decodeNode(b, content.Blocks, &fl.Node)
	placementA := p.decodePlacement(content.Blocks, &fl.Placement)
	p.decodeProviders(b, content.Blocks, fl)
	trainingA := p.decodeTraining(b, content.Blocks, &fl.Training)
	p.decodeRendezvous(content.Blocks, &fl.Rendezvous)
	decodeProject(p, attrs["project"], content.Blocks, fl, minOK && nodeA != nil)
	p.checkNetwork(nodeA, placementA, fl)

	// Cross-block rules, checked only when the values involved are valid so
	// one mistake is reported once.
	fallbackA := placementA["on_demand_fallback"]
	if fallbackA == nil && deadlineA != nil {
		// A deadline means "spend on-demand only as needed to make it".
		fl.Placement.Fallback, fl.Placement.FallbackAfter = FallbackDeadline, 0
	}
	if fl.Placement.Fallback == FallbackDeadline {
		switch {
		case deadlineA == nil && fallbackA != nil:
			p.attrError(fallbackA, "Deadline fallback without a deadline",
				`on_demand_fallback = "deadline" needs the fleet's deadline attribute, e.g. deadline = "2026-12-01T00:00:00Z".`)
		case fl.Deadline != nil && workA == nil:
			subject := deadlineA
			if fallbackA != nil {
				subject = fallbackA
			}
			p.attrError(subject, "Deadline without a work estimate",
				`Deadline mode spends on-demand capacity only as needed to finish in time, so it needs the remaining training time at max_nodes: set work, e.g. work = "48h".`)
		}
	}
	if fallbackA != nil && nodeA != nil && nodeA["spot"] != nil && !fl.Node.Spot {
		p.attrWarning(fallbackA, "on_demand_fallback has no effect",
			"node.spot = false already asks for on-demand capacity only, so the fallback policy is never used.")
	}
	if npA := trainingA["nproc_per_node"]; npA != nil && fl.Node.GPUs > 0 && fl.Training.NprocPerNode > fl.Node.GPUs {
		p.attrWarning(npA, "More workers than GPUs",
			fmt.Sprintf("nproc_per_node (%d) is greater than node.gpus (%d): several workers will share a GPU.", fl.Training.NprocPerNode, fl.Node.GPUs))
	}
	return fl
}

func (p *parser) decodeNode(fleet *hcl.Block, blocks hcl.Blocks, n *Node) hcl.Attributes {
	n.Spot = true
	b := p.singleBlock(blocks, "node")
	if b == nil {
		p.errorAt(fleet.DefRange, "Missing node block",
			"A fleet needs a node { gpus = N ... } block describing the hardware of each node.")
		return nil
	}
	content, diags := b.Body.Content(nodeSchema)
	p.diags = append(p.diags, diags...)
	a := content.Attributes

	p.requireValue(a["gpus"])
	gpusOK := p.intAttr(a["gpus"], &n.GPUs)
	if gpusOK && n.GPUs < 0 {
		p.attrError(a["gpus"], "Invalid gpus", fmt.Sprintf("gpus must be 0 (CPU-only nodes) or more, got %d.", n.GPUs))
		gpusOK = false
	}
	cpuOnly := gpusOK && n.GPUs == 0
	if ta := a["gpu_types"]; p.stringListAttr(ta, &n.GPUTypes) {
		for _, t := range n.GPUTypes {
			if strings.TrimSpace(t) == "" {
				p.attrError(ta, "Invalid gpu_types", "gpu_types must not contain empty names.")
				break
			}
		}
		if cpuOnly && len(n.GPUTypes) > 0 {
			p.attrError(ta, "GPU types on CPU-only nodes", "gpu_types needs gpus > 0; remove it for CPU-only nodes.")
		}
	}
	if va := a["min_vcpus"]; p.intAttr(va, &n.MinVCPUs) && n.MinVCPUs < 0 {
		p.attrError(va, "Invalid min_vcpus", fmt.Sprintf("min_vcpus must be 0 or more, got %d.", n.MinVCPUs))
	}
	if ma := a["min_memory_gib"]; p.floatAttr(ma, &n.MinMemoryGiB) && n.MinMemoryGiB < 0 {
		p.attrError(ma, "Invalid min_memory_gib", fmt.Sprintf("min_memory_gib must be 0 or more, got %g.", n.MinMemoryGiB))
	}
	p.boolAttr(a["spot"], &n.Spot)
	p.decodeNetwork(a, n)
	if pa := a["max_price_per_gpu_hour"]; p.floatAttr(pa, &n.MaxPricePerGPUHour) {
		switch {
		case n.MaxPricePerGPUHour <= 0:
			// Zero would match no offering at all; "no cap" is spelled by omitting it.
			p.attrError(pa, "Invalid max_price_per_gpu_hour",
				fmt.Sprintf("max_price_per_gpu_hour must be greater than 0, got %g; omit it for no price cap.", n.MaxPricePerGPUHour))
			n.MaxPricePerGPUHour = 0
		case cpuOnly:
			p.attrError(pa, "GPU price cap on CPU-only nodes", "max_price_per_gpu_hour needs gpus > 0.")
		}
	}
	return a
}

func (p *parser) decodePlacement(blocks hcl.Blocks, pl *Placement) hcl.Attributes {
	*pl = Placement{Strategy: StrategyPriceCapacity, Colocate: ColocateZone, Fallback: FallbackAfter, FallbackAfter: DefaultFallbackAfter}
	b := p.singleBlock(blocks, "placement")
	if b == nil {
		return hcl.Attributes{}
	}
	content, diags := b.Body.Content(placementSchema)
	p.diags = append(p.diags, diags...)
	a := content.Attributes
	var s string
	if p.enumAttr(a["strategy"], strategies, &s) {
		pl.Strategy = Strategy(s)
	}
	if p.enumAttr(a["colocate"], colocates, &s) {
		pl.Colocate = Colocate(s)
	}
	if p.enumAttr(a["scale"], scales, &s) {
		pl.Scale = Scale(s)
	}
	if fa := a["on_demand_fallback"]; p.stringAttr(fa, &s) {
		kind, after, err := parseFallback(s)
		if err != nil {
			p.attrError(fa, "Invalid on_demand_fallback", err.Error())
		} else {
			pl.Fallback, pl.FallbackAfter = kind, after
		}
	}
	p.decodeEgress(a["egress_per_gb"], pl)
	return a
}

func (p *parser) enumAttr(a *hcl.Attribute, allowed []string, dst *string) bool {
	var s string
	if !p.stringAttr(a, &s) {
		return false
	}
	for _, v := range allowed {
		if s == v {
			*dst = s
			return true
		}
	}
	detail := fmt.Sprintf("%s must be %s, got %q.", a.Name, quoteList(allowed), s)
	if sug := suggest(s, allowed); sug != "" {
		detail += fmt.Sprintf(" Did you mean %q?", sug)
	}
	p.attrError(a, "Unsupported "+a.Name, detail)
	return false
}

var fallbackAfterRE = regexp.MustCompile(`^after\s+(.+?)\s+below\s+min_nodes$`)

// parseFallback parses "never", "deadline" or "after DURATION below min_nodes".
func parseFallback(s string) (Fallback, time.Duration, error) {
	const form = `"after DURATION below min_nodes", e.g. "after 10m below min_nodes"`
	s = strings.TrimSpace(s)
	switch {
	case s == string(FallbackNever):
		return FallbackNever, 0, nil
	case s == string(FallbackDeadline):
		return FallbackDeadline, 0, nil
	case strings.HasPrefix(s, "after"):
		m := fallbackAfterRE.FindStringSubmatch(s)
		if m == nil {
			return "", 0, fmt.Errorf("on_demand_fallback %q must read %s.", s, form)
		}
		d, err := parseDuration(m[1])
		if err != nil {
			return "", 0, fmt.Errorf("on_demand_fallback: %s.", err)
		}
		if d <= 0 {
			return "", 0, fmt.Errorf("on_demand_fallback: the delay must be greater than zero, got %q; use \"never\" to disable the fallback.", m[1])
		}
		return FallbackAfter, d, nil
	}
	msg := fmt.Sprintf(`on_demand_fallback must be "never", "deadline" or %s; got %q.`, form, s)
	if sug := suggest(s, []string{string(FallbackNever), string(FallbackDeadline)}); sug != "" {
		msg += fmt.Sprintf(" Did you mean %q?", sug)
	}
	return "", 0, fmt.Errorf("%s", msg)
}

func (p *parser) decodeProviders(fleet *hcl.Block, blocks hcl.Blocks, fl *Fleet) {
	seen := map[string]*hcl.Block{}
	count := 0
	for _, b := range blocks {
		if b.Type != "provider" {
			continue
		}
		count++
		name := b.Labels[0]
		if prev, dup := seen[name]; dup {
			p.errorAt(b.LabelRanges[0], "Duplicate provider block",
				fmt.Sprintf("provider %q was already declared for this fleet at %s; merge the two blocks.", name, p.where(prev.DefRange)))
			continue
		}
		seen[name] = b
		var schema providers.ConfigSchema
		schemaOK := false
		if p.opts.Schema != nil {
			schema, schemaOK = p.opts.Schema(name)
		}
		if !schemaOK {
			detail := fmt.Sprintf("fleetd has no provider named %q.", name)
			if sug := suggest(name, p.opts.KnownProviders); sug != "" {
				detail += fmt.Sprintf(" Did you mean %q?", sug)
			} else if len(p.opts.KnownProviders) > 0 {
				detail += " Available providers: " + strings.Join(p.opts.KnownProviders, ", ") + "."
			}
			p.errorAt(b.LabelRanges[0], "Unknown provider", detail)
			continue
		}
		raw, diags := schema.DecodeBody(b.Body, p.ctx)
		if p.diags.HasErrors() {
			// Only a value that depends on a reported mistake (an undeclared
			// or invalid variable) is unknown here; report the cause once.
			diags = dropSummary(diags, "Unknown value")
		}
		p.diags = append(p.diags, diags...)
		if !diags.HasErrors() {
			fl.Providers = append(fl.Providers, Provider{Name: name, Config: raw, DeclRange: b.DefRange})
		}
	}
	if count == 0 {
		p.errorAt(fleet.DefRange, "Missing provider block",
			`A fleet needs at least one provider block saying where nodes come from, e.g. provider "aws" { ... }.`)
	}
}

func dropSummary(diags hcl.Diagnostics, summary string) hcl.Diagnostics {
	out := diags[:0:0]
	for _, d := range diags {
		if d.Summary != summary {
			out = append(out, d)
		}
	}
	return out
}

func (p *parser) decodeTraining(fleet *hcl.Block, blocks hcl.Blocks, t *Training) hcl.Attributes {
	*t = Training{NprocPerNode: DefaultNprocPerNode, MaxRestarts: DefaultMaxRestarts, MasterPort: DefaultMasterPort, DrainGrace: DefaultDrainGrace}
	b := p.singleBlock(blocks, "training")
	if b == nil {
		p.errorAt(fleet.DefRange, "Missing training block",
			`A fleet needs a training { command = [...] } block saying what each node runs.`)
		return hcl.Attributes{}
	}
	content, diags := b.Body.Content(trainingSchema)
	p.diags = append(p.diags, diags...)
	a := content.Attributes

	p.requireValue(a["command"])
	if ca := a["command"]; p.stringListAttr(ca, &t.Command) {
		switch {
		case len(t.Command) == 0:
			p.attrError(ca, "Empty command", `command must name a program, e.g. ["python3", "train.py"].`)
		case strings.TrimSpace(t.Command[0]) == "":
			p.attrError(ca, "Empty command", "The first element of command is the program to run and must not be empty.")
		}
	}
	if sa := a["setup"]; p.stringListAttr(sa, &t.Setup) {
		for _, s := range t.Setup {
			if strings.TrimSpace(s) == "" {
				p.attrError(sa, "Empty setup command", "setup must not contain empty commands.")
				break
			}
		}
	}
	if wa := a["workdir"]; p.stringAttr(wa, &t.Workdir) && strings.TrimSpace(t.Workdir) == "" {
		p.attrError(wa, "Empty workdir", "workdir must not be empty; omit it to use the agent's directory.")
	}
	if na := a["nproc_per_node"]; p.intAttr(na, &t.NprocPerNode) && t.NprocPerNode < 1 {
		p.attrError(na, "Invalid nproc_per_node", fmt.Sprintf("nproc_per_node must be at least 1, got %d.", t.NprocPerNode))
	}
	if ra := a["max_restarts"]; p.intAttr(ra, &t.MaxRestarts) && t.MaxRestarts < 0 {
		p.attrError(ra, "Invalid max_restarts", fmt.Sprintf("max_restarts must be 0 or more, got %d.", t.MaxRestarts))
	}
	if pa := a["master_port"]; p.intAttr(pa, &t.MasterPort) && (t.MasterPort < 1 || t.MasterPort > 65535) {
		p.attrError(pa, "Invalid master_port", fmt.Sprintf("master_port must be a TCP port in 1..65535, got %d.", t.MasterPort))
	}
	if pa := a["peer_port"]; p.intAttr(pa, &t.PeerPort) {
		switch {
		case t.PeerPort < 1 || t.PeerPort > 65535:
			p.attrError(pa, "Invalid peer_port", fmt.Sprintf("peer_port must be a TCP port in 1..65535, got %d; omit it to let each node pick a free one.", t.PeerPort))
		case t.PeerPort == t.MasterPort:
			p.attrError(pa, "peer_port collides with master_port", fmt.Sprintf("peer_port and master_port are both %d: the node's rank-0 store listens on master_port. Use another port.", t.PeerPort))
		}
	}
	p.durationAttr(a["drain_grace"], &t.DrainGrace, false)
	if ua := a["checkpoint_uri"]; p.stringAttr(ua, &t.CheckpointURI) && !validCheckpointURI(t.CheckpointURI) {
		p.attrError(ua, "Invalid checkpoint_uri",
			fmt.Sprintf("checkpoint_uri must be a URL with a scheme (s3://bucket/path, gs://bucket/path, file:///path) or an absolute path, got %q.", t.CheckpointURI))
	}
	var warm bool
	if p.boolAttr(a["warm_start"], &warm) {
		t.WarmStart = &warm
	}
	if ea := a["elastic"]; p.stringAttr(ea, &t.Elastic) && t.Elastic != ElasticRestart && t.Elastic != ElasticInProcess {
		p.attrError(ea, "Invalid elastic mode",
			fmt.Sprintf("elastic must be %q (workers restart at every membership change; the default) or %q (workers stay alive and are handed each new round; the script uses fleetd_elastic), got %q.",
				ElasticRestart, ElasticInProcess, t.Elastic))
	}
	if ga := a["gradient_mb"]; p.floatAttr(ga, &t.GradientMB) && !(t.GradientMB > 0) {
		p.attrError(ga, "Invalid gradient_mb",
			fmt.Sprintf("gradient_mb is the size of the gradients all-reduced each step in MB (parameters × 4 for fp32, × 2 for bf16) and must be above 0, got %g.", t.GradientMB))
	}
	if ea := a["env"]; p.stringMapAttr(ea, &t.Env) {
		for _, k := range slices.Sorted(maps.Keys(t.Env)) {
			p.checkEnvName(ea, k)
		}
	}
	p.decodeCheckpoint(content.Blocks, t)
	p.decodeData(content.Blocks, t)
	return a
}

func validCheckpointURI(s string) bool {
	if strings.HasPrefix(s, "/") {
		return true
	}
	u, err := url.Parse(s)
	return err == nil && u.Scheme != "" && (u.Host != "" || u.Path != "" || u.Opaque != "")
}

func (p *parser) checkEnvName(a *hcl.Attribute, name string) {
	var summary, detail string
	switch {
	case !envNameRE.MatchString(name):
		summary, detail = "Invalid environment variable name", fmt.Sprintf("%q is not a valid environment variable name: use letters, digits and underscores, not starting with a digit.", name)
	case reservedEnv[name] || hasAnyPrefix(name, reservedEnvPrefixes):
		summary, detail = "Reserved environment variable", fmt.Sprintf("%s is set by the fleetd agent for every worker (torchrun's environment contract) and cannot be overridden.", name)
	default:
		return
	}
	subject := a.Expr.Range()
	if r, ok := mapKeyRange(a.Expr, name); ok {
		subject = r
	}
	p.diags = append(p.diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: summary, Detail: detail, Subject: subject.Ptr(), Context: a.Range.Ptr()})
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, pre := range prefixes {
		if strings.HasPrefix(s, pre) {
			return true
		}
	}
	return false
}

// mapKeyRange finds the key expression of a literal { KEY = ... } so a
// diagnostic can point at the key itself.
func mapKeyRange(expr hcl.Expression, key string) (hcl.Range, bool) {
	oc, ok := expr.(*hclsyntax.ObjectConsExpr)
	if !ok {
		return hcl.Range{}, false
	}
	for _, item := range oc.Items {
		v, diags := item.KeyExpr.Value(nil)
		if diags.HasErrors() || v.Type() != cty.String || !v.IsKnown() || v.IsNull() {
			continue
		}
		if v.AsString() == key {
			return item.KeyExpr.Range(), true
		}
	}
	return hcl.Range{}, false
}

func (p *parser) decodeRendezvous(blocks hcl.Blocks, r *Rendezvous) {
	*r = Rendezvous{LastCall: DefaultLastCall, Heartbeat: DefaultHeartbeat, DeadAfter: DefaultDeadAfter}
	b := p.singleBlock(blocks, "rendezvous")
	if b == nil {
		return
	}
	content, diags := b.Body.Content(rendezvousSchema)
	p.diags = append(p.diags, diags...)
	a := content.Attributes
	// last_call may be zero: start as soon as min_nodes have joined.
	p.durationAttr(a["last_call"], &r.LastCall, true)
	hbA, daA := a["heartbeat"], a["dead_after"]
	hbOK := hbA == nil || p.durationAttr(hbA, &r.Heartbeat, false)
	daOK := daA == nil || p.durationAttr(daA, &r.DeadAfter, false)
	if hbOK && daOK && r.DeadAfter <= r.Heartbeat {
		subject := daA
		if subject == nil {
			subject = hbA
		}
		p.attrError(subject, "dead_after must exceed heartbeat",
			fmt.Sprintf("dead_after (%s) must be longer than heartbeat (%s), or every node is dropped between two heartbeats.", r.DeadAfter, r.Heartbeat))
	}
}
