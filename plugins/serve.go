package plugins

import (
	"os"

	"github.com/fleetd/fleetd/plugins/handshake"
	"github.com/fleetd/fleetd/providers"
	"github.com/hashicorp/go-hclog"
	plugin "github.com/hashicorp/go-plugin"
)

// ServeOptions configures ServeWith.
type ServeOptions struct {
	// Provider is the provider to serve. Required.
	Provider providers.Provider
	// Logger receives the plugin's own log lines. Default: NewLogger("provider").
	Logger hclog.Logger
}

// Serve serves p as a fleetd provider plugin over gRPC and returns when the
// daemon tells the plugin to stop. It is what an external provider's main
// calls, and all it calls:
//
//	func main() { plugins.Serve(myprovider.New()) }
//
// Stdout belongs to the go-plugin handshake: never print to it. Log with the
// logger from NewLogger (JSON on stderr), which the daemon parses into its
// own log with the plugin's levels and fields.
func Serve(p providers.Provider) { ServeWith(ServeOptions{Provider: p}) }

// ServeWith is Serve with options.
func ServeWith(opts ServeOptions) {
	logger := opts.Logger
	if logger == nil {
		logger = NewLogger("provider")
	}
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  handshake.HandshakeConfig,
		VersionedPlugins: pluginSets(opts.Provider, logger),
		GRPCServer:       plugin.DefaultGRPCServer,
		Logger:           logger,
	})
}

// NewLogger returns the logger a plugin should use: JSON lines on the
// process's stderr (captured now, before Serve redirects os.Stderr), at
// debug level, since the daemon filters by its own level.
func NewLogger(name string) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:       name,
		Level:      hclog.Debug,
		Output:     os.Stderr,
		JSONFormat: true,
	})
}
