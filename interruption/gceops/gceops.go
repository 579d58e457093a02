// Package gceops is the daemon's GCE preemption detector: it polls the
// zone operations of the zones in use for compute.instances.preempted
// system events (and, optionally, the status of instances fleetd expects
// alive) and emits one interruption.Notice per event.
//
// GCE has no push channel for preemptions short of routing audit logs to
// Pub/Sub; the agent's metadata watch (interruption/gcemeta) is the fast
// path and this poller the safety net for nodes whose agent is wedged or
// already gone.
package gceops

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fleetd/fleetd/interruption"
)

// Defaults of a Poller.
const (
	// DefaultInterval between polls. GCE gives a Spot VM 30 s; a 10 s poll
	// leaves the daemon most of that window to start the replacement.
	DefaultInterval = 10 * time.Second
	// DefaultLookback is how far before its first poll a Poller looks when
	// Since is zero, so a daemon restarted mid-preemption still sees it.
	DefaultLookback = 5 * time.Minute
	// Retention bounds the operations a Poller remembers (for dedup):
	// older ones are ignored, so memory stays bounded.
	Retention = 6 * time.Hour
	// PreemptionLead is the time between the preemption event and the
	// VM's hard stop for Spot VMs.
	PreemptionLead = 30 * time.Second
)

// Source names of the notices.
const (
	SourceOperations = "gce-operations"
	SourceStatus     = "gce-status"
)

// OperationTypePreempted is the operationType GCE records for a preemption.
const OperationTypePreempted = "compute.instances.preempted"

// PreemptedFilter is the zone operations filter the Poller lists with.
const PreemptedFilter = `operationType = "` + OperationTypePreempted + `"`

// Operation is the part of a zone operation the Poller reads.
type Operation struct {
	ID            string
	Name          string
	OperationType string
	TargetLink    string // .../zones/ZONE/instances/NAME
	TargetID      string
	StatusMessage string
	InsertTime    time.Time
}

// Lister lists one zone's operations matching a Compute Engine filter,
// every page of them.
type Lister interface {
	ListZoneOperations(ctx context.Context, project, zone, filter string) ([]Operation, error)
}

// ErrInstanceNotFound is returned by a StatusReader for an absent instance.
var ErrInstanceNotFound = errors.New("instance not found")

// StatusReader reads an instance's status (RUNNING, STOPPING, TERMINATED...).
type StatusReader interface {
	InstanceStatus(ctx context.Context, project, zone, name string) (string, error)
}

// Poller polls for preemptions. Run one Run per Poller; it is not safe for
// concurrent use.
type Poller struct {
	Project string
	Lister  Lister
	// Zones returns the zones to poll (those with fleetd instances); it is
	// called on every poll, so the set can change.
	Zones func() []string
	// Interval between polls; default DefaultInterval.
	Interval time.Duration
	// Since: operations inserted before it are ignored. Zero means
	// DefaultLookback before the first poll.
	Since time.Time

	// Status and Watched, both optional, add instance status polling: each
	// watched instance ("ZONE/NAME", the gcp provider's instance id) that
	// fleetd expects alive but GCE has stopped yields a Preempted notice,
	// and one that vanished a Lost notice. Watched must leave out the
	// instances fleetd itself is deleting.
	Status  StatusReader
	Watched func() []string

	// OnError, if set, receives every poll error; polling goes on.
	OnError func(error)
	// Now is the clock; default time.Now.
	Now func() time.Time

	seen     map[string]time.Time // operation id → insert time
	reported map[string]bool      // status notices already emitted
}

// Run polls until ctx is done, calling emit (from this goroutine) for each
// new notice. It returns nil when ctx is cancelled.
func (p *Poller) Run(ctx context.Context, emit func(interruption.Notice)) error {
	if p.Lister == nil || p.Zones == nil {
		return errors.New("gceops: poller needs a Lister and Zones")
	}
	interval := p.Interval
	if interval <= 0 {
		interval = DefaultInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	return interruption.PollEvery(ctx, t.C, p.Poll, emit, p.OnError)
}

func (p *Poller) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
}

