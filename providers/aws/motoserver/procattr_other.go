//go:build unix && !linux

package motoserver

import "syscall"

// sysProcAttr puts moto in its own process group, which Close kills.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
