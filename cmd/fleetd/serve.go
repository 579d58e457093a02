package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/fleetd/fleetd/fleet"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/plugins"
)

func init() {
	register(command{name: "serve", synopsis: "Run the control daemon", run: runServe})
}

func runServe(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return serve(ctx, args, stdout, stderr)
}

// serve runs the daemon until ctx is cancelled (SIGINT/SIGTERM for the
// command; tests cancel it themselves).
func serve(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("serve", stderr)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "daemon config file (HCL)")
	dev := fs.Bool("dev", false, "throwaway daemon: temporary data dir, local provider, token printed")
	listen := fs.String("listen", "", "API listen address (overrides the config)")
	dataDir := fs.String("data-dir", "", "data directory (overrides the config; with -dev it is kept at exit)")
	advertise := fs.String("advertise-url", "", "URL nodes and other servers reach the daemon at (overrides the config's advertise_url)")
	logLevel := fs.String("log-level", "", "debug, info, warn or error")
	logJSON := fs.Bool("log-json", false, "log as JSON lines")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: fleetd serve [-config daemon.hcl] [-dev] [-listen ADDR] [-advertise-url URL] [-data-dir DIR]")
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
	// tempData: the dev daemon made its data dir and deletes it at exit. A
	// -data-dir the user names is theirs: it is never deleted.
	tempData := false
	if *dev {
		if *dataDir == "" {
			dir, err := os.MkdirTemp("", "fleetd-dev-")
			if err != nil {
				return exitCode(stderr, err)
			}
			// Deferred before the daemon's own cleanups, so it runs after them.
			defer os.RemoveAll(dir)
			*dataDir, tempData = dir, true
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
	if *advertise != "" {
		cfg.AdvertiseURL = *advertise
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
	printStartup(stdout, d, cfg, *dev, tempData)
	if why := fleet.UnreachableURL(d.URL()); why != "" {
		log.Warn("NODES ON OTHER MACHINES CANNOT REACH THIS DAEMON: its URL is "+why+". Only the local and sim providers' nodes can; "+
			"fleets on aws, gcp or external providers are refused until you "+fleet.AdvertiseURLHelp, "url", d.URL())
	}
	if err := d.Run(ctx); err != nil {
		return exitCode(stderr, err)
	}
	return exitOK
}

// printStartup tells the operator how to reach the daemon: the exports
// for the CLI, where the admin token is, the CA fingerprint (TLS with the
// daemon's CA) and the dashboard's address. The dashboard takes the token
// from the URL fragment (#token=…), which browsers never send to a server.
// A real daemon's stdout ends up in logs (the journal), so it names the
// token file instead of printing the token; a dev daemon prints it.
func printStartup(w io.Writer, d *fleet.Daemon, cfg fleet.Config, dev, tempData bool) {
	url := d.URL()
	if dev {
		kept := "kept at exit: -data-dir is yours"
		if tempData {
			kept = "deleted on exit"
		}
		fmt.Fprintf(w, "fleetd dev daemon: data in %s (%s)\n", cfg.DataDir, kept)
		fmt.Fprintf(w, "  export FLEETD_ADDR=%s\n", url)
		fmt.Fprintf(w, "  export FLEETD_TOKEN=%s\n", d.Token())
		if ca := d.CA(); ca != nil {
			fmt.Fprintf(w, "  export FLEETD_CA_FINGERPRINT=%s\n", ca.Fingerprint)
		}
		fmt.Fprintf(w, "  admin token file: %s\n", cfg.TokenFile)
		fmt.Fprintf(w, "  dashboard: %s/#token=%s\n", url, d.Token())
		return
	}
	fmt.Fprintf(w, "fleetd daemon: serving at %s, data in %s\n", url, cfg.DataDir)
	fmt.Fprintf(w, "  admin token file: %s (export FLEETD_TOKEN=$(cat %s))\n", cfg.TokenFile, cfg.TokenFile)
	if ca := d.CA(); ca != nil {
		fmt.Fprintf(w, "  CA fingerprint: %s (export FLEETD_CA_FINGERPRINT=%s)\n", ca.Fingerprint, ca.Fingerprint)
	} else if cfg.TLSEnabled() {
		fmt.Fprintf(w, "  TLS with %s: clients trust its issuer (-ca-cert / FLEETD_CACERT)\n", cfg.TLS.CertFile)
	}
	fmt.Fprintf(w, "  dashboard: %s/#token=<the token in %s>\n", url, cfg.TokenFile)
}

// newPluginManager starts built-in providers by re-executing this binary and
// external ones from the plugin dir, pinned by the config's checksums.
func newPluginManager(cfg fleet.Config, log *slog.Logger) *plugins.Manager {
	sums := map[string]string{}
	for _, p := range cfg.Plugins {
		sums[p.Name] = p.SHA256
	}
	return plugins.NewManager(plugins.ManagerOptions{
		Builtins:  builtinProviderNames(),
		PluginDir: cfg.PluginDir,
		Checksums: sums,
		Env: func(name string) []string {
			// Local nodes keep their files inside the daemon's data dir.
			return []string{envLocalStateDir + "=" + filepath.Join(cfg.DataDir, "local")}
		},
		Logger: pluginLogger(log, cfg.LogLevel),
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
