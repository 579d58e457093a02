// Package plugins carries the provider contract over go-plugin's gRPC
// transport: the client and server shims, Serve for provider authors, and
// the Manager the daemon uses to run built-in and external provider
// processes. It holds no cloud code.
package plugins

import (
	"context"

	"github.com/fleetd/fleetd/plugins/handshake"
	providerv1 "github.com/fleetd/fleetd/plugins/proto/provider/v1"
	"github.com/fleetd/fleetd/providers"
	"github.com/hashicorp/go-hclog"
	plugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
)

// ProviderPlugin is the go-plugin glue for the provider service. On the
// plugin side it registers Impl on the gRPC server; on the host side it
// dispenses a *GRPCClient. net/rpc is not supported.
type ProviderPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	// Impl is the served provider; nil on the host side.
	Impl   providers.Provider
	logger hclog.Logger
}

var _ plugin.GRPCPlugin = (*ProviderPlugin)(nil)

func (p *ProviderPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	providerv1.RegisterProviderServer(s, newGRPCServer(p.Impl, p.logger))
	return nil
}

func (p *ProviderPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, cc *grpc.ClientConn) (any, error) {
	return NewGRPCClient(cc), nil
}

// pluginSets maps every supported protocol version to the provider plugin,
// so go-plugin can negotiate the highest version both sides speak.
func pluginSets(impl providers.Provider, logger hclog.Logger) map[int]plugin.PluginSet {
	sets := make(map[int]plugin.PluginSet, len(handshake.SupportedVersions))
	for _, v := range handshake.SupportedVersions {
		sets[v] = plugin.PluginSet{handshake.PluginName: &ProviderPlugin{Impl: impl, logger: logger}}
	}
	return sets
}
