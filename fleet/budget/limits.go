// Package budget holds spend limits and the spend ledger of projects and
// fleets (docs/projects.md).
//
// Limits are what a `budget { … }` block says, in the daemon's project
// blocks and in fleet specs; DecodeBlock decodes one with positioned
// diagnostics so both parsers report the same mistakes the same way.
// Ledger accrues spend per fleet and per project from the run rates the
// daemon observes and the one-off charges (checkpoint egress) it
// records, and says where each account stands against its limits. It is
// pure (time is passed in) and a plain JSON value, so the daemon
// persists it in its state store and spend survives restarts and
// leader failover.
package budget

import (
	"fmt"
	"math/big"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
)

// Action is what happens when a total budget is spent.
type Action string

const (
	// Pause checkpoints the fleet, releases every node and keeps the
	// fleet and its checkpoints; `fleetd resume` or a raised budget
	// brings it back.
	Pause Action = "pause"
	// Stop ends the fleet as `fleetd destroy` would, its checkpoints kept.
	Stop Action = "stop"
)

// DefaultWarnAt is the fraction of a limit at which an account warns.
const DefaultWarnAt = 0.8

// Limits are one budget block. Zero PerHour or Total means no such limit.
type Limits struct {
	// PerHour caps the burn rate in $/h: at it the allocator adds no nodes.
	PerHour float64 `json:"per_hour,omitempty"`
	// Total caps the spend in $: at it OnExhausted happens.
	Total float64 `json:"total,omitempty"`
	// WarnAt is the fraction of either limit at which an alert is raised.
	WarnAt float64 `json:"warn_at,omitempty"`
	// OnExhausted is Pause or Stop.
	OnExhausted Action `json:"on_exhausted,omitempty"`
}

// WithDefaults fills WarnAt and OnExhausted.
func (l Limits) WithDefaults() Limits {
	if l.WarnAt == 0 {
		l.WarnAt = DefaultWarnAt
	}
	if l.OnExhausted == "" {
		l.OnExhausted = Pause
	}
	return l
}

// IsZero reports a budget without any limit.
func (l Limits) IsZero() bool { return l.PerHour == 0 && l.Total == 0 }

// Validate checks limits built in code (the API); DecodeBlock reports the
// same rules with positions.
func (l Limits) Validate() error {
	var errs []string
	if l.PerHour < 0 {
		errs = append(errs, fmt.Sprintf("per_hour must not be negative, got %g", l.PerHour))
	}
	if l.Total < 0 {
		errs = append(errs, fmt.Sprintf("total must not be negative, got %g", l.Total))
	}
	if l.WarnAt != 0 && !(l.WarnAt > 0 && l.WarnAt <= 1) {
		errs = append(errs, fmt.Sprintf("warn_at must be in (0, 1], got %g", l.WarnAt))
	}
	if l.OnExhausted != "" && l.OnExhausted != Pause && l.OnExhausted != Stop {
		errs = append(errs, fmt.Sprintf("on_exhausted must be %q or %q, got %q", Pause, Stop, l.OnExhausted))
	}
	if len(errs) > 0 {
		return fmt.Errorf("budget: %s", strings.Join(errs, "; "))
	}
	return nil
}

var blockSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "per_hour"},
		{Name: "total"},
		{Name: "warn_at"},
		{Name: "on_exhausted"},
	},
}

