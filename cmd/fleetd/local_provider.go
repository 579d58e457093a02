package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/local"
)

// envLocalStateDir sets the local provider's default state dir (a provider
// block's state_dir wins); the daemon points it into its data dir.
const envLocalStateDir = "FLEETD_LOCAL_STATE_DIR"

func init() {
	builtinProviders[local.Name] = func() providers.Provider {
		return local.New(local.Options{StateDir: os.Getenv(envLocalStateDir)})
	}
	register(command{
		name:     local.NodeCommand,
		synopsis: "Run one local-provider node (metadata emulator + agent); started by the local provider",
		hidden:   true,
		run:      runLocalNode,
	})
}

func runLocalNode(args []string, stdout, stderr io.Writer) int {
	fset := flag.NewFlagSet(local.NodeCommand, flag.ContinueOnError)
	fset.SetOutput(stderr)
	dir := fset.String("dir", "", "the node's instance `dir` (<state>/instances/<id>)")
	if err := fset.Parse(args); err != nil {
		return exitUsage
	}
	if *dir == "" || fset.NArg() > 0 {
		return exitCode(stderr, usageError{fmt.Errorf("usage: fleetd %s -dir DIR", local.NodeCommand)})
	}
	// The node has no terminal (own session); SIGTERM is a shutdown request.
	signal.Ignore(syscall.SIGHUP)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	return exitCode(stderr, local.RunNode(ctx, *dir))
}
