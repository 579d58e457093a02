package api

import (
	"bufio"
	"strings"
)

// ScanDevExports reads a dev daemon's startup lines (`fleetd serve -dev`
// prints "export FLEETD_ADDR=…" and then "export FLEETD_TOKEN=…") from sc
// until the token, and returns the address and token; token is empty when
// the output ended first. The caller keeps draining sc so that the daemon
// never blocks on a full pipe.
func ScanDevExports(sc *bufio.Scanner) (addr, token string) {
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if v, ok := strings.CutPrefix(line, "export FLEETD_ADDR="); ok {
			addr = v
		}
		if v, ok := strings.CutPrefix(line, "export FLEETD_TOKEN="); ok {
			return addr, v
		}
	}
	return addr, ""
}
