package aws

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/fleetd/fleetd/providers"
)

// The fast network on EC2 (docs/providers/aws.md, "EFA and cluster
// placement groups"): an EFA-capable type is launched with one EFA
// interface per network card, all in the zone's subnet, into a cluster
// placement group per fleet incarnation and zone.

// TagNetworkGroup tags the placement groups fleetd creates with the base
// name (NetworkRequest.Group) they were created for, so ReleaseNetwork
// finds every zone's group of a destroyed fleet with one filter.
const TagNetworkGroup = "fleetd-network-group"

var gbpsRE = regexp.MustCompile(`(\d+(?:\.\d+)?)\s*Gigabit`)

// networkTypeInfo reads DescribeInstanceTypes' NetworkInfo into ti.
func networkTypeInfo(ni *types.NetworkInfo, ti *typeInfo) {
	if ni == nil {
		return
	}
	ti.NetworkCards = int(awssdk.ToInt32(ni.MaximumNetworkCards))
	if awssdk.ToBool(ni.EfaSupported) && ni.EfaInfo != nil {
		ti.EFAInterfaces = int(awssdk.ToInt32(ni.EfaInfo.MaximumEfaInterfaces))
	}
	for _, c := range ni.NetworkCards {
		ti.BandwidthGbps += max(awssdk.ToFloat64(c.PeakBandwidthInGbps), awssdk.ToFloat64(c.BaselineBandwidthInGbps))
	}
	if ti.BandwidthGbps == 0 {
		// Older answers carry only the type's "100 Gigabit" text.
		if m := gbpsRE.FindStringSubmatch(awssdk.ToString(ni.NetworkPerformance)); m != nil {
			ti.BandwidthGbps, _ = strconv.ParseFloat(m[1], 64)
		}
	}
}

// efaInterfaces is how many EFA interfaces a fast launch of the type
// gets: one per network card (EC2 allows one EFA device per card on every
// multi-card type), bounded by EfaInfo.
func (ti typeInfo) efaInterfaces() int {
	if ti.EFAInterfaces == 0 {
		return 0
	}
	return min(ti.EFAInterfaces, max(ti.NetworkCards, 1))
}

// network is the offering's NetworkInfo.
func (ti typeInfo) network() providers.NetworkInfo {
	n := ti.efaInterfaces()
	if n == 0 {
		return providers.NetworkInfo{}
	}
	return providers.NetworkInfo{Fabric: providers.FabricEFA, Interfaces: n, BandwidthGbps: ti.BandwidthGbps}
}

// groupName is the placement group of base in zone: a cluster group
// lives in one zone, so each zone has its own.
func groupName(base, zone string) string { return base + "-" + zone }

// applyNetwork turns a RunInstances input into a fast one: EFA
// interfaces (the primary one "efa", carrying the instance's IP traffic;
// one "efa-only" per further network card, device index 0, as the EC2
// user guide recommends for multi-card types) in the zone's subnet with
// the block's security groups, and the placement group. Several
// interfaces cannot auto-assign a public IPv4 address, so the nodes are
// private: docs/providers/aws.md says what that needs.
func applyNetwork(in *ec2.RunInstancesInput, b block, req providers.LaunchRequest) error {
	nr, off := req.Network, req.Offering
	if nr.Group != "" {
		if in.Placement == nil {
			in.Placement = &types.Placement{}
		}
		in.Placement.GroupName = awssdk.String(groupName(nr.Group, off.Zone))
	}
	if !nr.Fabric {
		return nil
	}
	n := off.Network.Interfaces
	if off.Network.Fabric != providers.FabricEFA || n < 1 {
		return providers.Errorf(providers.KindInvalidConfig, "provider %q: %s has no EFA (DescribeInstanceTypes EfaInfo); launch it without the fast network", Name, off.InstanceType)
	}
	subnet := b.Subnets[off.Zone]
	if subnet == "" {
		return providers.Errorf(providers.KindInvalidConfig, "provider %q: EFA interfaces need a subnet: set subnets[%q]", Name, off.Zone)
	}
	groups := slices.Clone(b.groupsFor(off.Region))
	for card := range n {
		typ := "efa-only"
		if card == 0 {
			typ = "efa"
		}
		in.NetworkInterfaces = append(in.NetworkInterfaces, types.InstanceNetworkInterfaceSpecification{
			DeviceIndex: awssdk.Int32(0), NetworkCardIndex: awssdk.Int32(int32(card)), InterfaceType: awssdk.String(typ),
			SubnetId: awssdk.String(subnet), Groups: groups, DeleteOnTermination: awssdk.Bool(true),
		})
	}
	// The interfaces carry subnet and groups; EC2 rejects them twice.
	in.SubnetId, in.SecurityGroupIds = nil, nil
	if in.Placement != nil {
		in.Placement.AvailabilityZone = nil
	}
	return nil
}

