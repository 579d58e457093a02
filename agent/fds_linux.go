package agent

import (
	"os"
	"strconv"
	"sync"
	"syscall"
)

// keepInheritedFromWorkers marks close-on-exec every descriptor the agent
// inherited without that flag (Go opens its own with it), once per
// process. Go's exec passes such descriptors on to every child, so a cold
// worker would see what the agent's parent left open while a warm one,
// whose launcher closes all but its own, would not; torchrun's workers see
// neither (Python's subprocess closes them).
var keepInheritedFromWorkers = sync.OnceFunc(markInheritedCloseOnExec)

func markInheritedCloseOnExec() {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return // no /proc: nothing to mark by name, and nothing lost but tidiness
	}
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd) // the directory's own fd is gone by now: EBADF, ignored
		}
	}
}
