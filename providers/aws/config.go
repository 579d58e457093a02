package aws

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strings"

	"github.com/fleetd/fleetd/providers"
)

// block is a decoded `provider "aws"` block (see Schema).
type block struct {
	Regions        []string          `json:"regions"`
	InstanceTypes  []string          `json:"instance_types"`
	Image          string            `json:"image"`
	ImagePerRegion map[string]string `json:"image_per_region"`
	Subnets        map[string]string `json:"subnets"`
	SecurityGroups []string          `json:"security_groups"`
	// SecurityGroupsPerRegion: security group ids are regional, so a block
	// spanning regions names each region's groups here; it wins over
	// security_groups for its regions.
	SecurityGroupsPerRegion map[string][]string `json:"security_groups_per_region"`
	InstanceProfile         string              `json:"instance_profile"`
	KeyName                 string              `json:"key_name"`
	InterruptionQueue       string              `json:"interruption_queue"`
	OnDemandPrices          map[string]float64  `json:"on_demand_prices"`
	Profile                 string              `json:"profile"`
	Endpoint                string              `json:"endpoint"`
	SQSEndpoint             string              `json:"sqs_endpoint"`
	// PricingEndpoint overrides the Price List Query API endpoint.
	PricingEndpoint string `json:"pricing_endpoint"`
	// ServiceQuotasEndpoint overrides the Service Quotas endpoint (`fleetd check`).
	ServiceQuotasEndpoint string `json:"service_quotas_endpoint"`
	// FSxEndpoint and EFSEndpoint override the FSx and EFS endpoints
	// (`fleetd check` of file-system datasets).
	FSxEndpoint string `json:"fsx_endpoint"`
	EFSEndpoint string `json:"efs_endpoint"`
	// PlacementScoreCapacity is the target capacity (instances) spot
	// placement scores are asked for; 0 means 1.
	PlacementScoreCapacity int `json:"placement_score_capacity"`
}

// callBlock is a provider call's prologue: a done ctx ends the call before
// any work, then the block is decoded.
func callBlock(ctx context.Context, cfg providers.Config) (block, error) {
	if err := ctx.Err(); err != nil {
		return block{}, err
	}
	return decodeBlock(cfg)
}

// decodeBlock decodes and validates a provider block. Every problem is
// reported at once, as one invalid-config error.
func decodeBlock(cfg providers.Config) (block, error) {
	var b block
	if err := cfg.DecodeStrict(&b); err != nil {
		return block{}, providers.InvalidConfig(fmt.Errorf("provider %q: %w", Name, err))
	}
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if len(b.Regions) == 0 {
		bad("regions: at least one region is required")
	}
	if len(b.InstanceTypes) == 0 {
		bad("instance_types: at least one instance type is required")
	}
	for _, r := range b.Regions {
		if r == "" {
			bad("regions: empty region name")
			continue
		}
		if b.imageFor(r) == "" {
			bad("image: no AMI for region %s (set image or image_per_region[%q])", r, r)
		}
	}
	// Entries for regions not (or no longer) in regions are ignored, so
	// narrowing regions needs no other edit.
	for z, sn := range b.Subnets {
		if sn == "" {
			bad("subnets: empty subnet id for zone %s", z)
		}
	}
	for r, gs := range b.SecurityGroupsPerRegion {
		for _, g := range gs {
			if !strings.HasPrefix(g, "sg-") {
				bad("security_groups_per_region[%q]: %q is not a security group id (sg-…)", r, g)
			}
		}
	}
	for t, p := range b.OnDemandPrices {
		if !(p > 0) {
			bad("on_demand_prices: %s = %v, want a price > 0", t, p)
		}
	}
	if b.PlacementScoreCapacity < 0 || b.PlacementScoreCapacity > 10000 {
		bad("placement_score_capacity: %d, want 1..10000 instances", b.PlacementScoreCapacity)
	}
	for _, ep := range []struct{ name, v string }{{"endpoint", b.Endpoint}, {"sqs_endpoint", b.SQSEndpoint}, {"service_quotas_endpoint", b.ServiceQuotasEndpoint}, {"pricing_endpoint", b.PricingEndpoint},
		{"fsx_endpoint", b.FSxEndpoint}, {"efs_endpoint", b.EFSEndpoint}} {
		if ep.v == "" {
			continue
		}
		if u, err := url.Parse(ep.v); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("%s: %q is not an http(s) URL", ep.name, ep.v)
		}
	}
	if len(errs) > 0 {
		return block{}, providers.InvalidConfig(fmt.Errorf("provider %q: %w", Name, errors.Join(errs...)))
	}
	return b, nil
}

// placementScoreCapacity is the target capacity for spot placement
// scores.
func (b block) placementScoreCapacity() int {
	if b.PlacementScoreCapacity <= 0 {
		return 1
	}
	return b.PlacementScoreCapacity
}

// groupsFor is the security groups for region: security_groups_per_region
// wins over security_groups.
func (b block) groupsFor(region string) []string {
	if g, ok := b.SecurityGroupsPerRegion[region]; ok {
		return g
	}
	return b.SecurityGroups
}

// imageFor is the AMI for region: image_per_region wins over image.
func (b block) imageFor(region string) string {
	if img := b.ImagePerRegion[region]; img != "" {
		return img
	}
	return b.Image
}

// zoneAllowed: when subnets is set, only zones with a subnet are used.
func (b block) zoneAllowed(zone string) bool {
	if len(b.Subnets) == 0 {
		return true
	}
	_, ok := b.Subnets[zone]
	return ok
}

// scope identifies the account view a block addresses, so caches are not
// shared between blocks that talk to different endpoints or profiles.
func (b block) scope() string { return b.Profile + "|" + b.Endpoint }

// regionOfZone returns the region of regions a zone name belongs to
// ("us-east-1a" → "us-east-1"; also local zones such as
// "us-east-1-bos-1a"), or "" when none.
func regionOfZone(regions []string, zone string) string {
	// Longest match first so "us-east-1" never claims a zone of a region
	// whose name extends it.
	sorted := slices.Clone(regions)
	sort.Slice(sorted, func(i, j int) bool { return len(sorted[i]) > len(sorted[j]) })
	for _, r := range sorted {
		if r != "" && strings.HasPrefix(zone, r) && len(zone) > len(r) {
			return r
		}
	}
	return ""
}
