package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMain removes the fleetd binary the tests built (150 MB a run) and
// fails the run if a process still runs it: a daemon, node or agent that
// a test left behind keeps a machine busy long after (an agent retries
// its gone daemon forever) and slows the tests that follow. What it finds
// is killed with its session.
func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		if left := leftBehind(binPath, 10*time.Second); len(left) > 0 {
			fmt.Fprintf(os.Stderr, "FAIL: %d processes of %s outlived the tests that started them:\n", len(left), binPath)
			for _, cmd := range left {
				fmt.Fprintf(os.Stderr, "    %.200s\n", cmd)
			}
			killAll(binPath)
			code = max(code, 1)
		}
		_ = os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

// leftBehind lists the command lines of the processes running bin. It
// waits up to wait for them to go: a node's supervisor ends its session
// after a grace once its daemon stopped it.
func leftBehind(bin string, wait time.Duration) []string {
	deadline := time.Now().Add(wait)
	for {
		var left []string
		for _, p := range scanProcs() {
			if p.cmd == bin || strings.HasPrefix(p.cmd, bin+" ") {
				left = append(left, p.cmd)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(200 * time.Millisecond)
	}
}
