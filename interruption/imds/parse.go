package imds

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/fleetd/fleetd/interruption"
)

// Source is the Notice.Source of every notice this package produces.
const Source = "aws-imds"

// MaintenanceTimeLayout is the date layout of scheduled events. IMDS uses
// it instead of RFC 3339 for this one endpoint.
const MaintenanceTimeLayout = "2 Jan 2006 15:04:05 GMT"

// InstanceAction is the body of meta-data/spot/instance-action.
type InstanceAction struct {
	Action string    // hibernate, stop or terminate
	Time   time.Time // approximately when the action happens
}

// ParseInstanceAction parses a spot/instance-action body such as
// {"action":"terminate","time":"2017-09-18T08:22:00Z"}.
func ParseInstanceAction(body []byte) (InstanceAction, error) {
	var raw struct {
		Action *string `json:"action"`
		Time   *string `json:"time"`
	}
	if err := decodeStrict(body, &raw); err != nil {
		return InstanceAction{}, fmt.Errorf("spot/instance-action: %w", err)
	}
	if raw.Action == nil || raw.Time == nil {
		return InstanceAction{}, errors.New(`spot/instance-action: "action" and "time" are required`)
	}
	switch *raw.Action {
	case "hibernate", "stop", "terminate":
	default:
		return InstanceAction{}, fmt.Errorf("spot/instance-action: unknown action %q", *raw.Action)
	}
	t, err := time.Parse(time.RFC3339, *raw.Time)
	if err != nil {
		return InstanceAction{}, fmt.Errorf("spot/instance-action: time: %w", err)
	}
	return InstanceAction{Action: *raw.Action, Time: t.UTC()}, nil
}

// ParseRebalance parses an events/recommendations/rebalance body such as
// {"noticeTime":"2020-10-26T14:14:14Z"} and returns the notice time.
func ParseRebalance(body []byte) (time.Time, error) {
	var raw struct {
		NoticeTime *string `json:"noticeTime"`
	}
	if err := decodeStrict(body, &raw); err != nil {
		return time.Time{}, fmt.Errorf("rebalance recommendation: %w", err)
	}
	if raw.NoticeTime == nil {
		return time.Time{}, errors.New(`rebalance recommendation: "noticeTime" is required`)
	}
	t, err := time.Parse(time.RFC3339, *raw.NoticeTime)
	if err != nil {
		return time.Time{}, fmt.Errorf("rebalance recommendation: noticeTime: %w", err)
	}
	return t.UTC(), nil
}

// ScheduledEvent is one element of events/maintenance/scheduled.
type ScheduledEvent struct {
	Code              string // instance-reboot, system-reboot, system-maintenance, instance-retirement, instance-stop
	Description       string
	EventID           string
	State             string // active, completed, canceled
	NotBefore         time.Time
	NotAfter          time.Time // zero when absent
	NotBeforeDeadline time.Time // zero when absent
}

// Active reports whether the event is still to happen.
func (e ScheduledEvent) Active() bool { return e.State == "active" }

// ParseScheduledEvents parses an events/maintenance/scheduled body: a JSON
// array, "[]" when nothing is scheduled.
func ParseScheduledEvents(body []byte) ([]ScheduledEvent, error) {
	var raw []struct {
		Code              string `json:"Code"`
		Description       string `json:"Description"`
		EventID           string `json:"EventId"`
		State             string `json:"State"`
		NotBefore         string `json:"NotBefore"`
		NotAfter          string `json:"NotAfter"`
		NotBeforeDeadline string `json:"NotBeforeDeadline"`
	}
	if err := decodeStrict(body, &raw); err != nil {
		return nil, fmt.Errorf("maintenance/scheduled: %w", err)
	}
	if raw == nil {
		// "null" is valid JSON but not what IMDS sends; treat it as malformed
		// rather than silently as "no events".
		return nil, errors.New("maintenance/scheduled: want a JSON array")
	}
	out := make([]ScheduledEvent, 0, len(raw))
	for i, r := range raw {
		ev := ScheduledEvent{Code: r.Code, Description: r.Description, EventID: r.EventID, State: r.State}
		if r.Code == "" || r.EventID == "" || r.State == "" {
			return nil, fmt.Errorf("maintenance/scheduled[%d]: Code, EventId and State are required", i)
		}
		var err error
		if ev.NotBefore, err = parseMaintenanceTime(r.NotBefore, true); err != nil {
			return nil, fmt.Errorf("maintenance/scheduled[%d]: NotBefore: %w", i, err)
		}
		if ev.NotAfter, err = parseMaintenanceTime(r.NotAfter, false); err != nil {
			return nil, fmt.Errorf("maintenance/scheduled[%d]: NotAfter: %w", i, err)
		}
		if ev.NotBeforeDeadline, err = parseMaintenanceTime(r.NotBeforeDeadline, false); err != nil {
			return nil, fmt.Errorf("maintenance/scheduled[%d]: NotBeforeDeadline: %w", i, err)
		}
		out = append(out, ev)
	}
	return out, nil
}

func parseMaintenanceTime(s string, required bool) (time.Time, error) {
	if s == "" {
		if required {
			return time.Time{}, errors.New("missing")
		}
		return time.Time{}, nil
	}
	t, err := time.Parse(MaintenanceTimeLayout, s)
	if err != nil {
		return time.Time{}, err
	}
	return t.UTC(), nil
}

// decodeStrict decodes exactly one JSON value and rejects trailing data.
// Unknown fields are allowed: AWS adds fields over time and an agent must
// not break on them.
func decodeStrict(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("malformed JSON: %w", err)
	}
	if len(bytes.TrimSpace(body[dec.InputOffset():])) != 0 {
		return errors.New("malformed JSON: trailing data")
	}
	return nil
}

// SpotNotice converts an instance action into a notice (Node and Instance
// are filled in by the caller). Its ID is the same for every poll of one
// action, so watchers emit it once.
func SpotNotice(a InstanceAction) interruption.Notice {
	return interruption.Notice{
		Kind:     interruption.SpotInterruption,
		Deadline: a.Time,
		Source:   Source,
		Detail:   "action=" + a.Action,
		ID:       "spot-itn-" + a.Action + "-" + a.Time.Format(time.RFC3339),
	}
}

// RebalanceNotice converts a rebalance recommendation into a notice. It has
// no deadline: a recommendation is advice, not a reclaim.
func RebalanceNotice(noticeTime time.Time) interruption.Notice {
	return interruption.Notice{
		Kind:   interruption.Rebalance,
		Source: Source,
		Detail: "noticeTime=" + noticeTime.Format(time.RFC3339),
		ID:     "rebalance-" + noticeTime.Format(time.RFC3339),
	}
}

// MaintenanceNotice converts an active scheduled event into a notice whose
// deadline is the event's NotBefore.
func MaintenanceNotice(e ScheduledEvent) interruption.Notice {
	detail := e.Code
	if e.Description != "" {
		detail += ": " + e.Description
	}
	return interruption.Notice{
		Kind:     interruption.Maintenance,
		Deadline: e.NotBefore,
		Source:   Source,
		Detail:   detail,
		ID:       e.EventID,
	}
}
