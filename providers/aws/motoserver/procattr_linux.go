package motoserver

import "syscall"

// sysProcAttr puts moto in its own process group (Close kills the group)
// and has the kernel kill it if the test binary dies without Close, e.g.
// on a test timeout's panic. Pdeathsig fires when the forking OS thread
// exits; Go only ends threads of goroutines that exit while locked to them.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
