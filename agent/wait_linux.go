package agent

import (
	"os/exec"
	"syscall"
	"unsafe"
)

// waitid(2) constants (linux/wait.h).
const (
	pPID     = 1
	wExited  = 0x4
	wNoWait  = 0x1000000
	siginfoN = 128 // sizeof(siginfo_t)
)

// waitAndSweep waits for a worker (the leader of its own process group)
// and SIGKILLs whatever is left of its group, such as DataLoader
// processes. The group is swept while the leader is still an unreaped
// zombie, so its pid (the group id) cannot have been reused.
func waitAndSweep(cmd *exec.Cmd) error {
	pid := cmd.Process.Pid
	var info [siginfoN]byte
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid),
			uintptr(unsafe.Pointer(&info[0])), wExited|wNoWait, 0, 0)
		if errno != syscall.EINTR {
			break // exited (or not waitable: Wait reports why)
		}
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	return cmd.Wait()
}
