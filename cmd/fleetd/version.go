package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func init() {
	register(command{name: "version", synopsis: "Print the fleetd version", run: runVersion})
}

func buildInfo() map[string]string {
	info := map[string]string{"version": version, "go": runtime.Version(), "platform": runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info["commit"] = s.Value
			case "vcs.modified":
				if s.Value == "true" {
					info["dirty"] = "true"
				}
			}
		}
	}
	return info
}

func runVersion(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
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
	if c := info["commit"]; c != "" {
		fmt.Fprintf(stdout, " commit %.12s", c)
		if info["dirty"] == "true" {
			fmt.Fprint(stdout, "+dirty")
		}
	}
	fmt.Fprintln(stdout)
	return exitOK
}
