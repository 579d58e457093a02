package aws

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/efs"
	"github.com/aws/aws-sdk-go-v2/service/fsx"

	"github.com/fleetd/fleetd/providers"
)

// The file-system rows of `fleetd check` (CheckOptions.FileSystems): for
// each fsx:// and efs:// dataset, that it exists and is available, that it
// lies in the zones the job may use, in the nodes' VPC, and that its
// security groups let the nodes in on the ports its clients use.

// fsxAPI and efsAPI are the calls the file-system rows make; the SDK
// clients implement them.
type fsxAPI interface {
	DescribeFileSystems(context.Context, *fsx.DescribeFileSystemsInput, ...func(*fsx.Options)) (*fsx.DescribeFileSystemsOutput, error)
}

type efsAPI interface {
	DescribeFileSystems(context.Context, *efs.DescribeFileSystemsInput, ...func(*efs.Options)) (*efs.DescribeFileSystemsOutput, error)
	DescribeMountTargets(context.Context, *efs.DescribeMountTargetsInput, ...func(*efs.Options)) (*efs.DescribeMountTargetsOutput, error)
	DescribeMountTargetSecurityGroups(context.Context, *efs.DescribeMountTargetSecurityGroupsInput, ...func(*efs.Options)) (*efs.DescribeMountTargetSecurityGroupsOutput, error)
}

// portRange is an inclusive TCP port range a file system's clients use.
type portRange struct{ from, to int32 }

func (r portRange) String() string {
	if r.from == r.to {
		return fmt.Sprintf("TCP %d", r.from)
	}
	return fmt.Sprintf("TCP %d-%d", r.from, r.to)
}

// Lustre clients reach the file servers on 988 and 1018-1023; NFS (EFS)
// on 2049.
var (
	lustrePorts = []portRange{{988, 988}, {1018, 1023}}
	nfsPorts    = []portRange{{2049, 2049}}
)

// fsFacts is what the rows compare, from either service.
type fsFacts struct {
	kind  string // "FSx for Lustre", "EFS", "EFS One Zone"
	state string
	ok    bool     // state is the service's available state
	vpc   string   // "" when unknown
	zones []string // where it (or its mount targets) lives
	// zonal: nodes in other zones mount it across zones (FSx, One Zone);
	// otherwise zones are where mount targets exist.
	zonal  bool
	groups []string // its security groups
	ports  []portRange
}

// nodeNet is where a block's nodes run in one region.
type nodeNet struct {
	vpcs   []string
	cidrs  []netip.Prefix
	groups []string // the nodes' security groups (the VPC default when none set)
	zones  []string // the zones the block may launch in; nil: any
	what   string   // "subnets subnet-1, subnet-2" or "the default VPC"
}

// checkFileSystems runs the rows of every AWS file system of the fleet.
func (p *Provider) checkFileSystems(ctx context.Context, b block, fss []providers.FileSystemCheck) []providers.CheckResult {
	var out []providers.CheckResult
	nets := map[string]nodeNet{}
	for _, fs := range fss {
		if fs.Scheme != "fsx" && fs.Scheme != "efs" {
			continue
		}
		check, scope := "file system", fs.Source
		if !slices.Contains(b.Regions, fs.Region) {
			out = append(out, providers.CheckResult{Check: check, Scope: scope, Status: providers.CheckUnavailable,
				Detail: fmt.Sprintf("the data is in %s, not one of this block's regions (%s): its nodes cannot mount it, placement leaves them out", fs.Region, strings.Join(b.Regions, ", ")),
				Fix:    fmt.Sprintf("add %q to regions if this block should run the job", fs.Region)})
			continue
		}
		ec2c, err := p.ec2Client(ctx, b, fs.Region)
		if err != nil {
			out = append(out, failed(check, scope, err.Error(), "check the block's profile and endpoint"))
			continue
		}
		var facts fsFacts
		var row *providers.CheckResult
		if fs.Scheme == "fsx" {
			facts, row = p.fsxFacts(ctx, b, ec2c, fs)
		} else {
			facts, row = p.efsFacts(ctx, b, fs)
		}
		if row != nil {
			out = append(out, *row)
			continue
		}
		if !facts.ok {
			out = append(out, failed(check, scope, fmt.Sprintf("%s %s is %s, not available", facts.kind, fs.Host, facts.state),
				"wait until it is available (or pick another file system); nodes cannot mount it now"))
			continue
		}
		out = append(out, ok1(check, scope, fmt.Sprintf("%s %s is available", facts.kind, fs.Host)))
		nn, ok := nets[fs.Region]
		if !ok {
			var r *providers.CheckResult
			if nn, r = nodeNetwork(ctx, ec2c, b, fs.Region); r != nil {
				out = append(out, *r)
				continue
			}
			nets[fs.Region] = nn
		}
		out = append(out, zoneRow(fs, facts, nn))
		out = append(out, vpcRow(fs, facts, nn))
		out = append(out, ingressRow(ctx, ec2c, fs, facts, nn))
	}
	return out
}

