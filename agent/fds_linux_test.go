package agent

import (
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestInheritedFdsStayFromWorkers: a descriptor open without close-on-exec
// (as one the agent's parent left it) reaches a child until the agent
// marks it, and not after.
func TestInheritedFdsStayFromWorkers(t *testing.T) {
	fd, err := syscall.Open("/dev/null", syscall.O_RDONLY, 0) // no O_CLOEXEC, as an inherited fd
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	childFds := func() []string {
		out, err := exec.Command("/bin/sh", "-c", "ls /proc/$$/fd").Output()
		if err != nil {
			t.Fatal(err)
		}
		return strings.Fields(string(out))
	}
	name := strconv.Itoa(fd)
	if fds := childFds(); !slices.Contains(fds, name) {
		t.Fatalf("before marking, the child has fds %v, without %s: the test cannot see the leak", fds, name)
	}
	markInheritedCloseOnExec()
	if fds := childFds(); slices.Contains(fds, name) {
		t.Errorf("after marking, the child still has fd %s (fds %v)", name, fds)
	}
}
