//go:build !linux

package agent

// keepInheritedFromWorkers needs /proc/self/fd to find inherited
// descriptors; elsewhere they pass to workers as Go's exec leaves them.
func keepInheritedFromWorkers() {}