func (p *Provider) fsxFacts(ctx context.Context, b block, ec2c ec2API, fs providers.FileSystemCheck) (fsFacts, *providers.CheckResult) {
	check := "file system"
	c, err := p.fsxClient(ctx, b, fs.Region)
	if err != nil {
		r := failed(check, fs.Source, err.Error(), "check the block's profile and fsx_endpoint")
		return fsFacts{}, &r
	}
	resp, err := c.DescribeFileSystems(ctx, &fsx.DescribeFileSystemsInput{FileSystemIds: []string{fs.Host}})
	notFound := errCode(err) == "FileSystemNotFound" || (err == nil && len(resp.FileSystems) == 0)
	if r := describeRow(check, fs, "fsx:DescribeFileSystems", "aws fsx describe-file-systems", notFound, err); r != nil {
		return fsFacts{}, r
	}
	f := resp.FileSystems[0]
	facts := fsFacts{kind: "FSx for " + titleCase(string(f.FileSystemType)), state: string(f.Lifecycle), zonal: true,
		ok: f.Lifecycle == "AVAILABLE", vpc: awssdk.ToString(f.VpcId), ports: lustrePorts}
	if f.FileSystemType != "LUSTRE" {
		r := failed(check, fs.Source, fmt.Sprintf("%s is an FSx for %s file system; fsx:// mounts Lustre", fs.Host, f.FileSystemType),
			"point source at an FSx for Lustre file system (ONTAP and OpenZFS serve NFS: use nfs://)")
		return fsFacts{}, &r
	}
	if len(f.SubnetIds) > 0 {
		sn, err := ec2c.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{SubnetIds: f.SubnetIds})
		if err != nil {
			r := callFailed(check, fs.Source, "DescribeSubnets", err)
			return fsFacts{}, &r
		}
		for _, s := range sn.Subnets {
			facts.zones = appendNew(facts.zones, awssdk.ToString(s.AvailabilityZone))
			if facts.vpc == "" {
				facts.vpc = awssdk.ToString(s.VpcId)
			}
		}
	}
	// FSx puts its security groups on its network interfaces.
	if len(f.NetworkInterfaceIds) > 0 {
		ni, err := ec2c.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: f.NetworkInterfaceIds})
		if err != nil {
			r := callFailed(check, fs.Source, "DescribeNetworkInterfaces", err)
			return fsFacts{}, &r
		}
		for _, n := range ni.NetworkInterfaces {
			for _, g := range n.Groups {
				facts.groups = appendNew(facts.groups, awssdk.ToString(g.GroupId))
			}
		}
	}
	return facts, nil
}

func (p *Provider) efsFacts(ctx context.Context, b block, fs providers.FileSystemCheck) (fsFacts, *providers.CheckResult) {
	check := "file system"
	c, err := p.efsClient(ctx, b, fs.Region)
	if err != nil {
		r := failed(check, fs.Source, err.Error(), "check the block's profile and efs_endpoint")
		return fsFacts{}, &r
	}
	resp, err := c.DescribeFileSystems(ctx, &efs.DescribeFileSystemsInput{FileSystemId: awssdk.String(fs.Host)})
	notFound := errCode(err) == "FileSystemNotFound" || (err == nil && len(resp.FileSystems) == 0)
	if r := describeRow(check, fs, "elasticfilesystem:DescribeFileSystems", "aws efs describe-file-systems", notFound, err); r != nil {
		return fsFacts{}, r
	}
	f := resp.FileSystems[0]
	facts := fsFacts{kind: "EFS", state: string(f.LifeCycleState), ok: f.LifeCycleState == "available", ports: nfsPorts}
	if z := awssdk.ToString(f.AvailabilityZoneName); z != "" {
		facts.kind, facts.zonal, facts.zones = "EFS One Zone", true, []string{z}
	}
	mts, err := c.DescribeMountTargets(ctx, &efs.DescribeMountTargetsInput{FileSystemId: awssdk.String(fs.Host)})
	if err != nil {
		r := efsCallFailed(check, fs.Source, "DescribeMountTargets", err)
		return fsFacts{}, &r
	}
	if len(mts.MountTargets) == 0 && facts.ok {
		r := failed(check, fs.Source, fmt.Sprintf("%s %s has no mount target: nodes cannot mount it", facts.kind, fs.Host),
			fmt.Sprintf("create one in each zone the job may use: `aws efs create-mount-target --file-system-id %s --subnet-id SUBNET --security-groups SG --region %s`", fs.Host, fs.Region))
		return fsFacts{}, &r
	}
	for _, mt := range mts.MountTargets {
		facts.vpc = awssdk.ToString(mt.VpcId)
		if !facts.zonal {
			facts.zones = appendNew(facts.zones, awssdk.ToString(mt.AvailabilityZoneName))
		}
		sg, err := c.DescribeMountTargetSecurityGroups(ctx, &efs.DescribeMountTargetSecurityGroupsInput{MountTargetId: mt.MountTargetId})
		if err != nil {
			r := efsCallFailed(check, fs.Source, "DescribeMountTargetSecurityGroups", err)
			return fsFacts{}, &r
		}
		for _, g := range sg.SecurityGroups {
			facts.groups = appendNew(facts.groups, g)
		}
	}
	return facts, nil
}

