package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"syscall"
)

// Exit codes of Main, the same as the fleetd CLI's: 0 ok, 1 error, 2 usage
// or config error.
const (
	ExitOK    = 0
	ExitError = 1
	ExitUsage = 2
)

// Main is the agent's command line, shared by `fleetd agent` and the slim
// cmd/fleetd-agent so the two cannot drift: flags on fset (the caller owns
// it so `fleetd help` can list them), config load, signals, Run. version
// is sent to the daemon at registration (its skew check).
func Main(fset *flag.FlagSet, args []string, stderr io.Writer, version string) int {
	cfgPath := fset.String("config", DefaultConfigPath, "agent config `file` (JSON, written by the bootstrap)")
	root := fset.String("root", "", "`dir` the config's VM paths live under (set by the local provider; empty on a VM)")
	if err := fset.Parse(args); err != nil {
		return ExitUsage
	}
	if fset.NArg() > 0 {
		fmt.Fprintf(stderr, "Error: agent takes no arguments, got %q\n", fset.Args())
		return ExitUsage
	}
	cfg, err := LoadConfig(*cfgPath)
	if err != nil {
		fmt.Fprintln(stderr, "Error:", err)
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return ExitError // unreadable: an environment problem, not a spec error
		}
		return ExitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := Run(ctx, Options{
		Config:      cfg,
		Root:        *root,
		MetadataURL: os.Getenv(EnvMetadataURL),
		NodeAddr:    os.Getenv(EnvNodeAddr),
		Stderr:      stderr,
		Version:     version,
	}); err != nil {
		fmt.Fprintln(stderr, "Error:", err)
		return ExitError
	}
	return ExitOK
}
