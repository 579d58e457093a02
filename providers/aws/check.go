package aws

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/pricing"
	"github.com/aws/aws-sdk-go-v2/service/servicequotas"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"

	"github.com/fleetd/fleetd/providers"
)

// iamDoc is where the least-privilege policy lives.
const iamDoc = "docs/providers/aws.md#iam"

var _ providers.Checker = (*Provider)(nil)

// Check is the preflight for a provider block (`fleetd check`): it proves
// what it can without launching anything. Permissions are proven with EC2
// DryRun (DryRunOperation means allowed); images, subnets and security
// groups are described; the vCPU quotas of the GPU families used are read
// from Service Quotas. Quick runs only the cheap, per-region checks that
// `fleetd apply` runs before its first launch.
func (p *Provider) Check(ctx context.Context, cfg providers.Config, opts providers.CheckOptions) ([]providers.CheckResult, error) {
	b, err := decodeBlock(cfg)
	if err != nil {
		return nil, err
	}
	var out []providers.CheckResult
	add := func(r providers.CheckResult) { out = append(out, r) }

	cred, ok := p.checkCredentials(ctx, b)
	add(cred)
	if !ok {
		return out, nil
	}
	for _, region := range b.Regions {
		client, err := p.ec2Client(ctx, b, region)
		if err != nil {
			add(failed("EC2 client", region, err.Error(), "check the block's profile and endpoint"))
			continue
		}
		add(checkImage(ctx, client, b, region))
		out = append(out, checkSubnets(ctx, client, b, region)...)
		out = append(out, checkSecurityGroups(ctx, client, b, region)...)
		out = append(out, checkPermissions(ctx, client, b, region, opts.Quick)...)
		if opts.Quick {
			continue
		}
		if opts.Network {
			out = append(out, p.checkNetwork(ctx, client, b, region)...)
		}
		out = append(out, p.checkQuotas(ctx, client, b, region, opts.TargetNodes)...)
		set := p.placementScores(ctx, client, b, region)
		if set.note != "" {
			add(providers.CheckResult{Check: "spot placement scores", Scope: region, Status: providers.CheckUnavailable, Detail: set.note,
				Fix: "optional: allow ec2:GetSpotPlacementScores; placement works without it"})
		} else {
			n := 0
			for _, zs := range set.scores {
				n += len(zs)
			}
			add(ok1("spot placement scores", region, fmt.Sprintf("%d scores for %d instance types", n, len(set.scores))))
		}
	}
	if !opts.Quick {
		out = append(out, p.checkFileSystems(ctx, b, opts.FileSystems)...)
		out = append(out, p.checkTypesOffered(ctx, b)...)
		out = append(out, checkQueues(ctx, cfg, b)...)
		if r, ok := p.checkPricing(ctx, b); ok {
			add(r)
		}
	}
	return out, nil
}