// describeRow is the row of a failed or empty describe of the file
// system; nil when it was found.
func describeRow(check string, fs providers.FileSystemCheck, action, cli string, notFound bool, err error) *providers.CheckResult {
	var r providers.CheckResult
	switch {
	case notFound:
		r = failed(check, fs.Source, fmt.Sprintf("%s not found in %s", fs.Host, fs.Region),
			fmt.Sprintf("check the id and region of the data block (`%s --region %s` lists them)", cli, fs.Region))
	case err != nil && isDenied(err):
		r = failed(check, fs.Source, action+" denied", "allow "+action+" ("+iamDoc+")")
	case err != nil:
		r = providers.CheckResult{Check: check, Scope: fs.Source, Status: providers.CheckUnavailable, Detail: firstLine(apiErrorText(err)),
			Fix: "check network access to the service (or the block's endpoint override) and retry"}
	default:
		return nil
	}
	return &r
}

func efsCallFailed(check, scope, action string, err error) providers.CheckResult {
	if isDenied(err) {
		return failed(check, scope, "elasticfilesystem:"+action+" denied", "allow elasticfilesystem:"+action+" ("+iamDoc+")")
	}
	return providers.CheckResult{Check: check, Scope: scope, Status: providers.CheckUnavailable, Detail: firstLine(apiErrorText(err))}
}

// nodeNetwork is where the block's nodes run in region: its subnets
// there, else the region's default VPC.
func nodeNetwork(ctx context.Context, c ec2API, b block, region string) (nodeNet, *providers.CheckResult) {
	var nn nodeNet
	check := "nodes' network"
	if entries := subnetsIn(b, region); len(entries) > 0 {
		ids := make([]string, len(entries))
		for i, e := range entries {
			ids[i] = e[1]
			nn.zones = append(nn.zones, e[0])
		}
		resp, err := c.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{SubnetIds: ids})
		if err != nil {
			r := callFailed(check, region, "DescribeSubnets", err)
			return nn, &r
		}
		for _, s := range resp.Subnets {
			nn.vpcs = appendNew(nn.vpcs, awssdk.ToString(s.VpcId))
			if p, err := netip.ParsePrefix(awssdk.ToString(s.CidrBlock)); err == nil {
				nn.cidrs = append(nn.cidrs, p)
			}
		}
		nn.what = "subnets " + strings.Join(ids, ", ")
	} else {
		resp, err := c.DescribeVpcs(ctx, &ec2.DescribeVpcsInput{Filters: []types.Filter{{Name: awssdk.String("is-default"), Values: []string{"true"}}}})
		if err != nil {
			r := callFailed(check, region, "DescribeVpcs", err)
			return nn, &r
		}
		if len(resp.Vpcs) == 0 {
			r := failed(check, region, "no subnets set and no default VPC in "+region, "set subnets for zones of "+region)
			return nn, &r
		}
		v := resp.Vpcs[0]
		nn.vpcs = []string{awssdk.ToString(v.VpcId)}
		if p, err := netip.ParsePrefix(awssdk.ToString(v.CidrBlock)); err == nil {
			nn.cidrs = append(nn.cidrs, p)
		}
		nn.what = "the default VPC " + nn.vpcs[0]
	}
	nn.groups = b.groupsFor(region)
	if len(nn.groups) == 0 && len(nn.vpcs) > 0 {
		// Instances launched without groups get their VPC's default group.
		resp, err := c.DescribeSecurityGroups(ctx, &ec2.DescribeSecurityGroupsInput{Filters: []types.Filter{
			{Name: awssdk.String("vpc-id"), Values: nn.vpcs}, {Name: awssdk.String("group-name"), Values: []string{"default"}}}})
		if err == nil {
			for _, g := range resp.SecurityGroups {
				nn.groups = append(nn.groups, awssdk.ToString(g.GroupId))
			}
		}
	}
	return nn, nil
}

