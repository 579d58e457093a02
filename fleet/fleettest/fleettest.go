// Package fleettest starts a real daemon for programs outside package
// fleet that need one with nodes that boot like VMs: benchmarks
// (bench/agentboot) and the agent binary's end-to-end tests. Its nodes are
// on the mem provider: launched, then "booting" until their agent
// registers, and the daemon renders their user-data with the agent
// download, as for a cloud.
package fleettest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/fleetd/fleetd/fleet"
	"github.com/fleetd/fleetd/fleet/spec/spectest"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/providertest"
)

// Options configure Start.
type Options struct {
	DataDir  string // required
	AgentDir string // the agent builds the daemon serves ("": next to this executable)
	Version  string // the daemon's version (default "test")
	Logger   *slog.Logger
}

type providerSet map[string]providers.Provider

func (s providerSet) Get(_ context.Context, name string) (providers.Provider, error) {
	if p, ok := s[name]; ok {
		return p, nil
	}
	return nil, fmt.Errorf("no provider %q", name)
}

// Start runs a daemon on 127.0.0.1 with the mem provider until stop.
func Start(ctx context.Context, o Options) (d *fleet.Daemon, stop func(), err error) {
	cfg := fleet.DefaultConfig()
	cfg.Listen, cfg.DataDir, cfg.TokenFile, cfg.AgentDir = "127.0.0.1:0", o.DataDir, "", o.AgentDir
	if err := cfg.Finish(); err != nil {
		return nil, nil, fmt.Errorf("fleettest: config: %w", err)
	}
	if o.Version == "" {
		o.Version = "test"
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ctx, cancel := context.WithCancel(ctx)
	d, err = fleet.New(ctx, fleet.Options{Config: cfg, Version: o.Version, Logger: o.Logger, Tick: 50 * time.Millisecond,
		Providers: providerSet{providertest.MemName: providertest.NewMemProvider()},
		Schema: func(name string) (providers.ConfigSchema, bool) {
			return providertest.MemSchema, name == providertest.MemName
		}})
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("fleettest: %w", err)
	}
	if err := d.Listen(); err != nil {
		cancel()
		d.Close()
		return nil, nil, fmt.Errorf("fleettest: listen: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = d.Run(ctx); close(done) }()
	return d, func() { cancel(); <-done; d.Close() }, nil
}

// Spec is one fleet of n nodes on the mem provider running command.
func Spec(name string, n int, command ...string) string {
	return spectest.Fleet{Name: name, Min: n, Max: n, Command: command}.HCL()
}