// checkPricing asks the Price List API for one product the way Offerings
// does. On-demand prices work without it (from the bundled table), so a
// denial or no answer is unavailable, with the table's date. A block
// that never asks the API (a plain-http endpoint and no pricing_endpoint)
// gets no row.
func (p *Provider) checkPricing(ctx context.Context, b block) (providers.CheckResult, bool) {
	if b.PricingEndpoint == "" && strings.HasPrefix(b.Endpoint, "http://") {
		return providers.CheckResult{}, false
	}
	bundled := "on-demand prices come from the bundled table dated " + BundledPricesAsOf.Format("2006-01-02")
	client, err := p.pricingClient(ctx, b)
	if err == nil {
		_, err = client.GetProducts(ctx, &pricing.GetProductsInput{
			ServiceCode: awssdk.String("AmazonEC2"), FormatVersion: awssdk.String("aws_v1"), MaxResults: awssdk.Int32(1),
			Filters: productFilters(b.Regions[0], b.InstanceTypes[0]),
		}, func(o *pricing.Options) { o.RetryMaxAttempts = 1 })
	}
	switch {
	case err == nil:
		return ok1("pricing:GetProducts", "", fmt.Sprintf("allowed: on-demand prices come from the AWS Price List API (cached %s)", p.opts.OnDemandPriceTTL)), true
	case isDenied(err):
		return providers.CheckResult{Check: "pricing:GetProducts", Status: providers.CheckUnavailable,
			Detail: fmt.Sprintf("denied (%s): %s", errCode(err), bundled),
			Fix:    "optional: allow pricing:GetProducts (" + iamDoc + "); placement works with the bundled prices"}, true
	}
	why := firstLine(apiErrorText(err))
	var re *awshttp.ResponseError
	if errCode(err) == "" && errors.As(err, &re) {
		why = fmt.Sprintf("HTTP %d from the endpoint", re.HTTPStatusCode())
	}
	return providers.CheckResult{Check: "pricing:GetProducts", Status: providers.CheckUnavailable,
		Detail: fmt.Sprintf("the AWS Price List API did not answer (%s): %s", why, bundled),
		Fix:    "optional: check network access to the Price List API in " + pricingRegion + " (or pricing_endpoint); placement works with the bundled prices"}, true
}

func ok1(check, scope, detail string) providers.CheckResult {
	return providers.CheckResult{Check: check, Scope: scope, Status: providers.CheckOK, Detail: detail}
}

func failed(check, scope, detail, fix string) providers.CheckResult {
	return providers.CheckResult{Check: check, Scope: scope, Status: providers.CheckFailed, Detail: detail, Fix: fix}
}

// callFailed is the row of a check whose EC2 call (action) failed: a
// denial fails the check and names the permission; any other error leaves
// the check unavailable.
func callFailed(check, scope, action string, err error) providers.CheckResult {
	if isDenied(err) {
		return failed(check, scope, "ec2:"+action+" denied", "allow ec2:"+action+" ("+iamDoc+")")
	}
	return providers.CheckResult{Check: check, Scope: scope, Status: providers.CheckUnavailable, Detail: firstLine(apiErrorText(err))}
}

func errCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

func isDenied(err error) bool {
	switch errCode(err) {
	case "UnauthorizedOperation", "AccessDenied", "AccessDeniedException":
		return true
	}
	return false
}

// checkCredentials resolves the block's credentials the way every call
// does and names their source.
func (p *Provider) checkCredentials(ctx context.Context, b block) (providers.CheckResult, bool) {
	fix := "configure AWS credentials: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, ~/.aws/credentials, `profile` in the block, SSO (`aws sso login`), or an instance role on the daemon's VM"
	cfg, err := loadConfig(ctx, b.Profile, b.Regions[0], 1, nil)
	if err != nil {
		return failed("credentials", "", err.Error(), fix), false
	}
	if cfg.Credentials == nil {
		return failed("credentials", "", "no credential provider", fix), false
	}
	creds, err := cfg.Credentials.Retrieve(ctx)
	if err != nil {
		return failed("credentials", "", "none found: "+firstLine(err.Error()), fix), false
	}
	src := creds.Source
	if src == "" {
		src = "unknown source"
	}
	detail := "from " + src
	if b.Profile != "" {
		detail += " (profile " + b.Profile + ")"
	}
	return ok1("credentials", "", detail), true
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

func checkImage(ctx context.Context, client ec2API, b block, region string) providers.CheckResult {
	img := b.imageFor(region)
	fix := fmt.Sprintf("set image_per_region[%q] to an AMI that exists in %s (AMIs are regional: `aws ec2 copy-image --source-region …`)", region, region)
	resp, err := client.DescribeImages(ctx, &ec2.DescribeImagesInput{ImageIds: []string{img}})
	switch {
	case err != nil && strings.HasPrefix(errCode(err), "InvalidAMIID"):
		return failed("image", region, img+" not found", fix)
	case err != nil:
		return callFailed("image", region, "DescribeImages", err)
	case len(resp.Images) == 0:
		return failed("image", region, img+" not found", fix)
	}
	im := resp.Images[0]
	if im.State != "" && im.State != types.ImageStateAvailable {
		return failed("image", region, fmt.Sprintf("%s is %s", img, im.State), "wait for the AMI to become available or pick another")
	}
	detail := img
	if n := awssdk.ToString(im.Name); n != "" {
		detail += " (" + n + ")"
	}
	return ok1("image", region, detail)
}

// subnetsIn returns the block's zone → subnet entries of region, by zone.
func subnetsIn(b block, region string) [][2]string {
	var out [][2]string
	for z, sn := range b.Subnets {
		if regionOfZone(b.Regions, z) == region {
			out = append(out, [2]string{z, sn})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i][0] < out[j][0] })
	return out
}

