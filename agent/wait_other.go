//go:build !linux

package agent

import (
	"os/exec"
	"syscall"
)

// waitAndSweep waits for a worker and then SIGKILLs what is left of its
// process group. Without waitid(WNOWAIT) the sweep follows the reap, so a
// (very unlikely) reuse of the group id in between is not excluded.
func waitAndSweep(cmd *exec.Cmd) error {
	err := cmd.Wait()
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	return err
}
