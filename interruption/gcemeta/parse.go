package gcemeta

import (
	"fmt"
	"regexp"
	"strings"
)

// MaintenanceEvent is the value of instance/maintenance-event.
type MaintenanceEvent string

// The documented values of instance/maintenance-event.
const (
	MaintenanceNone            MaintenanceEvent = "NONE"
	MigrateOnHostMaintenance   MaintenanceEvent = "MIGRATE_ON_HOST_MAINTENANCE"
	TerminateOnHostMaintenance MaintenanceEvent = "TERMINATE_ON_HOST_MAINTENANCE"
)

// Pending reports whether a maintenance event is announced. Any value
// other than NONE counts, documented or not: a value GCE adds later most
// likely announces maintenance too, and a needless drain costs less than
// a node lost without one.
func (e MaintenanceEvent) Pending() bool { return e != MaintenanceNone }

// maxValue bounds the metadata values the parsers accept; the keys they
// read are a few bytes long.
const maxValue = 1024

var (
	enumRE = regexp.MustCompile(`^[A-Z][A-Z0-9_]{0,127}$`)
	zoneRE = regexp.MustCompile(`^[a-z]+-[a-z]+[0-9]+-[a-z]$`)
	nameRE = regexp.MustCompile(`^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$`)
)

// value trims the trailing newline some metadata values carry and rejects
// oversized bodies.
func value(body []byte) (string, error) {
	if len(body) > maxValue {
		return "", fmt.Errorf("gcemeta: value of %d bytes is too long", len(body))
	}
	return strings.TrimSpace(string(body)), nil
}

// ParsePreempted parses instance/preempted: TRUE or FALSE.
func ParsePreempted(body []byte) (bool, error) {
	v, err := value(body)
	if err != nil {
		return false, err
	}
	switch v {
	case "TRUE":
		return true, nil
	case "FALSE":
		return false, nil
	}
	return false, fmt.Errorf("gcemeta: instance/preempted is %q, want TRUE or FALSE", v)
}

// ParseMaintenanceEvent parses instance/maintenance-event: NONE or an
// upper-case event name.
func ParseMaintenanceEvent(body []byte) (MaintenanceEvent, error) {
	v, err := value(body)
	if err != nil {
		return "", err
	}
	if !enumRE.MatchString(v) {
		return "", fmt.Errorf("gcemeta: instance/maintenance-event is %q, want NONE or an event name", v)
	}
	return MaintenanceEvent(v), nil
}

// ParseZone parses instance/zone ("projects/123456789/zones/us-central1-a")
// into the zone name.
func ParseZone(body []byte) (string, error) {
	v, err := value(body)
	if err != nil {
		return "", err
	}
	parts := strings.Split(v, "/")
	if len(parts) != 4 || parts[0] != "projects" || parts[1] == "" || parts[2] != "zones" || !zoneRE.MatchString(parts[3]) {
		return "", fmt.Errorf("gcemeta: instance/zone is %q, want projects/NUMBER/zones/ZONE", v)
	}
	return parts[3], nil
}

// ParseName parses instance/name, an RFC 1035 label.
func ParseName(body []byte) (string, error) {
	v, err := value(body)
	if err != nil {
		return "", err
	}
	if !nameRE.MatchString(v) {
		return "", fmt.Errorf("gcemeta: instance/name is %q, not an instance name", v)
	}
	return v, nil
}