func checkSubnets(ctx context.Context, client ec2API, b block, region string) []providers.CheckResult {
	if len(b.Subnets) == 0 {
		return []providers.CheckResult{ok1("subnets", region, "none set: instances use the default VPC's subnets")}
	}
	entries := subnetsIn(b, region)
	if len(entries) == 0 {
		return []providers.CheckResult{failed("subnets", region, "no subnet in this region's zones: it will not be used",
			fmt.Sprintf("add subnets for zones of %s, or remove it from regions", region))}
	}
	var out []providers.CheckResult
	for _, e := range entries {
		zone, id := e[0], e[1]
		scope := zone
		resp, err := client.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{SubnetIds: []string{id}})
		switch {
		case err != nil && strings.HasPrefix(errCode(err), "InvalidSubnetID"), err == nil && len(resp.Subnets) == 0:
			out = append(out, failed("subnet", scope, id+" not found in "+region,
				fmt.Sprintf("set subnets[%q] to a subnet of that zone (`aws ec2 describe-subnets --filters Name=availability-zone,Values=%s`)", zone, zone)))
		case err != nil:
			out = append(out, callFailed("subnet", scope, "DescribeSubnets", err))
		default:
			sn := resp.Subnets[0]
			if az := awssdk.ToString(sn.AvailabilityZone); az != zone {
				out = append(out, failed("subnet", scope, fmt.Sprintf("%s is in %s, not %s", id, az, zone),
					fmt.Sprintf("move it under subnets[%q] or pick a subnet in %s", az, zone)))
				continue
			}
			out = append(out, ok1("subnet", scope, fmt.Sprintf("%s (%s, %d free addresses)", id, awssdk.ToString(sn.VpcId), awssdk.ToInt32(sn.AvailableIpAddressCount))))
		}
	}
	return out
}

func checkSecurityGroups(ctx context.Context, client ec2API, b block, region string) []providers.CheckResult {
	groups := b.groupsFor(region)
	if len(groups) == 0 {
		return []providers.CheckResult{ok1("security groups", region, "none set: the VPC's default group (nodes must reach each other on all ports)")}
	}
	var out []providers.CheckResult
	for _, g := range groups {
		resp, err := client.DescribeSecurityGroups(ctx, &ec2.DescribeSecurityGroupsInput{GroupIds: []string{g}})
		switch {
		case err != nil && strings.HasPrefix(errCode(err), "InvalidGroup"), err == nil && len(resp.SecurityGroups) == 0:
			out = append(out, failed("security group", region, g+" not found in "+region,
				fmt.Sprintf("security group ids are regional: create one in %s in the subnets' VPC (allowing all traffic between its members) and set security_groups_per_region[%q]", region, region)))
		case err != nil:
			out = append(out, callFailed("security group", region, "DescribeSecurityGroups", err))
		default:
			sg := resp.SecurityGroups[0]
			out = append(out, ok1("security group", region, fmt.Sprintf("%s (%s, %s)", g, awssdk.ToString(sg.GroupName), awssdk.ToString(sg.VpcId))))
		}
	}
	return out
}

