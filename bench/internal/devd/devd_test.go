package devd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestAgentStarted(t *testing.T) {
	for _, tc := range []struct {
		name, log string // "" : no log file
		want, err string
	}{
		{"the start line", `{"time":"2026-11-28T11:28:20.5Z","level":"INFO","msg":"cloud-init done"}
not json
{"time":"2026-11-28T11:28:21.663Z","level":"INFO","msg":"agent started","node":"bench-1-4"}
{"time":"2026-11-28T11:28:26.2Z","level":"INFO","msg":"agent started"}
`, "2026-11-28T11:28:21.663Z", ""},
		{"no start line", `{"time":"2026-11-28T11:28:20.5Z","msg":"registered"}` + "\n", "", `no "agent started" line`},
		{"no log", "", "", "agent start: open"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := Instance{Dir: t.TempDir()}
			if tc.log != "" {
				if err := os.MkdirAll(filepath.Dir(in.AgentLog()), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(in.AgentLog(), []byte(tc.log), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			at, err := in.AgentStarted()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := at.Format(time.RFC3339Nano); got != tc.want {
				t.Errorf("started %s, want %s", got, tc.want)
			}
		})
	}
}
