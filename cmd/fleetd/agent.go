package main

import (
	"io"

	"github.com/fleetd/fleetd/agent"
	// `fleetd agent` is the full agent: it opens s3:// and gs:// stores
	// with the node's credentials (access = "node"), as it always has.
	_ "github.com/fleetd/fleetd/agent/ckpt/nodestores"
)

func init() {
	register(command{name: "agent", synopsis: "Run the on-VM elastic agent (nodes run the slim fleetd-agent; this is the full one)", run: runAgent})
}

func runAgent(args []string, stdout, stderr io.Writer) int {
	return agent.Main(newFlagSet("agent", stderr), args, stderr, version)
}