// checkPermissions proves the mutating calls with DryRun. A dry run that
// fails for another reason (an unknown AMI) proves nothing either way; its
// row says so and points at the row that explains it.
func checkPermissions(ctx context.Context, client ec2API, b block, region string, quick bool) []providers.CheckResult {
	var out []providers.CheckResult
	row := func(action string, err error) {
		check := "permission ec2:" + action
		switch {
		case errCode(err) == "DryRunOperation":
			out = append(out, ok1(check, region, "allowed (DryRun)"))
		case isDenied(err):
			fix := "allow ec2:" + action + " in the IAM policy of fleetd's credentials (" + iamDoc + ")"
			if action == "RunInstances" && b.InstanceProfile != "" {
				fix += "; launching with instance_profile also needs iam:PassRole on its role"
			}
			out = append(out, failed(check, region, "denied: "+firstLine(apiErrorText(err)), fix+"; `aws sts decode-authorization-message` explains an encoded denial"))
		case err == nil:
			out = append(out, providers.CheckResult{Check: check, Scope: region, Status: providers.CheckUnavailable, Detail: "the endpoint ignored DryRun"})
		default:
			out = append(out, providers.CheckResult{Check: check, Scope: region, Status: providers.CheckUnavailable,
				Detail: "not proven: the dry run failed with " + errCode(err) + " (see the rows above)"})
		}
	}
	in := &ec2.RunInstancesInput{
		DryRun: awssdk.Bool(true), ImageId: awssdk.String(b.imageFor(region)), InstanceType: types.InstanceType(b.InstanceTypes[0]),
		MinCount: awssdk.Int32(1), MaxCount: awssdk.Int32(1), SecurityGroupIds: b.groupsFor(region),
		InstanceMarketOptions: &types.InstanceMarketOptionsRequest{MarketType: types.MarketTypeSpot},
		TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeInstance,
			Tags: []types.Tag{{Key: awssdk.String(providers.TagFleet), Value: awssdk.String("fleetd-check")}}}},
	}
	if e := subnetsIn(b, region); len(e) > 0 {
		in.SubnetId = awssdk.String(e[0][1])
	}
	if b.InstanceProfile != "" {
		in.IamInstanceProfile = &types.IamInstanceProfileSpecification{Name: awssdk.String(b.InstanceProfile)}
	}
	if b.KeyName != "" {
		in.KeyName = awssdk.String(b.KeyName)
	}
	_, err := client.RunInstances(ctx, in, func(o *ec2.Options) { o.RetryMaxAttempts = 1 })
	row("RunInstances", err)
	if quick {
		return out
	}
	// A well-formed id that need not exist: EC2 checks permission first.
	const probe = "i-0fffffffffffffff0"
	_, err = client.CreateTags(ctx, &ec2.CreateTagsInput{DryRun: awssdk.Bool(true), Resources: []string{probe},
		Tags: []types.Tag{{Key: awssdk.String(providers.TagFleet), Value: awssdk.String("fleetd-check")}}}, func(o *ec2.Options) { o.RetryMaxAttempts = 1 })
	row("CreateTags", err)
	_, err = client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{DryRun: awssdk.Bool(true), InstanceIds: []string{probe}},
		func(o *ec2.Options) { o.RetryMaxAttempts = 1 })
	row("TerminateInstances", err)
	return out
}