// allowedZones are the zones the job may use in the data's region: the
// block's subnets' zones, narrowed by the fleet's; nil means any.
func allowedZones(fs providers.FileSystemCheck, nn nodeNet) []string {
	switch {
	case len(fs.Zones) == 0:
		return nn.zones
	case nn.zones == nil:
		return fs.Zones
	}
	var out []string
	for _, z := range fs.Zones {
		if slices.Contains(nn.zones, z) {
			out = append(out, z)
		}
	}
	if out == nil {
		out = []string{} // set, but empty: no zone is left
	}
	return out
}

func zoneRow(fs providers.FileSystemCheck, f fsFacts, nn nodeNet) providers.CheckResult {
	check := "file system zone"
	scope := fs.Source
	where := strings.Join(f.zones, ", ")
	if fs.Zone != "" && !slices.Contains(f.zones, fs.Zone) {
		if f.zonal {
			return failed(check, scope, fmt.Sprintf("%s is in %s, but the data block says zone = %q", fs.Host, where, fs.Zone),
				fmt.Sprintf("set zone = %q in the data block: placement keeps the job near the data by it", f.zones[0]))
		}
		return failed(check, scope, fmt.Sprintf("%s has mount targets in %s, none in the data block's zone %s", fs.Host, where, fs.Zone),
			fmt.Sprintf("create a mount target in %s (`aws efs create-mount-target`) or change the data block's zone", fs.Zone))
	}
	allowed := allowedZones(fs, nn)
	if allowed == nil {
		return ok1(check, scope, fmt.Sprintf("%s in %s; the block may launch in any zone of %s", f.kind, where, fs.Region))
	}
	var reach, missing []string
	for _, z := range allowed {
		if slices.Contains(f.zones, z) {
			reach = append(reach, z)
		} else {
			missing = append(missing, z)
		}
	}
	sort.Strings(allowed)
	switch {
	case len(allowed) == 0:
		return failed(check, scope, fmt.Sprintf("%s is in %s, but no zone is left to the job: the fleet requires %s and the block has subnets in %s only",
			fs.Host, where, strings.Join(fs.Zones, ", "), strings.Join(nn.zones, ", ")), fmt.Sprintf("add a subnet in %s to subnets", strings.Join(fs.Zones, ", ")))
	case len(reach) == 0 && f.zonal:
		return failed(check, scope, fmt.Sprintf("%s %s is in %s, outside every zone the job may use (%s)", f.kind, fs.Host, where, strings.Join(allowed, ", ")),
			fmt.Sprintf("add a subnet in %s to the block's subnets, or use a file system in one of its zones", where))
	case len(missing) > 0 && !f.zonal:
		return failed(check, scope, fmt.Sprintf("%s has mount targets in %s, none in %s where the job may run", fs.Host, where, strings.Join(missing, ", ")),
			fmt.Sprintf("create mount targets there (`aws efs create-mount-target --file-system-id %s --subnet-id SUBNET`), or drop those zones' subnets", fs.Host))
	case len(missing) > 0:
		return ok1(check, scope, fmt.Sprintf("%s in %s; nodes in %s mount it across zones (cross-zone transfer is priced into placement)", f.kind, where, strings.Join(missing, ", ")))
	}
	return ok1(check, scope, fmt.Sprintf("%s in %s, where the job may run", f.kind, where))
}

func vpcRow(fs providers.FileSystemCheck, f fsFacts, nn nodeNet) providers.CheckResult {
	check := "file system VPC"
	switch {
	case f.vpc == "":
		return providers.CheckResult{Check: check, Scope: fs.Source, Status: providers.CheckUnavailable, Detail: "the service did not say which VPC " + fs.Host + " is in"}
	case !slices.Contains(nn.vpcs, f.vpc):
		return failed(check, fs.Source, fmt.Sprintf("%s is in %s; the nodes run in %s (%s)", fs.Host, f.vpc, strings.Join(nn.vpcs, ", "), nn.what),
			fmt.Sprintf("set the block's subnets to subnets of %s, or peer the VPCs and route between them", f.vpc))
	}
	return ok1(check, fs.Source, fmt.Sprintf("%s, the nodes' VPC", f.vpc))
}

