package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"github.com/fleetd/fleetd/fleet"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/plugins"
)

func init() {
	register(command{name: "serve", synopsis: "Run the control daemon", run: runServe})
}

func runServe(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "daemon config file (HCL)")
	dev := fs.Bool("dev", false, "throwaway daemon: temporary data dir, local provider, token printed")
	listen := fs.String("listen", "", "API listen address (overrides the config)")
	dataDir := fs.String("data-dir", "", "data directory (overrides the config)")
	logLevel := fs.String("log-level", "", "debug, info, warn or error")
	logJSON := fs.Bool("log-json", false, "log as JSON lines")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: fleetd serve [-config daemon.hcl] [-dev] [-listen ADDR] [-data-dir DIR]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	cfg := fleet.DefaultConfig()
	if *configPath != "" {
		c, files, diags := fleet.LoadConfig(*configPath)
		if diags.HasErrors() {
			_ = spec.WriteDiagnostics(stderr, files, diags, 100, false)
			return exitUsage
		}
		cfg = c
	}
	cfg.Dev = *dev
	if *dev {
		if *dataDir == "" {
			dir, err := os.MkdirTemp("", "fleetd-dev-")
			if err != nil {
				return exitCode(stderr, err)
			}
			defer os.RemoveAll(dir)
			*dataDir = dir
		}
		if *configPath == "" && *listen == "" {
			*listen = "127.0.0.1:7777"
		}
	}
	if *listen != "" {
		cfg.Listen = *listen
	}
	if *dataDir != "" {
		cfg.DataDir = *dataDir
		cfg.TokenFile = ""
	}
	if *logLevel != "" {
		cfg.LogLevel = *logLevel
	}
	if err := cfg.Finish(); err != nil {
		return exitCode(stderr, usageError{err})
	}
	log, err := newLogger(stderr, cfg.LogLevel, *logJSON)
	if err != nil {
		return exitCode(stderr, usageError{err})
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	mgr := newPluginManager(cfg, log)
	// Deferred first so it runs last: no provider process outlives the daemon.
	defer mgr.Close()
	d, err := fleet.New(ctx, fleet.Options{Config: cfg, Version: version, Logger: log, Schema: builtinSchema, Providers: mgr})
	if err != nil {
		return exitCode(stderr, err)
	}
	defer d.Close()
	if err := d.Listen(); err != nil {
		return exitCode(stderr, err)
	}
	if *dev {
		fmt.Fprintf(stdout, "fleetd dev daemon: data in %s (deleted on exit)\n", cfg.DataDir)
		fmt.Fprintf(stdout, "  export FLEETD_ADDR=%s\n", d.URL())
		fmt.Fprintf(stdout, "  export FLEETD_TOKEN=%s\n", d.Token())
		if ca := d.CA(); ca != nil {
			fmt.Fprintf(stdout, "  export FLEETD_CA_FINGERPRINT=%s\n", ca.Fingerprint)
		}
	}
	if err := d.Run(ctx); err != nil {
		return exitCode(stderr, err)
	}
	return exitOK
}

// newPluginManager starts built-in providers by re-executing this binary and
// external ones from the plugin dir, pinned by the config's checksums.
func newPluginManager(cfg fleet.Config, log *slog.Logger) *plugins.Manager {
	sums := map[string]string{}
	for _, p := range cfg.Plugins {
		sums[p.Name] = p.SHA256
	}
	level := hclog.Info
	if strings.EqualFold(cfg.LogLevel, "debug") {
		level = hclog.Debug
	}
	return plugins.NewManager(plugins.ManagerOptions{
		Builtins:  builtinProviderNames(),
		PluginDir: cfg.PluginDir,
		Checksums: sums,
		Env: func(name string) []string {
			// Local nodes keep their files inside the daemon's data dir.
			return []string{envLocalStateDir + "=" + filepath.Join(cfg.DataDir, "local")}
		},
		Logger: hclog.New(&hclog.LoggerOptions{Name: "plugins", Level: level, Output: os.Stderr}),
	})
}

func newLogger(w io.Writer, level string, asJSON bool) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(strings.ToUpper(level))); err != nil {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	if asJSON {
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return slog.New(slog.NewTextHandler(w, opts)), nil
}
