// Package gcp is fleetd's built-in provider for Google Compute Engine spot and on-demand capacity.
package gcp

import "github.com/fleetd/fleetd/providers"

// Name is the provider name used in `provider "gcp" {}` blocks.
const Name = "gcp"

// Schema is the schema of a `provider "gcp"` block.
var Schema = providers.ConfigSchema{Attributes: []providers.Attribute{
	{Name: "project", Type: providers.TypeString, Required: true, Description: "GCP project id."},
	{Name: "zones", Type: providers.TypeListString, Required: true, Description: "Zones to consider, e.g. [\"us-central1-a\"]."},
	{Name: "machine_types", Type: providers.TypeListString, Required: true, Description: "Machine types to consider (accelerator-optimized types carry their GPUs)."},
	{Name: "accelerators", Type: providers.TypeJSON, Description: "Accelerators to attach to N1-style machine types: { type = \"nvidia-tesla-t4\", count = 1 }."},
	{Name: "image", Type: providers.TypeString, Required: true, Description: "Boot image or image family URL."},
	{Name: "disk_size_gb", Type: providers.TypeNumber, Description: "Boot disk size in GB (default 200)."},
	{Name: "disk_type", Type: providers.TypeString, Description: "Boot disk type (default \"pd-balanced\")."},
	{Name: "network", Type: providers.TypeString, Description: "VPC network (default \"global/networks/default\")."},
	{Name: "subnetwork", Type: providers.TypeString, Description: "Subnetwork per region is derived from this name when set."},
	{Name: "gpu_subnetworks", Type: providers.TypeListString, Description: "Subnetworks of the GPU NICs of a3 types on the fast network (node.network), in order, each in its own VPC: 4 for a3-highgpu-8g (GPUDirect-TCPX), 8 for a3-megagpu-8g (TCPXO), 9 for a3-ultragpu-8g (a second gVNIC, then 8 RDMA)."},
	{Name: "external_ip", Type: providers.TypeBool, Description: "Give nodes an ephemeral external IP (default true); set false behind Cloud NAT."},
	{Name: "service_account", Type: providers.TypeString, Description: "Service account email for nodes."},
	{Name: "scopes", Type: providers.TypeListString, Description: "OAuth scopes for the service account."},
	{Name: "prices", Type: providers.TypeJSON, Description: "Override the Cloud Billing Catalog's and the bundled table's prices: { \"a3-highgpu-8g\" = { spot = 25.0, on_demand = 88.0 } }."},
	{Name: "endpoint", Type: providers.TypeString, Description: "Override the Compute Engine endpoint URL (testing)."},
	{Name: "resource_manager_endpoint", Type: providers.TypeString, Description: "Override the Cloud Resource Manager endpoint URL `fleetd check` tests permissions at (default: the public API, or endpoint when that is plain http)."},
	{Name: "billing_endpoint", Type: providers.TypeString, Description: "Override the Cloud Billing Catalog API endpoint URL prices are read from (testing, proxies); a block with a plain-http endpoint and no billing_endpoint uses the bundled prices."},
	{Name: "filestore_endpoint", Type: providers.TypeString, Description: "Override the Cloud Filestore API endpoint URL `fleetd check` lists instances at for filestore:// data (testing, proxies); default: endpoint when it is plain http, else the public endpoint."},
}}