// DecodeBlock decodes a budget block's body. ctx evaluates expressions
// (the spec's variables and functions; nil for literal-only config). A
// value that is unknown (it depends on a mistake reported elsewhere) is
// skipped without a further diagnostic. Defaults are applied.
func DecodeBlock(b *hcl.Block, ctx *hcl.EvalContext) (Limits, hcl.Diagnostics) {
	var l Limits
	content, diags := b.Body.Content(blockSchema)
	a := content.Attributes
	bad := func(at *hcl.Attribute, summary, detail string) {
		diags = append(diags, &hcl.Diagnostic{
			Severity: hcl.DiagError, Summary: summary, Detail: detail,
			Subject: at.Expr.Range().Ptr(), Context: at.Range.Ptr(), Expression: at.Expr, EvalContext: ctx,
		})
	}
	money := func(name string, dst *float64) {
		at := a[name]
		v, ok := eval(at, ctx, cty.Number, &diags)
		if !ok {
			return
		}
		f, _ := v.AsBigFloat().Float64()
		if f <= 0 {
			bad(at, "Invalid budget "+name, fmt.Sprintf("%s is in dollars and must be greater than 0, got %s; omit it for no limit.", name, v.AsBigFloat().Text('g', -1)))
			return
		}
		*dst = f
	}
	money("per_hour", &l.PerHour)
	money("total", &l.Total)
	if at := a["warn_at"]; at != nil {
		if v, ok := eval(at, ctx, cty.Number, &diags); ok {
			f, _ := v.AsBigFloat().Float64()
			if f <= 0 || f > 1 {
				bad(at, "Invalid warn_at", fmt.Sprintf("warn_at is the fraction of the budget at which fleetd alerts and must be in (0, 1], e.g. 0.8; got %s.", v.AsBigFloat().Text('g', -1)))
			} else {
				l.WarnAt = f
			}
		}
	}
	if at := a["on_exhausted"]; at != nil {
		if v, ok := eval(at, ctx, cty.String, &diags); ok {
			switch s := Action(v.AsString()); s {
			case Pause, Stop:
				l.OnExhausted = s
			default:
				bad(at, "Invalid on_exhausted", fmt.Sprintf("on_exhausted must be %q (checkpoint, release every node, keep the fleet; `fleetd resume` brings it back) or %q (end the fleet), got %q.", Pause, Stop, s))
			}
		}
	}
	if !diags.HasErrors() && a["per_hour"] == nil && a["total"] == nil {
		diags = append(diags, &hcl.Diagnostic{
			Severity: hcl.DiagWarning, Summary: "Budget without a limit",
			Detail:  "This budget block sets neither per_hour nor total, so it limits nothing.",
			Subject: b.DefRange.Ptr(),
		})
	}
	return l.WithDefaults(), diags
}

// eval evaluates a to ty; false when unset, null, unknown or in error
// (reported into diags).
func eval(a *hcl.Attribute, ctx *hcl.EvalContext, ty cty.Type, diags *hcl.Diagnostics) (cty.Value, bool) {
	if a == nil {
		return cty.NilVal, false
	}
	v, d := a.Expr.Value(ctx)
	*diags = append(*diags, d...)
	if d.HasErrors() || !v.IsWhollyKnown() || v.IsNull() {
		return cty.NilVal, false
	}
	cv, err := convert.Convert(v, ty)
	if err != nil {
		*diags = append(*diags, &hcl.Diagnostic{
			Severity: hcl.DiagError, Summary: "Incorrect attribute value type",
			Detail:  fmt.Sprintf("Inappropriate value for attribute %q: %s required.", a.Name, ty.FriendlyNameForConstraint()),
			Subject: a.Expr.Range().Ptr(), Context: a.Range.Ptr(),
		})
		return cty.NilVal, false
	}
	return cv, true
}

// EvalInt evaluates a whole number attribute for other config decoders
// (the projects' quota_gpus, max_gpus, priority): false when unset or in
// error (reported into diags).
func EvalInt(a *hcl.Attribute, ctx *hcl.EvalContext, diags *hcl.Diagnostics) (int, bool) {
	v, ok := eval(a, ctx, cty.Number, diags)
	if !ok {
		return 0, false
	}
	bf := v.AsBigFloat()
	i, acc := bf.Int64()
	if !bf.IsInt() || acc != big.Exact || i > 1<<31 || i < -(1<<31) {
		*diags = append(*diags, &hcl.Diagnostic{
			Severity: hcl.DiagError, Summary: "Invalid value",
			Detail:  fmt.Sprintf("%s must be a whole number, got %s.", a.Name, bf.Text('g', -1)),
			Subject: a.Expr.Range().Ptr(), Context: a.Range.Ptr(),
		})
		return 0, false
	}
	return int(i), true
}
