//go:build unix

package state

import (
	"os"
	"syscall"
)

// unlockFile drops bbolt's flock on f. Closing f alone is not enough after a
// panic inside bolt.Open: the mmap bbolt leaked keeps the open file
// description, and with it the lock, alive.
func unlockFile(f *os.File) {
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
}
