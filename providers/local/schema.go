// Package local is fleetd's embedded provider: each node is a real
// `fleetd agent` process on this machine with its own loopback address and
// metadata emulator. It needs no cloud account.
package local

import "github.com/fleetd/fleetd/providers"

// Name is the provider name used in `provider "local" {}` blocks.
const Name = "local"

// Schema is the schema of a `provider "local"` block.
var Schema = providers.ConfigSchema{Attributes: []providers.Attribute{
	{Name: "zones", Type: providers.TypeListString, Description: "Simulated zones (default [\"local-a\", \"local-b\"])."},
	{Name: "instance_types", Type: providers.TypeJSON, Description: "Instance types: { name = { gpus, gpu_type, vcpus, memory_gib, spot_price, on_demand_price } } (default: local.gpu1, 1 sim GPU, 2 vCPU, 4 GiB, $0.30/h spot, $1.00/h on-demand)."},
	{Name: "capacity", Type: providers.TypeJSON, Description: "Spot capacity per zone: { \"local-a\" = 4 }; zones not listed are unlimited."},
	{Name: "notice_lead", Type: providers.TypeString, Description: "Lead time of injected spot notices (default \"120s\")."},
	{Name: "state_dir", Type: providers.TypeString, Description: "Where instance records and node directories live (default: $FLEETD_LOCAL_STATE_DIR, which the daemon points into its data dir, else <user cache dir>/fleetd/local)."},
	{Name: "address_prefix", Type: providers.TypeString, Description: "Loopback prefix for node addresses (default \"127.0.10.\")."},
}}
