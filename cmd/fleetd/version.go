package main

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// version and commit are set at build time (make build, make release) with
// -ldflags "-X main.version=... -X main.commit=...". Without them, commit
// falls back to the VCS revision Go stamps into binaries built in a checkout.
var (
	version = "dev"
	commit  = ""
)

func init() {
	register(command{name: "version", synopsis: "Print the fleetd version", run: runVersion})
}

// buildInfo is what `fleetd version` prints: version, commit ("unknown"
// when neither the linker nor the build info knows it), dirty ("true" when
// built from a modified tree), go, platform.
func buildInfo() map[string]string {
	bi, _ := debug.ReadBuildInfo()
	return buildInfoFrom(version, commit, bi)
}

func buildInfoFrom(version, commit string, bi *debug.BuildInfo) map[string]string {
	info := map[string]string{"version": version, "commit": commit, "go": runtime.Version(), "platform": runtime.GOOS + "/" + runtime.GOARCH}
	if bi != nil {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if info["commit"] == "" {
					info["commit"] = s.Value
				}
			case "vcs.modified":
				if s.Value == "true" {
					info["dirty"] = "true"
				}
			}
		}
	}
	if info["commit"] == "" {
		info["commit"] = "unknown"
	}
	return info
}

func runVersion(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("version", stderr)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print as JSON")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	info := buildInfo()
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(info)
		return exitOK
	}
	fmt.Fprintf(stdout, "fleetd %s (%s, %s)", info["version"], info["go"], info["platform"])
	fmt.Fprintf(stdout, " commit %.12s", info["commit"])
	if info["dirty"] == "true" {
		fmt.Fprint(stdout, "+dirty")
	}
	fmt.Fprintln(stdout)
	return exitOK
}