// checkTypesOffered says, per instance type, in which usable zones EC2
// offers it; a type offered in none of them can never launch.
func (p *Provider) checkTypesOffered(ctx context.Context, b block) []providers.CheckResult {
	offered := map[string][]string{}
	for _, region := range b.Regions {
		client, err := p.ec2Client(ctx, b, region)
		if err != nil {
			continue
		}
		where, err := describeTypeZones(ctx, client, b.InstanceTypes)
		if err != nil {
			return []providers.CheckResult{callFailed("instance types offered", region, "DescribeInstanceTypeOfferings", err)}
		}
		for it, zones := range where {
			for z := range zones {
				if b.zoneAllowed(z) {
					offered[it] = append(offered[it], z)
				}
			}
		}
	}
	var out []providers.CheckResult
	for _, it := range b.InstanceTypes {
		zones := offered[it]
		sort.Strings(zones)
		if len(zones) == 0 {
			where := "any of the block's regions"
			if len(b.Subnets) > 0 {
				where = "any zone with a subnet"
			}
			out = append(out, failed("instance type", it, "not offered in "+where,
				"pick a type offered there (`aws ec2 describe-instance-type-offerings --location-type availability-zone`) or add subnets in zones that offer it"))
			continue
		}
		out = append(out, ok1("instance type", it, "offered in "+strings.Join(zones, ", ")))
	}
	return out
}

// vCPU quota codes of the EC2 instance families fleetd is used with.
var quotaCodes = map[string]struct{ onDemand, spot, name string }{
	"standard": {"L-1216C47A", "L-34B43A08", "Standard (A, C, D, H, I, M, R, T, Z)"},
	"g":        {"L-DB2E81BA", "L-3819A6DF", "G and VT"},
	"p":        {"L-417A185B", "L-7212CCBC", "P"},
}

// quotaFamily is the Service Quotas family of an instance type: "p4d.24xlarge" → "p".
func quotaFamily(instanceType string) string {
	fam, _, _ := strings.Cut(instanceType, ".")
	letters := strings.TrimRightFunc(fam, func(r rune) bool { return r < 'a' || r > 'z' })
	i := strings.IndexFunc(letters, func(r rune) bool { return r >= '0' && r <= '9' })
	if i >= 0 {
		letters = letters[:i]
	}
	switch {
	case strings.HasPrefix(letters, "p"):
		return "p"
	case strings.HasPrefix(letters, "g"), strings.HasPrefix(letters, "vt"):
		return "g"
	case strings.HasPrefix(letters, "inf"), strings.HasPrefix(letters, "trn"), strings.HasPrefix(letters, "dl"),
		strings.HasPrefix(letters, "f"), strings.HasPrefix(letters, "x"), strings.HasPrefix(letters, "u"):
		return letters
	case letters != "" && strings.ContainsRune("acdhimrtz", rune(letters[0])):
		return "standard"
	}
	return letters
}

func (p *Provider) checkQuotas(ctx context.Context, client ec2API, b block, region string, nodes int) []providers.CheckResult {
	if nodes <= 0 {
		nodes = 1
	}
	infos, err := p.typeInfos(ctx, client, b, region)
	if err != nil {
		return []providers.CheckResult{{Check: "vCPU quotas", Scope: region, Status: providers.CheckUnavailable, Detail: "instance types: " + firstLine(err.Error())}}
	}
	need := map[string]int{}
	for _, it := range b.InstanceTypes {
		if ti, ok := infos[it]; ok {
			f := quotaFamily(it)
			need[f] = max(need[f], ti.VCPUs*nodes)
		}
	}
	sq, err := p.quotasClient(ctx, b, region)
	if err != nil {
		return []providers.CheckResult{{Check: "vCPU quotas", Scope: region, Status: providers.CheckUnavailable, Detail: firstLine(err.Error())}}
	}
	var out []providers.CheckResult
	for _, fam := range slices.Sorted(maps.Keys(need)) {
		codes, ok := quotaCodes[fam]
		if !ok {
			out = append(out, providers.CheckResult{Check: "vCPU quota " + fam, Scope: region, Status: providers.CheckUnavailable,
				Detail: "fleetd does not know this family's quota codes", Fix: "check it in the Service Quotas console (EC2)"})
			continue
		}
		for _, m := range []struct{ market, code string }{{"spot", codes.spot}, {"on-demand", codes.onDemand}} {
			check := fmt.Sprintf("vCPU quota %s %s", m.market, codes.name)
			resp, err := sq.GetServiceQuota(ctx, &servicequotas.GetServiceQuotaInput{ServiceCode: awssdk.String("ec2"), QuotaCode: awssdk.String(m.code)},
				func(o *servicequotas.Options) { o.RetryMaxAttempts = 1 })
			switch {
			case err != nil && isDenied(err):
				out = append(out, failed(check, region, "servicequotas:GetServiceQuota denied", "allow servicequotas:GetServiceQuota ("+iamDoc+"), or check the quota in the console"))
				continue
			case err != nil:
				out = append(out, providers.CheckResult{Check: check, Scope: region, Status: providers.CheckUnavailable,
					Detail: "not available: " + quotaErrText(err), Fix: "check " + m.code + " in the Service Quotas console"})
				continue
			}
			have := 0
			if resp.Quota != nil && resp.Quota.Value != nil {
				have = int(*resp.Quota.Value)
			}
			detail := fmt.Sprintf("%d vCPUs, %d needed for %d nodes", have, need[fam], nodes)
			if have < need[fam] {
				out = append(out, failed(check, region, detail,
					fmt.Sprintf("request an increase of %s (%s) in %s: `aws service-quotas request-service-quota-increase --service-code ec2 --quota-code %s --desired-value %d --region %s`", m.code, check, region, m.code, need[fam], region)))
				continue
			}
			out = append(out, ok1(check, region, detail))
		}
	}
	return out
}

