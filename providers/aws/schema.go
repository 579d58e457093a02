// Package aws is fleetd's built-in provider for Amazon EC2 spot and on-demand capacity.
package aws

import "github.com/fleetd/fleetd/providers"

// Name is the provider name used in `provider "aws" {}` blocks.
const Name = "aws"

// Schema is the schema of a `provider "aws"` block.
var Schema = providers.ConfigSchema{Attributes: []providers.Attribute{
	{Name: "regions", Type: providers.TypeListString, Required: true, Description: "Regions to consider, e.g. [\"us-east-1\"]."},
	{Name: "instance_types", Type: providers.TypeListString, Required: true, Description: "EC2 instance types to consider."},
	{Name: "image", Type: providers.TypeString, Required: true, Description: "AMI id (or a map per region via image_per_region)."},
	{Name: "image_per_region", Type: providers.TypeMapString, Description: "AMI id per region; overrides image."},
	{Name: "subnets", Type: providers.TypeMapString, Description: "Subnet id per availability zone; zones without a subnet are not used."},
	{Name: "security_groups", Type: providers.TypeListString, Description: "Security group ids."},
	{Name: "security_groups_per_region", Type: providers.TypeJSON, Description: "Security group ids per region (ids are regional), e.g. { \"us-west-2\" = [\"sg-…\"] }; wins over security_groups there."},
	{Name: "instance_profile", Type: providers.TypeString, Description: "IAM instance profile name for nodes."},
	{Name: "key_name", Type: providers.TypeString, Description: "EC2 key pair name (optional)."},
	{Name: "interruption_queue", Type: providers.TypeString, Description: "SQS queue (name or URL) fed by EventBridge interruption rules."},
	{Name: "on_demand_prices", Type: providers.TypeJSON, Description: "Override on-demand $/h per instance type (wins over the Price List API and the bundled table), e.g. { \"p4d.24xlarge\" = 32.77 }."},
	{Name: "placement_score_capacity", Type: providers.TypeNumber, Description: "Instances to ask EC2 spot placement scores for (usually the fleet's size); default 1."},
	{Name: "profile", Type: providers.TypeString, Description: "Shared config profile; default credential chain when unset."},
	{Name: "endpoint", Type: providers.TypeString, Description: "Override the EC2 endpoint URL (testing, VPC endpoints)."},
	{Name: "service_quotas_endpoint", Type: providers.TypeString, Description: "Override the Service Quotas endpoint URL used by `fleetd check` (testing, VPC endpoints)."},
	{Name: "pricing_endpoint", Type: providers.TypeString, Description: "Override the AWS Price List Query API endpoint URL (testing, VPC endpoints); default the us-east-1 endpoint."},
	{Name: "fsx_endpoint", Type: providers.TypeString, Description: "Override the FSx endpoint URL used by `fleetd check` for fsx:// data (testing, VPC endpoints)."},
	{Name: "efs_endpoint", Type: providers.TypeString, Description: "Override the EFS endpoint URL used by `fleetd check` for efs:// data (testing, VPC endpoints)."},
	{Name: "sqs_endpoint", Type: providers.TypeString, Description: "Override the SQS endpoint URL used for interruption_queue (testing, VPC endpoints)."},
}}