// Poll lists every zone once and returns the notices not returned before.
// A zone that fails does not hide the others' notices; errors are joined.
func (p *Poller) Poll(ctx context.Context) ([]interruption.Notice, error) {
	now := p.now()
	if p.seen == nil {
		p.seen = map[string]time.Time{}
		p.reported = map[string]bool{}
		if p.Since.IsZero() {
			p.Since = now.Add(-DefaultLookback)
		}
	}
	cutoff := p.Since
	if c := now.Add(-Retention); c.After(cutoff) {
		cutoff = c
	}
	for id, t := range p.seen {
		if t.Before(cutoff) {
			delete(p.seen, id)
		}
	}

	var (
		out  []interruption.Notice
		errs []error
	)
	for _, zone := range p.Zones() {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		ops, err := p.Lister.ListZoneOperations(ctx, p.Project, zone, PreemptedFilter)
		if err != nil {
			errs = append(errs, fmt.Errorf("gceops: list operations in %s: %w", zone, err))
			continue
		}
		for _, op := range ops {
			// The filter is the server's; check it again so a lister that
			// ignores it cannot make every operation a preemption.
			if op.OperationType != OperationTypePreempted || op.InsertTime.Before(cutoff) {
				continue
			}
			key := op.ID
			if key == "" {
				key = op.Name
			}
			if _, dup := p.seen[key]; dup {
				continue
			}
			p.seen[key] = op.InsertTime
			out = append(out, operationNotice(zone, op))
		}
	}
	if p.Status != nil && p.Watched != nil {
		ns, err := p.pollStatus(ctx)
		out = append(out, ns...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	return out, errors.Join(errs...)
}

func operationNotice(zone string, op Operation) interruption.Notice {
	name := op.TargetLink[strings.LastIndexByte(op.TargetLink, '/')+1:]
	detail := OperationTypePreempted + " (operation " + op.Name + ")"
	if op.StatusMessage != "" {
		detail = op.StatusMessage + " " + detail
	}
	return interruption.Notice{
		Instance: InstanceID(zone, name),
		Kind:     interruption.Preempted,
		Deadline: op.InsertTime.Add(PreemptionLead).UTC(),
		Source:   SourceOperations,
		Detail:   detail,
		ID:       "gce-operation:" + op.ID,
	}
}

// pollStatus reads each watched instance's status.
func (p *Poller) pollStatus(ctx context.Context) ([]interruption.Notice, error) {
	var (
		out  []interruption.Notice
		errs []error
	)
	for _, id := range p.Watched() {
		zone, name, ok := strings.Cut(id, "/")
		if !ok {
			errs = append(errs, fmt.Errorf("gceops: watched instance %q is not ZONE/NAME", id))
			continue
		}
		status, err := p.Status.InstanceStatus(ctx, p.Project, zone, name)
		var kind interruption.Kind
		switch {
		case errors.Is(err, ErrInstanceNotFound):
			kind = interruption.Lost
		case err != nil:
			errs = append(errs, fmt.Errorf("gceops: status of %s: %w", id, err))
			continue
		case status == "STOPPING" || status == "TERMINATED" || status == "STOPPED" || status == "SUSPENDING" || status == "SUSPENDED":
			kind = interruption.Preempted
		default:
			continue
		}
		key := id + "/" + string(kind)
		if p.reported[key] {
			continue
		}
		p.reported[key] = true
		n := interruption.Notice{Instance: id, Kind: kind, Source: SourceStatus, ID: "gce-status:" + key}
		if kind == interruption.Preempted {
			n.Detail = "instance status " + status
			n.Deadline = p.now().Add(PreemptionLead).UTC()
		} else {
			n.Detail = "instance not found"
		}
		out = append(out, n)
	}
	return out, errors.Join(errs...)
}

// InstanceID is the gcp provider's instance id for an instance: "ZONE/NAME".
func InstanceID(zone, name string) string { return zone + "/" + name }

// parseTime parses an operation timestamp (RFC 3339 with a zone offset).
func parseTime(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("gceops: bad timestamp %q: %w", s, err)
	}
	return t, nil
}

func formatID(id uint64) string {
	if id == 0 {
		return ""
	}
	return strconv.FormatUint(id, 10)
}
