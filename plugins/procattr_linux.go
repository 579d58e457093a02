package plugins

import (
	"os/exec"
	"syscall"
)

// setProcAttr makes the kernel SIGKILL the plugin when the daemon dies, so
// a SIGKILLed daemon (no chance to run Close) leaves no plugin behind.
// Pdeathsig fires when the forking OS thread exits; Go only ends threads of
// goroutines that exit while locked to them, which the manager never does.
func setProcAttr(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
