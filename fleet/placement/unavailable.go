package placement

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fleetd/fleetd/fleet/state"
)

// UnavailableKind is why an offering is in the unavailable-offerings cache.
// It sets the back-off: base TTL, doubled per consecutive failure, capped.
type UnavailableKind string

const (
	// UnavailableCapacity: the cloud has no capacity (3 min, as Karpenter on AWS).
	UnavailableCapacity UnavailableKind = "capacity"
	// UnavailableInterrupted: an instance of the offering got an
	// interruption notice or vanished (10 min). Also counts toward the
	// offering's interruption rate.
	UnavailableInterrupted UnavailableKind = "interrupted"
	// UnavailableQuota: an account limit; it will not clear by itself soon
	// (1 h, cap 6 h) and is surfaced as an alert.
	UnavailableQuota UnavailableKind = "quota"
	// UnavailableBootFailure: an instance never joined within the boot timeout (15 min).
	UnavailableBootFailure UnavailableKind = "boot-failure"
	// UnavailableLaunchError: any other non-retryable launch error (5 min),
	// e.g. an invalid configuration for that offering.
	UnavailableLaunchError UnavailableKind = "launch-error"
)

// StreakReset is how long after an unavailability has expired a new
// failure still counts as "repeated" and doubles the TTL.
const StreakReset = time.Hour

// TTL returns the base TTL and the cap of kind k.
func (k UnavailableKind) TTL() (base, limit time.Duration) {
	switch k {
	case UnavailableCapacity:
		return 3 * time.Minute, time.Hour
	case UnavailableInterrupted:
		return 10 * time.Minute, time.Hour
	case UnavailableQuota:
		return time.Hour, 6 * time.Hour
	case UnavailableBootFailure:
		return 15 * time.Minute, time.Hour
	default:
		return 5 * time.Minute, time.Hour
	}
}

// TTLFor returns the TTL of the streak-th consecutive failure (1-based).
func (k UnavailableKind) TTLFor(streak int) time.Duration {
	base, limit := k.TTL()
	d := base
	for i := 1; i < streak && d < limit; i++ {
		d *= 2
	}
	if d > limit {
		d = limit
	}
	return d
}

// Unavailability is the decoded cache entry of a record.
type Unavailability struct {
	Kind    UnavailableKind `json:"kind"`
	Streak  int             `json:"streak"` // consecutive failures, ≥ 1
	Message string          `json:"message"`
	Until   time.Time       `json:"until"`
}

// ParseUnavailable decodes rec's cache entry. ok is false when the record
// has no failure on file (never failed, or a launch succeeded since).
//
// The entry lives in the two persisted fields UnavailableUntil and
// UnavailableReason; the reason is "KIND#STREAK: message" so the streak
// survives restarts without a schema change.
func ParseUnavailable(rec state.OfferingRecord) (u Unavailability, ok bool) {
	if rec.UnavailableReason == "" {
		return Unavailability{}, false
	}
	u = Unavailability{Until: rec.UnavailableUntil, Streak: 1, Kind: UnavailableLaunchError, Message: rec.UnavailableReason}
	head, msg, found := strings.Cut(rec.UnavailableReason, ": ")
	if !found {
		return u, true
	}
	kind, n, hasN := strings.Cut(head, "#")
	if strings.ContainsAny(kind, " ") || kind == "" {
		return u, true
	}
	u.Kind, u.Message = UnavailableKind(kind), msg
	if hasN {
		if s, err := strconv.Atoi(n); err == nil && s > 0 {
			u.Streak = s
		}
	}
	return u, true
}

// HasFailure reports whether rec has a failure on file: one that no
// successful launch ended. An interruption streak that RecordLaunch kept
// (updated at or after its back-off ended: the offering was launched on
// since) does not count.
func HasFailure(rec state.OfferingRecord) bool {
	u, ok := ParseUnavailable(rec)
	if !ok {
		return false
	}
	return u.Kind != UnavailableInterrupted || rec.UpdatedAt.Before(u.Until)
}

// Available reports whether the offering may be launched at now.
func Available(rec state.OfferingRecord, now time.Time) bool {
	return !now.Before(rec.UnavailableUntil)
}

// MarkUnavailable records a failure of kind on rec at now and returns the
// updated record for the daemon to persist.
//
// A failure while the offering is still unavailable is the same event
// (several launches of one pass failing together): it changes nothing
// unless its kind backs off longer (quota after capacity), which then
// takes over at the same streak. A failure within
// StreakReset after the previous one expired doubles the TTL, up to the
// kind's cap. An UnavailableInterrupted mark also counts one interruption.
func MarkUnavailable(rec state.OfferingRecord, now time.Time, reason string, kind UnavailableKind) state.OfferingRecord {
	if kind == UnavailableInterrupted {
		rec.Interruptions++
	}
	prev, had := ParseUnavailable(rec)
	if had && now.Before(prev.Until) {
		// Still backed off: the same event seen again (other launches of
		// the same pass) changes nothing, unless it is a more severe kind.
		nb, _ := kind.TTL()
		pb, _ := prev.Kind.TTL()
		if nb <= pb {
			rec.UpdatedAt = now
			return rec
		}
	}
	streak := 1
	switch {
	case had && now.Before(prev.Until):
		streak = prev.Streak
	case had && now.Sub(prev.Until) < StreakReset:
		streak = prev.Streak + 1
	}
	until := now.Add(kind.TTLFor(streak))
	rec.UnavailableUntil = until
	rec.UnavailableReason = fmt.Sprintf("%s#%d: %s", kind, streak, oneLine(reason))
	rec.UpdatedAt = now
	return rec
}

// RecordLaunch records a successful launch on rec: it counts the launch
// and ends any failure streak, so the next failure starts from the base
// TTL again — except a streak of interruptions: spot capacity that comes
// back and goes again within StreakReset is a flapping offering, so its
// next interruption still doubles the back-off.
func RecordLaunch(rec state.OfferingRecord, now time.Time) state.OfferingRecord {
	rec.Launches++
	if u, ok := ParseUnavailable(rec); !ok || u.Kind != UnavailableInterrupted {
		rec.UnavailableReason = ""
	}
	if rec.UnavailableUntil.After(now) {
		rec.UnavailableUntil = now
	}
	rec.UpdatedAt = now
	return rec
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if s == "" {
		s = "unavailable"
	}
	return s
}
