// Package eventbridge turns the EC2 and AWS Health events that EventBridge
// rules deliver to an SQS queue into interruption notices: a pure parser
// (Parse) and a Poller that long-polls the queue. Shapes and consumption
// parameters follow shared/reference/interruption.md §2.
package eventbridge

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/fleetd/fleetd/interruption"
)

// Source is the Notice.Source of every notice this package produces.
const Source = "aws-eventbridge"

// The EventBridge detail-types fleetd consumes.
const (
	DetailTypeSpotInterruption = "EC2 Spot Instance Interruption Warning"
	DetailTypeRebalance        = "EC2 Instance Rebalance Recommendation"
	DetailTypeStateChange      = "EC2 Instance State-change Notification"
	DetailTypeHealth           = "AWS Health Event"
	// Capacity reservations can be reclaimed with the same two-minute
	// warning; AWS documents two spellings.
	DetailTypeCapacityReservationInterruption              = "EC2 Capacity Reservation Instance Interruption Warning"
	DetailTypeInterruptibleCapacityReservationInterruption = "EC2 Interruptible Capacity Reservation Instance Interruption Warning"
)

// spotWarning is the lead EC2 gives between the warning and the action.
const spotWarning = 2 * time.Minute

// ErrIgnored marks a well-formed EventBridge event that is not an
// interruption notice (a state change to running, a Health event about
// another service, an envelope version fleetd does not know). Consumers
// delete such messages without counting them as garbage.
var ErrIgnored = errors.New("not an interruption notice")

// Event is one parsed interruption event.
type Event struct {
	// ID is EventBridge's event id: the same event delivered twice has the
	// same ID (the dedup key).
	ID         string
	DetailType string
	Source     string // aws.ec2 or aws.health
	Account    string
	Region     string
	// Time is when EventBridge emitted the event.
	Time time.Time
	Kind interruption.Kind
	// Instances are the EC2 instance ids the event is about: one for EC2
	// events, possibly many for a Health event.
	Instances []string
	// Deadline is when the instances are expected to go; zero when there
	// is none (rebalance) or the loss already happened (state change).
	Deadline time.Time
	// Detail is the event's own word: the instance action, the new state,
	// or the Health event type code.
	Detail string
}

// Notices returns one notice per instance.
func (e Event) Notices() []interruption.Notice {
	out := make([]interruption.Notice, 0, len(e.Instances))
	for _, id := range e.Instances {
		out = append(out, interruption.Notice{Instance: id, Kind: e.Kind, Deadline: e.Deadline, Source: Source, Detail: e.Detail, ID: e.ID})
	}
	return out
}

var instanceIDRe = regexp.MustCompile(`^i-[0-9a-f]{8,17}$`)

type envelope struct {
	Version    *string         `json:"version"`
	ID         string          `json:"id"`
	DetailType string          `json:"detail-type"`
	Source     string          `json:"source"`
	Account    string          `json:"account"`
	Time       string          `json:"time"`
	Region     string          `json:"region"`
	Resources  []string        `json:"resources"`
	Detail     json.RawMessage `json:"detail"`
}

type ec2Detail struct {
	InstanceID              string `json:"instance-id"`
	InstanceAction          string `json:"instance-action"`
	State                   string `json:"state"`
	InstanceTerminationTime string `json:"instance-termination-time"`
}

type healthDetail struct {
	EventArn          string `json:"eventArn"`
	Service           string `json:"service"`
	EventTypeCode     string `json:"eventTypeCode"`
	EventTypeCategory string `json:"eventTypeCategory"`
	StartTime         string `json:"startTime"`
	AffectedEntities  []struct {
		EntityValue string `json:"entityValue"`
	} `json:"affectedEntities"`
}

