//go:build !unix

package state

import "os"

// unlockFile is a no-op where bbolt does not use flock.
func unlockFile(*os.File) {}
