package state

import "errors"

// Errors callers may branch on with errors.Is. The wrapping error always
// names the state file and says what to do.
var (
	// ErrNotStateFile: the file is not a bbolt database, is damaged
	// (e.g. truncated), or is a bbolt database some other program wrote.
	ErrNotStateFile = errors.New("not a valid fleetd state file")
	// ErrSchemaTooNew: the file was written by a newer fleetd.
	ErrSchemaTooNew = errors.New("state file written by a newer fleetd")
	// ErrLocked: another process holds the file lock, most likely another
	// fleetd serving the same data dir.
	ErrLocked = errors.New("state file is locked")
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("state store is closed")
	// ErrReadOnly: a write was attempted inside View.
	ErrReadOnly = errors.New("write in a read-only transaction")
	// ErrTxDone: a Tx was used after its function returned.
	ErrTxDone = errors.New("transaction already finished")
	// ErrInvalid: a record failed validation (empty name, unknown node
	// state, reserved meta key…); nothing was written.
	ErrInvalid = errors.New("invalid record")
)