// Parse parses an SQS message body holding one EventBridge event. It
// returns an error wrapping ErrIgnored for well-formed events that are not
// interruption notices, and another error for anything malformed.
func Parse(body []byte) (Event, error) {
	var env envelope
	if err := json.Unmarshal(body, &env); err != nil {
		return Event{}, fmt.Errorf("eventbridge: %w", err)
	}
	if env.Version == nil || env.ID == "" || env.DetailType == "" || env.Source == "" || env.Time == "" {
		return Event{}, errors.New(`eventbridge: "version", "id", "detail-type", "source" and "time" are required`)
	}
	t, err := time.Parse(time.RFC3339, env.Time)
	if err != nil {
		return Event{}, fmt.Errorf("eventbridge: time: %w", err)
	}
	ev := Event{ID: env.ID, DetailType: env.DetailType, Source: env.Source, Account: env.Account, Region: env.Region, Time: t.UTC()}
	// Like Karpenter, dispatch on (version, source, detail-type); an
	// envelope version fleetd was not written for is not guessed at.
	if *env.Version != "0" {
		return ev, fmt.Errorf("eventbridge: envelope version %q: %w", *env.Version, ErrIgnored)
	}
	switch {
	case env.Source == "aws.ec2" && env.DetailType == DetailTypeSpotInterruption:
		d, err := parseEC2Detail(env.Detail)
		if err != nil {
			return ev, err
		}
		ev.Kind, ev.Instances, ev.Detail = interruption.SpotInterruption, []string{d.InstanceID}, d.InstanceAction
		switch d.InstanceAction {
		case "hibernate":
			// Hibernation starts at once: there is no two-minute warning.
			ev.Deadline = ev.Time
		default:
			ev.Deadline = ev.Time.Add(spotWarning)
		}
		return ev, nil

	case env.Source == "aws.ec2" && (env.DetailType == DetailTypeCapacityReservationInterruption || env.DetailType == DetailTypeInterruptibleCapacityReservationInterruption):
		d, err := parseEC2Detail(env.Detail)
		if err != nil {
			return ev, err
		}
		ev.Kind, ev.Instances, ev.Detail = interruption.SpotInterruption, []string{d.InstanceID}, "capacity-reservation: "+d.InstanceAction
		ev.Deadline = ev.Time.Add(spotWarning)
		if d.InstanceTerminationTime != "" {
			tt, err := time.Parse(time.RFC3339, d.InstanceTerminationTime)
			if err != nil {
				return ev, fmt.Errorf("eventbridge: instance-termination-time: %w", err)
			}
			ev.Deadline = tt.UTC()
		}
		return ev, nil

	case env.Source == "aws.ec2" && env.DetailType == DetailTypeRebalance:
		d, err := parseEC2Detail(env.Detail)
		if err != nil {
			return ev, err
		}
		ev.Kind, ev.Instances, ev.Detail = interruption.Rebalance, []string{d.InstanceID}, "rebalance-recommendation"
		return ev, nil

	case env.Source == "aws.ec2" && env.DetailType == DetailTypeStateChange:
		d, err := parseEC2Detail(env.Detail)
		if err != nil {
			return ev, err
		}
		ev.Instances, ev.Detail = []string{d.InstanceID}, d.State
		switch d.State {
		case "stopping", "stopped", "shutting-down", "terminated":
			ev.Kind = interruption.Lost
			return ev, nil
		case "pending", "running":
			return ev, fmt.Errorf("eventbridge: state %q: %w", d.State, ErrIgnored)
		}
		return ev, fmt.Errorf("eventbridge: unknown instance state %q", d.State)

	case env.Source == "aws.health" && env.DetailType == DetailTypeHealth:
		return parseHealth(ev, env.Detail)
	}
	return ev, fmt.Errorf("eventbridge: %s %q: %w", env.Source, env.DetailType, ErrIgnored)
}

func parseEC2Detail(raw json.RawMessage) (ec2Detail, error) {
	var d ec2Detail
	if len(raw) == 0 {
		return d, errors.New(`eventbridge: "detail" is required`)
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		return d, fmt.Errorf("eventbridge: detail: %w", err)
	}
	// The resources ARN carries the zone, not the region, in its region
	// slot: the instance id is read from the detail only.
	if !instanceIDRe.MatchString(d.InstanceID) {
		return d, fmt.Errorf("eventbridge: detail: instance-id %q is not an EC2 instance id", d.InstanceID)
	}
	return d, nil
}

// healthTimeLayouts: AWS Health writes RFC 1123 ("Sat, 05 Jun 2016
// 15:10:09 GMT"); accept RFC 3339 as well.
var healthTimeLayouts = []string{time.RFC1123, time.RFC1123Z, time.RFC3339}

func parseHealth(ev Event, raw json.RawMessage) (Event, error) {
	var d healthDetail
	if len(raw) == 0 {
		return ev, errors.New(`eventbridge: "detail" is required`)
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		return ev, fmt.Errorf("eventbridge: detail: %w", err)
	}
	ev.Detail = d.EventTypeCode
	if d.Service != "EC2" || d.EventTypeCategory != "scheduledChange" {
		return ev, fmt.Errorf("eventbridge: health event %s/%s: %w", d.Service, d.EventTypeCategory, ErrIgnored)
	}
	for _, e := range d.AffectedEntities {
		if instanceIDRe.MatchString(e.EntityValue) {
			ev.Instances = append(ev.Instances, e.EntityValue)
		}
	}
	if len(ev.Instances) == 0 {
		return ev, fmt.Errorf("eventbridge: health event %s names no instance: %w", d.EventTypeCode, ErrIgnored)
	}
	ev.Kind = interruption.Maintenance
	ev.Deadline = ev.Time
	if d.StartTime != "" {
		var err error
		for _, layout := range healthTimeLayouts {
			var st time.Time
			if st, err = time.Parse(layout, d.StartTime); err == nil {
				ev.Deadline = st.UTC()
				break
			}
		}
		if err != nil {
			return ev, fmt.Errorf("eventbridge: health startTime %q is not an RFC 1123 time", d.StartTime)
		}
	}
	return ev, nil
}
