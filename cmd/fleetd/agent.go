package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"syscall"

	"github.com/fleetd/fleetd/agent"
)

func init() {
	register(command{name: "agent", synopsis: "Run the on-VM elastic agent (started by cloud-init)", run: runAgent})
}

func runAgent(args []string, stdout, stderr io.Writer) int {
	fset := newFlagSet("agent", stderr)
	fset.SetOutput(stderr)
	cfgPath := fset.String("config", agent.DefaultConfigPath, "agent config `file` (JSON, written by the bootstrap)")
	root := fset.String("root", "", "`dir` the config's VM paths live under (set by the local provider; empty on a VM)")
	if err := fset.Parse(args); err != nil {
		return exitUsage
	}
	if fset.NArg() > 0 {
		return exitCode(stderr, usageError{fmt.Errorf("agent takes no arguments, got %q", fset.Args())})
	}
	cfg, err := agent.LoadConfig(*cfgPath)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return exitCode(stderr, err) // unreadable: an environment problem, not a spec error
		}
		return exitCode(stderr, usageError{err})
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	return exitCode(stderr, agent.Run(ctx, agent.Options{
		Config:      cfg,
		Root:        *root,
		MetadataURL: os.Getenv(agent.EnvMetadataURL),
		NodeAddr:    os.Getenv(agent.EnvNodeAddr),
		Stderr:      stderr,
		Version:     version,
	}))
}
