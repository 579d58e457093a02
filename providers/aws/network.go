package aws

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

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
		in.Placement.GroupName = awssdk.String(nr.GroupIn(off.Zone))
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

// checkNetwork is the preflight of the fast network in region
// (CheckOptions.Network): which types have EFA, the subnets and the
// security-group rule EFA needs, the placement-group permissions, and the
// no-public-IPv4 consequence of several interfaces.
func (p *Provider) checkNetwork(ctx context.Context, client ec2API, b block, region string) []providers.CheckResult {
	var out []providers.CheckResult
	infos, err := p.typeInfos(ctx, client, b, region)
	if err != nil {
		return []providers.CheckResult{{Check: "fast network", Scope: region, Status: providers.CheckUnavailable, Detail: firstLine(err.Error())}}
	}
	maxNICs, efaTypes := 0, 0
	for _, it := range b.InstanceTypes {
		ti, ok := infos[it]
		if !ok {
			continue
		}
		n := ti.network()
		if !n.Fast() {
			out = append(out, ok1("EFA "+it, region, "no EFA: standard network only (node.network = \"fast\" excludes it)"))
			continue
		}
		efaTypes++
		maxNICs = max(maxNICs, n.Interfaces)
		out = append(out, ok1("EFA "+it, region, fmt.Sprintf("EFA ×%d (%d network cards, %g Gbps); cluster placement group per zone", n.Interfaces, max(ti.NetworkCards, 1), n.BandwidthGbps)))
	}
	if efaTypes == 0 {
		out = append(out, failed("fast network", region, "none of instance_types supports EFA",
			"add EFA types (p4d.24xlarge, p5.48xlarge, …) or set node.network = \"standard\""))
		return out
	}
	if len(subnetsIn(b, region)) == 0 {
		out = append(out, failed("EFA subnet", region, "no subnets set for "+region,
			"EFA interfaces are created in the zone's subnet: set subnets = { ZONE = \"subnet-…\" }"))
	}
	out = append(out, checkSelfRules(ctx, client, b, region)...)
	for _, action := range []string{"CreatePlacementGroup", "DeletePlacementGroup"} {
		var err error
		name := awssdk.String("fleetd-check")
		if action == "CreatePlacementGroup" {
			_, err = client.CreatePlacementGroup(ctx, &ec2.CreatePlacementGroupInput{DryRun: awssdk.Bool(true), GroupName: name, Strategy: types.PlacementStrategyCluster}, func(o *ec2.Options) { o.RetryMaxAttempts = 1 })
		} else {
			_, err = client.DeletePlacementGroup(ctx, &ec2.DeletePlacementGroupInput{DryRun: awssdk.Bool(true), GroupName: name}, func(o *ec2.Options) { o.RetryMaxAttempts = 1 })
		}
		check := "permission ec2:" + action
		switch {
		case errCode(err) == "DryRunOperation":
			out = append(out, ok1(check, region, "allowed (DryRun)"))
		case isDenied(err):
			out = append(out, failed(check, region, "denied: "+firstLine(apiErrorText(err)), "allow ec2:"+action+" and ec2:DescribePlacementGroups ("+iamDoc+")"))
		default:
			out = append(out, providers.CheckResult{Check: check, Scope: region, Status: providers.CheckUnavailable, Detail: "not proven: " + firstLine(apiErrorText(err))})
		}
	}
	if maxNICs > 1 {
		out = append(out, providers.CheckResult{Check: "public IPv4 with EFA", Scope: region, Status: providers.CheckUnavailable,
			Detail: fmt.Sprintf("launches with %d network interfaces get no public IPv4 address (EC2 assigns one only to single-interface launches): nodes reach the daemon and the checkpoint store over private addresses only", maxNICs),
			Fix:    "run the daemon where the nodes' VPC reaches it privately (same VPC, peering, VPN) and advertise that address to agents; give the subnets a NAT gateway or VPC endpoints for S3 and the image's downloads; or use node.network = \"standard\""})
	}
	return out
}

// checkSelfRules: EFA traffic passes a security group only if the group
// allows all traffic in from and out to itself (an outbound 0.0.0.0/0
// rule does not count).
func checkSelfRules(ctx context.Context, client ec2API, b block, region string) []providers.CheckResult {
	groups := b.groupsFor(region)
	if len(groups) == 0 {
		return []providers.CheckResult{{Check: "EFA security group rule", Scope: region, Status: providers.CheckUnavailable,
			Detail: "security_groups not set: the VPC's default group is used, which allows traffic in from itself; EFA also needs its outbound rule to itself",
			Fix:    "set security_groups to a group with inbound and outbound rules allowing all traffic to and from the group itself"}}
	}
	resp, err := client.DescribeSecurityGroups(ctx, &ec2.DescribeSecurityGroupsInput{GroupIds: groups})
	if err != nil {
		return []providers.CheckResult{{Check: "EFA security group rule", Scope: region, Status: providers.CheckUnavailable, Detail: firstLine(apiErrorText(err)) + " (see the security group rows)"}}
	}
	var out []providers.CheckResult
	for _, sg := range resp.SecurityGroups {
		id := awssdk.ToString(sg.GroupId)
		in, eg := allowsSelf(id, sg.IpPermissions), allowsSelf(id, sg.IpPermissionsEgress)
		if in && eg {
			out = append(out, ok1("EFA security group rule", region, id+" allows all traffic to and from itself"))
			continue
		}
		var missing []string
		if !in {
			missing = append(missing, "inbound")
		}
		if !eg {
			missing = append(missing, "outbound")
		}
		fix := ""
		if !in {
			fix += fmt.Sprintf("aws ec2 authorize-security-group-ingress --region %s --group-id %s --protocol all --source-group %s", region, id, id)
		}
		if !eg {
			if fix != "" {
				fix += "; "
			}
			fix += fmt.Sprintf("aws ec2 authorize-security-group-egress --region %s --group-id %s --ip-permissions 'IpProtocol=-1,UserIdGroupPairs=[{GroupId=%s}]'", region, id, id)
		}
		out = append(out, failed("EFA security group rule", region, fmt.Sprintf("%s has no %s rule allowing all traffic with itself: EFA traffic between the nodes is dropped", id, strings.Join(missing, " or ")), fix))
	}
	return out
}

func allowsSelf(id string, perms []types.IpPermission) bool {
	for _, p := range perms {
		if awssdk.ToString(p.IpProtocol) != "-1" {
			continue
		}
		for _, g := range p.UserIdGroupPairs {
			if awssdk.ToString(g.GroupId) == id {
				return true
			}
		}
	}
	return false
}
