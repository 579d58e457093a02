package agentapi

import (
	"reflect"
	"testing"

	"github.com/fleetd/fleetd/agentwire"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

func TestNetworkConfig(t *testing.T) {
	efa := providers.Offering{Provider: "aws", Region: "us-east-1", Zone: "us-east-1a", InstanceType: "p5.48xlarge",
		Network: providers.NetworkInfo{Fabric: providers.FabricEFA, Interfaces: 32, BandwidthGbps: 3200}}
	plain := efa
	plain.Network = providers.NetworkInfo{}
	for _, c := range []struct {
		name string
		n    state.Node
		want *agentwire.NetworkConfig
	}{
		{"standard launch", state.Node{Offering: efa}, nil},
		{"fabric and group", state.Node{Offering: efa, Network: providers.NetworkRequest{Fabric: true, Group: "fleetd-bert-k3x9"}},
			&agentwire.NetworkConfig{Fabric: "efa", Interfaces: 32, Group: "fleetd-bert-k3x9-us-east-1a"}},
		{"auto without the group", state.Node{Offering: efa, Network: providers.NetworkRequest{Fabric: true}},
			&agentwire.NetworkConfig{Fabric: "efa", Interfaces: 32}},
		{"offering without a fabric", state.Node{Offering: plain, Network: providers.NetworkRequest{Fabric: true}}, nil},
	} {
		if got := networkConfig(c.n); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}