// ingressRow: the file system's security groups must let the nodes in on
// every port its clients use, from the nodes' groups or from addresses
// covering their subnets.
func ingressRow(ctx context.Context, c ec2API, fs providers.FileSystemCheck, f fsFacts, nn nodeNet) providers.CheckResult {
	check := "file system ingress"
	if len(f.groups) == 0 {
		return providers.CheckResult{Check: check, Scope: fs.Source, Status: providers.CheckUnavailable,
			Detail: "the service named no security groups for " + fs.Host, Fix: "check its security groups allow " + portList(f.ports) + " from the nodes"}
	}
	resp, err := c.DescribeSecurityGroups(ctx, &ec2.DescribeSecurityGroupsInput{GroupIds: f.groups})
	if err != nil {
		return callFailed(check, fs.Source, "DescribeSecurityGroups", err)
	}
	var missing []portRange
	for _, pr := range f.ports {
		if !admits(resp.SecurityGroups, pr, nn) {
			missing = append(missing, pr)
		}
	}
	groups := strings.Join(f.groups, ", ")
	if len(missing) > 0 {
		from := "the nodes' security group"
		if len(nn.groups) > 0 {
			from += " " + nn.groups[0]
		} else if len(nn.cidrs) > 0 {
			from = nn.cidrs[0].String()
		}
		src := "--source-group SG"
		if len(nn.groups) > 0 {
			src = "--source-group " + nn.groups[0]
		}
		return failed(check, fs.Source, fmt.Sprintf("%s (%s) does not admit the nodes on %s", fs.Host, groups, portList(missing)),
			fmt.Sprintf("allow %s from %s: `aws ec2 authorize-security-group-ingress --group-id %s --protocol tcp --port %d-%d %s`",
				portList(missing), from, f.groups[0], missing[0].from, missing[0].to, src))
	}
	return ok1(check, fs.Source, fmt.Sprintf("%s admits the nodes on %s", groups, portList(f.ports)))
}

// admits: some rule of groups allows TCP pr from the nodes.
func admits(groups []types.SecurityGroup, pr portRange, nn nodeNet) bool {
	for _, g := range groups {
		for _, perm := range g.IpPermissions {
			proto := awssdk.ToString(perm.IpProtocol)
			if proto != "-1" && proto != "tcp" && proto != "6" {
				continue
			}
			if proto == "tcp" || proto == "6" {
				if awssdk.ToInt32(perm.FromPort) > pr.from || awssdk.ToInt32(perm.ToPort) < pr.to {
					continue
				}
			}
			for _, pair := range perm.UserIdGroupPairs {
				if slices.Contains(nn.groups, awssdk.ToString(pair.GroupId)) {
					return true
				}
			}
			for _, ipr := range perm.IpRanges {
				if covers(awssdk.ToString(ipr.CidrIp), nn.cidrs) {
					return true
				}
			}
		}
	}
	return false
}

// covers: cidr contains every one of nodes (and there is one).
func covers(cidr string, nodes []netip.Prefix) bool {
	p, err := netip.ParsePrefix(cidr)
	if err != nil || len(nodes) == 0 {
		return false
	}
	for _, n := range nodes {
		if p.Bits() > n.Bits() || !p.Contains(n.Addr()) {
			return false
		}
	}
	return true
}

func portList(ps []portRange) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, " and ")
}

func appendNew(s []string, v string) []string {
	if v == "" || slices.Contains(s, v) {
		return s
	}
	return append(s, v)
}

// titleCase turns "LUSTRE" into "Lustre" for the rows.
func titleCase(s string) string {
	if s == "" {
		return s
	}
	return s[:1] + strings.ToLower(s[1:])
}

// fsxClient and efsClient are clients for the block in region, at the
// block's fsx_endpoint / efs_endpoint when set.
func (p *Provider) fsxClient(ctx context.Context, b block, region string) (fsxAPI, error) {
	cfg, err := loadConfig(ctx, b.Profile, region, p.opts.RetryMaxAttempts, p.backoff)
	if err != nil {
		return nil, err
	}
	return fsx.NewFromConfig(cfg, func(o *fsx.Options) { setEndpoint(&o.BaseEndpoint, b.FSxEndpoint) }), nil
}

func (p *Provider) efsClient(ctx context.Context, b block, region string) (efsAPI, error) {
	cfg, err := loadConfig(ctx, b.Profile, region, p.opts.RetryMaxAttempts, p.backoff)
	if err != nil {
		return nil, err
	}
	return efs.NewFromConfig(cfg, func(o *efs.Options) { setEndpoint(&o.BaseEndpoint, b.EFSEndpoint) }), nil
}
