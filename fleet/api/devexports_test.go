package api

import (
	"bufio"
	"strings"
	"testing"
)

func TestScanDevExports(t *testing.T) {
	for _, tc := range []struct {
		name, out, addr, token, rest string
	}{
		{"dev daemon", "fleetd dev daemon: data in /tmp/x (deleted on exit)\n  export FLEETD_ADDR=http://127.0.0.1:4646\n  export FLEETD_TOKEN=abc\n  admin token file: /tmp/x/token\n",
			"http://127.0.0.1:4646", "abc", "admin token file: /tmp/x/token"},
		{"no token", "  export FLEETD_ADDR=http://127.0.0.1:1\nerror: bind\n", "http://127.0.0.1:1", "", ""},
		{"nothing", "", "", "", ""},
	} {
		sc := bufio.NewScanner(strings.NewReader(tc.out))
		addr, token := ScanDevExports(sc)
		if addr != tc.addr || token != tc.token {
			t.Errorf("%s: got %q, %q; want %q, %q", tc.name, addr, token, tc.addr, tc.token)
		}
		// It stops at the token: the rest is left for the caller to drain.
		rest := ""
		if sc.Scan() {
			rest = strings.TrimSpace(sc.Text())
		}
		if rest != tc.rest {
			t.Errorf("%s: next line %q, want %q", tc.name, rest, tc.rest)
		}
	}
}
