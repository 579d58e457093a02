package aws

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"strings"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/fleetd/fleetd/providers"
)

// maxClientToken is EC2's limit on ClientToken: 64 ASCII characters.
const maxClientToken = 64

// ClientToken is the EC2 ClientToken for an idempotency token: the token
// itself when it fits EC2's limit (at most 64 printable ASCII characters),
// otherwise "fleetd-" and a SHA-256 prefix of it, so any token maps to a
// stable, valid one.
func ClientToken(token string) string {
	if len(token) <= maxClientToken && printableASCII(token) {
		return token
	}
	sum := sha256.Sum256([]byte(token))
	const prefix = "fleetd-"
	return prefix + hex.EncodeToString(sum[:])[:maxClientToken-len(prefix)]
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// Create launches req.Count instances of one offering with one
// RunInstances call (MinCount = MaxCount = Count: all or nothing), so the
// ClientToken covers the whole request and a capacity or quota answer is
// an error about exactly this offering.
func (p *Provider) Create(ctx context.Context, cfg providers.Config, req providers.LaunchRequest) ([]providers.Instance, error) {
	b, err := callBlock(ctx, cfg)
	if err != nil {
		return nil, err
	}
	in, err := runInput(b, req)
	if err != nil {
		return nil, err
	}
	off := req.Offering
	client, err := p.ec2Client(ctx, b, off.Region)
	if err != nil {
		return nil, err
	}
	if g := req.Network.Group; g != "" {
		if err := p.ensureGroup(ctx, client, b, off.Region, req.Network.GroupIn(off.Zone), g, req.Network.GroupTags); err != nil {
			return nil, err
		}
	}
	resp, err := client.RunInstances(ctx, in)
	if err != nil {
		return nil, classify("RunInstances "+off.InstanceType+" in "+off.Zone, off.Key(), err)
	}
	now := p.opts.Now()
	out := make([]providers.Instance, 0, len(resp.Instances))
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ri := range resp.Instances {
		inst := toInstance(off.Region, ri)
		inst.Offering = off
		if len(inst.Tags) == 0 {
			// EC2 tags at launch, but not every response echoes them.
			for _, ts := range in.TagSpecifications[:min(1, len(in.TagSpecifications))] {
				for _, t := range ts.Tags {
					inst.Tags[awssdk.ToString(t.Key)] = awssdk.ToString(t.Value)
				}
			}
		}
		out = append(out, inst)
		p.recent[inst.ID] = recentLaunch{scope: b.scope(), region: off.Region, inst: inst, at: now}
	}
	p.pruneRecentLocked(now)
	return out, nil
}

// runInput validates a launch request against the block and builds the
// RunInstances input.
func runInput(b block, req providers.LaunchRequest) (*ec2.RunInstancesInput, error) {
	off := req.Offering
	var errs []string
	if off.Provider != Name {
		errs = append(errs, fmt.Sprintf("offering is for provider %q, not %q", off.Provider, Name))
	}
	if !slices.Contains(b.Regions, off.Region) {
		errs = append(errs, fmt.Sprintf("region %q is not in regions %v", off.Region, b.Regions))
	}
	if !slices.Contains(b.InstanceTypes, off.InstanceType) {
		errs = append(errs, fmt.Sprintf("instance type %q is not in instance_types %v", off.InstanceType, b.InstanceTypes))
	}
	if off.Zone == "" || regionOfZone([]string{off.Region}, off.Zone) == "" {
		errs = append(errs, fmt.Sprintf("zone %q is not a zone of region %q", off.Zone, off.Region))
	}
	if !b.zoneAllowed(off.Zone) {
		errs = append(errs, fmt.Sprintf("zone %q has no subnet in subnets", off.Zone))
	}
	if off.CapacityType != providers.Spot && off.CapacityType != providers.OnDemand {
		errs = append(errs, fmt.Sprintf("capacity type %q is neither spot nor on-demand", off.CapacityType))
	}
	if req.Count < 1 {
		errs = append(errs, fmt.Sprintf("count %d, want >= 1", req.Count))
	}
	if len(errs) > 0 {
		return nil, providers.Errorf(providers.KindInvalidConfig, "provider %q: launch %s: %s", Name, off.Key(), strings.Join(errs, "; "))
	}

	in := &ec2.RunInstancesInput{
		ImageId:      awssdk.String(b.imageFor(off.Region)),
		InstanceType: types.InstanceType(off.InstanceType),
		MinCount:     awssdk.Int32(int32(req.Count)),
		MaxCount:     awssdk.Int32(int32(req.Count)),
		// IMDSv2 only; hop limit 2 so a worker in a container can reach it.
		MetadataOptions: &types.InstanceMetadataOptionsRequest{
			HttpTokens:              types.HttpTokensStateRequired,
			HttpPutResponseHopLimit: awssdk.Int32(2),
			HttpEndpoint:            types.InstanceMetadataEndpointStateEnabled,
		},
		TagSpecifications: tagSpecs(req.Tags),
	}
	if req.IdempotencyToken != "" {
		in.ClientToken = awssdk.String(ClientToken(req.IdempotencyToken))
	}
	if subnet := b.Subnets[off.Zone]; subnet != "" {
		in.SubnetId = awssdk.String(subnet) // the subnet fixes the zone
	} else {
		in.Placement = &types.Placement{AvailabilityZone: awssdk.String(off.Zone)}
	}
	if g := b.groupsFor(off.Region); len(g) > 0 {
		in.SecurityGroupIds = slices.Clone(g)
	}
	if b.InstanceProfile != "" {
		if strings.HasPrefix(b.InstanceProfile, "arn:") {
			in.IamInstanceProfile = &types.IamInstanceProfileSpecification{Arn: awssdk.String(b.InstanceProfile)}
		} else {
			in.IamInstanceProfile = &types.IamInstanceProfileSpecification{Name: awssdk.String(b.InstanceProfile)}
		}
	}
	if b.KeyName != "" {
		in.KeyName = awssdk.String(b.KeyName)
	}
	if err := applyNetwork(in, b, req); err != nil {
		return nil, err
	}
	if req.UserData != "" {
		in.UserData = awssdk.String(base64.StdEncoding.EncodeToString([]byte(req.UserData)))
	}
	if off.CapacityType == providers.Spot {
		// No MaxPrice: the cap is the on-demand price, and a spot price
		// above the budget is the daemon's call, made from Offerings.
		in.InstanceMarketOptions = &types.InstanceMarketOptionsRequest{
			MarketType: types.MarketTypeSpot,
			SpotOptions: &types.SpotMarketOptions{
				SpotInstanceType:             types.SpotInstanceTypeOneTime,
				InstanceInterruptionBehavior: types.InstanceInterruptionBehaviorTerminate,
			},
		}
	}
	return in, nil
}

// tagSpecs tags the instance and its volumes with the request's tags (in a
// stable order, which keeps retried requests byte-identical for EC2's
// idempotency check) and a Name for the console.
func tagSpecs(tags map[string]string) []types.TagSpecification {
	keys := make([]string, 0, len(tags))
	for k := range tags {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var ts []types.Tag
	for _, k := range keys {
		ts = append(ts, types.Tag{Key: awssdk.String(k), Value: awssdk.String(tags[k])})
	}
	if _, ok := tags["Name"]; !ok && tags[providers.TagNodeID] != "" {
		name := "fleetd-" + tags[providers.TagNodeID]
		if f := tags[providers.TagFleet]; f != "" {
			name = "fleetd-" + f + "-" + tags[providers.TagNodeID]
		}
		ts = append(ts, types.Tag{Key: awssdk.String("Name"), Value: awssdk.String(name)})
	}
	if len(ts) == 0 {
		return nil
	}
	return []types.TagSpecification{
		{ResourceType: types.ResourceTypeInstance, Tags: ts},
		{ResourceType: types.ResourceTypeVolume, Tags: ts},
	}
}