// ensureGroup makes sure the cluster placement group name exists in the
// client's region: described first (a replacement reuses the group of the
// nodes before it), created when unknown. A concurrent launch creating it
// first is fine.
func (p *Provider) ensureGroup(ctx context.Context, client ec2API, b block, region, name, base string, tags map[string]string) error {
	key := b.scope() + "|" + region + "|" + name
	p.mu.Lock()
	known := p.groups[key]
	p.mu.Unlock()
	if known {
		return nil
	}
	_, err := client.DescribePlacementGroups(ctx, &ec2.DescribePlacementGroupsInput{GroupNames: []string{name}})
	if errCode(err) == "InvalidPlacementGroup.Unknown" {
		all := map[string]string{TagNetworkGroup: base}
		for k, v := range tags {
			all[k] = v
		}
		_, err = client.CreatePlacementGroup(ctx, &ec2.CreatePlacementGroupInput{
			GroupName: awssdk.String(name), Strategy: types.PlacementStrategyCluster,
			TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypePlacementGroup, Tags: sortedTags(all)}},
		})
		if errCode(err) == "InvalidPlacementGroup.Duplicate" {
			err = nil
		}
	}
	if err != nil {
		return classify("placement group "+name+" in "+region, "", err)
	}
	p.mu.Lock()
	p.groups[key] = true
	p.mu.Unlock()
	return nil
}

func sortedTags(m map[string]string) []types.Tag {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]types.Tag, 0, len(keys))
	for _, k := range keys {
		out = append(out, types.Tag{Key: awssdk.String(k), Value: awssdk.String(m[k])})
	}
	return out
}

var _ providers.NetworkReleaser = (*Provider)(nil)

// ReleaseNetwork deletes, in every region of the block, the placement
// groups created for base (tagged TagNetworkGroup = base). A group still
// holding an instance (one shutting down) is a transient error: the
// daemon calls again on its next pass.
func (p *Provider) ReleaseNetwork(ctx context.Context, cfg providers.Config, base string) error {
	b, err := decodeBlock(cfg)
	if err != nil {
		return err
	}
	if base == "" {
		return providers.Errorf(providers.KindInvalidConfig, "provider %q: release of an unnamed network group", Name)
	}
	var errs []error
	for _, region := range b.Regions {
		client, err := p.ec2Client(ctx, b, region)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		resp, err := client.DescribePlacementGroups(ctx, &ec2.DescribePlacementGroupsInput{
			Filters: []types.Filter{{Name: awssdk.String("tag:" + TagNetworkGroup), Values: []string{base}}},
		})
		if err != nil {
			errs = append(errs, classify("DescribePlacementGroups in "+region, "", err))
			continue
		}
		for _, g := range resp.PlacementGroups {
			name := awssdk.ToString(g.GroupName)
			_, err := client.DeletePlacementGroup(ctx, &ec2.DeletePlacementGroupInput{GroupName: awssdk.String(name)})
			switch code := errCode(err); {
			case err == nil, code == "InvalidPlacementGroup.Unknown":
				p.mu.Lock()
				delete(p.groups, b.scope()+"|"+region+"|"+name)
				p.mu.Unlock()
			case code == "InvalidPlacementGroup.InUse":
				errs = append(errs, providers.Transient(fmt.Errorf("placement group %s in %s still holds instances: %w", name, region, err)))
			default:
				errs = append(errs, classify("DeletePlacementGroup "+name+" in "+region, "", err))
			}
		}
	}
	return errors.Join(errs...)
}