func quotaErrText(err error) string {
	if c := errCode(err); c != "" {
		return c
	}
	return firstLine(err.Error())
}

// checkQueues proves the interruption queue exists and can be read
// without consuming a message (GetQueueAttributes).
func checkQueues(ctx context.Context, cfg providers.Config, b block) []providers.CheckResult {
	qs, err := InterruptionQueues(cfg)
	if err != nil {
		return []providers.CheckResult{failed("interruption queue", "", err.Error(), "fix interruption_queue")}
	}
	if len(qs) == 0 {
		return []providers.CheckResult{ok1("interruption queue", "", "none set: notices come from each node's metadata watch only")}
	}
	var out []providers.CheckResult
	fix := "create the queue and the EventBridge rules that feed it (docs/providers/aws.md#interruption-queue), and allow sqs:ReceiveMessage, sqs:DeleteMessage, sqs:GetQueueAttributes, sqs:GetQueueUrl"
	for _, q := range qs {
		client, err := NewSQSClient(ctx, cfg, q.Region)
		if err != nil {
			out = append(out, failed("interruption queue", q.Region, err.Error(), fix))
			continue
		}
		url := q.Queue
		if !strings.Contains(url, "://") {
			resp, err := client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: awssdk.String(q.Queue)})
			if err != nil {
				out = append(out, failed("interruption queue", q.Region, q.Queue+": "+quotaErrText(err), fix))
				continue
			}
			url = awssdk.ToString(resp.QueueUrl)
		}
		attrs, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: awssdk.String(url),
			AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameApproximateNumberOfMessages}})
		if err != nil {
			out = append(out, failed("interruption queue", q.Region, q.Queue+": "+quotaErrText(err), fix))
			continue
		}
		n := attrs.Attributes[string(sqstypes.QueueAttributeNameApproximateNumberOfMessages)]
		out = append(out, ok1("interruption queue", q.Region, fmt.Sprintf("%s readable (%s messages waiting)", q.Queue, n)))
	}
	return out
}

// quotasClient returns a Service Quotas client for the block in region.
func (p *Provider) quotasClient(ctx context.Context, b block, region string) (*servicequotas.Client, error) {
	cfg, err := loadConfig(ctx, b.Profile, region, 1, nil)
	if err != nil {
		return nil, err
	}
	return servicequotas.NewFromConfig(cfg, func(o *servicequotas.Options) { setEndpoint(&o.BaseEndpoint, b.ServiceQuotasEndpoint) }), nil
}
