package plugins_test

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/providertest"
)

// netProvider records what crosses the wire for the fast-network parts of
// the contract.
type netProvider struct {
	*providertest.MemProvider
	info     providers.NetworkInfo
	launched []providers.LaunchRequest
	released []string
}

func (p *netProvider) Offerings(ctx context.Context, cfg providers.Config) ([]providers.Offering, error) {
	offs, err := p.MemProvider.Offerings(ctx, cfg)
	for i := range offs {
		offs[i].Network = p.info
	}
	return offs, err
}

func (p *netProvider) Create(ctx context.Context, cfg providers.Config, req providers.LaunchRequest) ([]providers.Instance, error) {
	p.launched = append(p.launched, req)
	return p.MemProvider.Create(ctx, cfg, req)
}

func (p *netProvider) ReleaseNetwork(_ context.Context, _ providers.Config, group string) error {
	p.released = append(p.released, group)
	return nil
}

func TestNetworkCrossesTheWire(t *testing.T) {
	np := &netProvider{MemProvider: providertest.NewMemProvider(), info: providers.NetworkInfo{Fabric: providers.FabricEFA, Interfaces: 32, BandwidthGbps: 3200}}
	client, _, _ := serveInProcess(t, np)
	offs, err := client.Offerings(testCtx(t), providers.Config{})
	if err != nil || len(offs) == 0 {
		t.Fatalf("Offerings: %d, %v", len(offs), err)
	}
	if offs[0].Network != np.info {
		t.Errorf("offering network over gRPC %+v, want %+v", offs[0].Network, np.info)
	}
	for _, nr := range []providers.NetworkRequest{
		{},
		{Fabric: true, Group: "fleetd-f-abc", GroupTags: map[string]string{providers.TagFleet: "f"}},
		{Group: "fleetd-f-abc"},
	} {
		np.launched = nil
		off := memOffering(t)
		if _, err := client.Create(testCtx(t), providers.Config{}, providers.LaunchRequest{Offering: off, Count: 1, Network: nr}); err != nil {
			t.Fatal(err)
		}
		if len(np.launched) != 1 || !reflect.DeepEqual(np.launched[0].Network, nr) {
			t.Errorf("launch network over gRPC %+v, want %+v", np.launched, nr)
		}
	}
	if err := client.ReleaseNetwork(testCtx(t), providers.Config{}, "fleetd-f-abc"); err != nil || !reflect.DeepEqual(np.released, []string{"fleetd-f-abc"}) {
		t.Errorf("ReleaseNetwork: %v, released %v", err, np.released)
	}

	plain, _, _ := serveInProcess(t, providertest.NewMemProvider())
	if err := plain.ReleaseNetwork(testCtx(t), providers.Config{}, "g"); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("ReleaseNetwork on a provider without it: %v, want errors.ErrUnsupported", err)
	}
}
