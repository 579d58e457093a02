package providers

import (
	"errors"
	"fmt"
	"time"
)

// ErrorKind classifies provider failures so callers can branch on them
// without knowing the cloud's own codes.
type ErrorKind string

const (
	KindCapacity      ErrorKind = "insufficient-capacity"
	KindQuota         ErrorKind = "quota"
	KindNotFound      ErrorKind = "not-found"
	KindInvalidConfig ErrorKind = "invalid-config"
	KindTransient     ErrorKind = "transient" // throttled or temporarily unavailable: retry with backoff
	// KindAuth: the credentials are missing, expired or rejected. Retrying
	// does not help; a person must fix the credentials.
	KindAuth ErrorKind = "auth"
)

// Error is a typed provider error. Offering, when set, names the offering
// the error is about (capacity and quota errors are per offering or region).
type Error struct {
	Kind       ErrorKind
	Code       string // the cloud's own code, e.g. InsufficientInstanceCapacity
	Offering   string // Offering.Key(), if known
	RetryAfter time.Duration
	Err        error
}

func (e *Error) Error() string {
	msg := string(e.Kind)
	if e.Code != "" {
		msg += " (" + e.Code + ")"
	}
	if e.Offering != "" {
		msg += " for " + e.Offering
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

func (e *Error) Unwrap() error { return e.Err }

func newErr(kind ErrorKind, err error) *Error { return &Error{Kind: kind, Err: err} }

// Constructors for each kind; wrap the underlying cause.
func InsufficientCapacity(err error) *Error { return newErr(KindCapacity, err) }
func QuotaExceeded(err error) *Error        { return newErr(KindQuota, err) }
func NotFound(err error) *Error             { return newErr(KindNotFound, err) }
func InvalidConfig(err error) *Error        { return newErr(KindInvalidConfig, err) }
func Transient(err error) *Error            { return newErr(KindTransient, err) }
func Auth(err error) *Error                 { return newErr(KindAuth, err) }

// Errorf builds a typed error with a formatted cause.
func Errorf(kind ErrorKind, format string, args ...any) *Error {
	return newErr(kind, fmt.Errorf(format, args...))
}

// KindOf returns the kind of the first *Error in err's chain, or "".
func KindOf(err error) ErrorKind {
	var pe *Error
	if errors.As(err, &pe) {
		return pe.Kind
	}
	return ""
}

func IsCapacity(err error) bool      { return KindOf(err) == KindCapacity }
func IsQuota(err error) bool         { return KindOf(err) == KindQuota }
func IsNotFound(err error) bool      { return KindOf(err) == KindNotFound }
func IsInvalidConfig(err error) bool { return KindOf(err) == KindInvalidConfig }
func IsTransient(err error) bool     { return KindOf(err) == KindTransient }
func IsAuth(err error) bool          { return KindOf(err) == KindAuth }
