package plugins

import (
	"context"

	providerv1 "github.com/fleetd/fleetd/plugins/proto/provider/v1"
	"github.com/fleetd/fleetd/providers"
	"google.golang.org/grpc"
)

// GRPCClient is the daemon side of the plugin protocol: a providers.Provider
// whose every call is an RPC to a plugin. Context deadlines and cancellation
// travel with each call (gRPC propagates them), so a provider blocked in the
// plugin observes the caller giving up.
//
// It always implements providers.Interrupter; against a provider that does
// not, Interrupt returns an error matching errors.ErrUnsupported.
type GRPCClient struct {
	rpc providerv1.ProviderClient
}

var (
	_ providers.Provider    = (*GRPCClient)(nil)
	_ providers.Interrupter = (*GRPCClient)(nil)
	_ providers.Checker     = (*GRPCClient)(nil)

	_ providers.NetworkReleaser = (*GRPCClient)(nil)
)

// NewGRPCClient returns a provider that speaks to the plugin behind cc.
func NewGRPCClient(cc grpc.ClientConnInterface) *GRPCClient {
	return &GRPCClient{rpc: providerv1.NewProviderClient(cc)}
}

func (c *GRPCClient) Info(ctx context.Context) (providers.Info, error) {
	resp, err := c.rpc.Info(ctx, &providerv1.InfoRequest{})
	if err != nil {
		return providers.Info{}, statusToError(ctx, "Info", err)
	}
	return infoFromPB(resp), nil
}

func (c *GRPCClient) Offerings(ctx context.Context, cfg providers.Config) ([]providers.Offering, error) {
	resp, err := c.rpc.Offerings(ctx, &providerv1.OfferingsRequest{Config: configToPB(cfg)})
	if err != nil {
		return nil, statusToError(ctx, "Offerings", err)
	}
	return offeringsFromPB(resp.GetOfferings()), nil
}

func (c *GRPCClient) Create(ctx context.Context, cfg providers.Config, req providers.LaunchRequest) ([]providers.Instance, error) {
	lr, err := launchToPB(req)
	if err != nil {
		return nil, err
	}
	resp, err := c.rpc.Create(ctx, &providerv1.CreateRequest{Config: configToPB(cfg), Request: lr})
	if err != nil {
		return nil, statusToError(ctx, "Create", err)
	}
	return instancesFromPB(resp.GetInstances()), nil
}

func (c *GRPCClient) Get(ctx context.Context, cfg providers.Config, id string) (providers.Instance, error) {
	resp, err := c.rpc.Get(ctx, &providerv1.GetRequest{Config: configToPB(cfg), Id: id})
	if err != nil {
		return providers.Instance{}, statusToError(ctx, "Get", err)
	}
	return instanceFromPB(resp.GetInstance()), nil
}

func (c *GRPCClient) List(ctx context.Context, cfg providers.Config, tags map[string]string) ([]providers.Instance, error) {
	resp, err := c.rpc.List(ctx, &providerv1.ListRequest{Config: configToPB(cfg), Tags: tags})
	if err != nil {
		return nil, statusToError(ctx, "List", err)
	}
	return instancesFromPB(resp.GetInstances()), nil
}

func (c *GRPCClient) Delete(ctx context.Context, cfg providers.Config, id string) error {
	_, err := c.rpc.Delete(ctx, &providerv1.DeleteRequest{Config: configToPB(cfg), Id: id})
	return statusToError(ctx, "Delete", err)
}

func (c *GRPCClient) Interrupt(ctx context.Context, cfg providers.Config, id string, info providers.InterruptionInfo) error {
	_, err := c.rpc.Interrupt(ctx, &providerv1.InterruptRequest{Config: configToPB(cfg), Id: id, Info: interruptionToPB(&info)})
	return statusToError(ctx, "Interrupt", err)
}

// Check runs the plugin's preflight; against a provider without one it
// returns an error matching errors.ErrUnsupported.
func (c *GRPCClient) Check(ctx context.Context, cfg providers.Config, opts providers.CheckOptions) ([]providers.CheckResult, error) {
	n, err := toInt32("target_nodes", opts.TargetNodes)
	if err != nil {
		return nil, err
	}
	resp, err := c.rpc.Check(ctx, &providerv1.CheckRequest{Config: configToPB(cfg), Quick: opts.Quick, TargetNodes: n, Network: opts.Network,
		FileSystems: fileSystemsToPB(opts.FileSystems)})
	if err != nil {
		return nil, statusToError(ctx, "Check", err)
	}
	return checkResultsFromPB(resp.GetResults()), nil
}

// ReleaseNetwork deletes a destroyed fleet's placement groups or policies;
// against a provider that creates none it returns an error matching
// errors.ErrUnsupported.
func (c *GRPCClient) ReleaseNetwork(ctx context.Context, cfg providers.Config, group string) error {
	_, err := c.rpc.ReleaseNetwork(ctx, &providerv1.ReleaseNetworkRequest{Config: configToPB(cfg), Group: group})
	return statusToError(ctx, "ReleaseNetwork", err)
}
