//go:build !linux

package plugins

import "os/exec"

// setProcAttr has no portable parent-death signal to set outside Linux;
// there Manager.Close is the only cleanup.
func setProcAttr(*exec.Cmd) {}
