package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/fleetd/fleetd/plugins"
	"github.com/fleetd/fleetd/providers"
)

// builtinProviders are the providers compiled into fleetd. Each provider's
// wiring file adds itself from init; the daemon's plugin manager re-executes
// this binary as `fleetd plugin provider NAME` to serve one of them, so
// built-ins run out of process exactly like external plugins.
var builtinProviders = map[string]func() providers.Provider{}

// builtinProviderNames returns the built-in provider names, sorted, for
// plugins.ManagerOptions.Builtins.
func builtinProviderNames() []string {
	return slices.Sorted(maps.Keys(builtinProviders))
}

func init() {
	register(command{
		name:     "plugin",
		synopsis: "Serve a built-in provider plugin (started by the daemon)",
		hidden:   true,
		run:      runPlugin,
	})
}

// runPlugin serves a built-in provider over the plugin protocol. Stdout
// carries the go-plugin handshake, so nothing else may be printed there.
func runPlugin(args []string, _, stderr io.Writer) int {
	if len(args) != 2 || args[0] != "provider" {
		fmt.Fprintln(stderr, "Usage: fleetd plugin provider NAME")
		fmt.Fprintln(stderr, "Serves a built-in provider to the fleetd daemon; not meant to be run by hand.")
		return exitUsage
	}
	newProvider, ok := builtinProviders[args[1]]
	if !ok {
		fmt.Fprintf(stderr, "fleetd plugin: unknown built-in provider %q (built in: %s)\n",
			args[1], strings.Join(builtinProviderNames(), ", "))
		return exitUsage
	}
	plugins.Serve(newProvider())
	return exitOK
}
