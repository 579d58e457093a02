// Command fleetd-agent is the slim on-VM agent: registration, rendezvous
// client, worker supervision, metadata watchers, checkpoints through URLs
// the daemon signs, log shipping. It is what the daemon serves to nodes
// (GET /v1/agent/binary), about a tenth of the fleetd binary: no etcd
// server, no cloud control-plane SDKs, no object-store SDKs, no dashboard
// (TestAgentImportGraph keeps it so).
//
//	fleetd-agent [agent] [-config FILE] [-root DIR]
//	fleetd-agent version
//
// The optional "agent" word lets one systemd unit (ExecStart=… agent
// -config …) start this binary or the full fleetd alike. Built with
// `-tags nodestore` it also links the s3 and gcs drivers for fleets with
// checkpoint access = "node" (fleetd-agent-node-linux-ARCH).
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"

	"github.com/fleetd/fleetd/agent"
)

// version and commit are linked by make (-X main.version, -X main.commit),
// as for fleetd.
var (
	version = "dev"
	commit  = ""
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "agent":
			args = args[1:]
		case "version", "-version", "--version":
			printVersion(stdout)
			return agent.ExitOK
		}
	}
	fset := flag.NewFlagSet("fleetd-agent", flag.ContinueOnError)
	fset.SetOutput(stderr)
	return agent.Main(fset, args, stderr, version)
}

// printVersion: "fleetd-agent VERSION (GO, PLATFORM) commit C [nodestore]".
func printVersion(w io.Writer) {
	c := commit
	if bi, ok := debug.ReadBuildInfo(); ok && c == "" {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				c = s.Value
			}
		}
	}
	if c == "" {
		c = "unknown"
	}
	flavor := ""
	if nodeStores {
		flavor = " nodestore"
	}
	fmt.Fprintf(w, "fleetd-agent %s (%s, %s/%s) commit %.12s%s\n", version, runtime.Version(), runtime.GOOS, runtime.GOARCH, c, flavor)
}
