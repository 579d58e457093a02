package aws

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/fleetd/fleetd/providers"
)

// maxPages bounds every NextToken loop: a misbehaving endpoint that never
// stops paginating must not hang the provider.
const maxPages = 1000

// spotProducts are the spot price product descriptions of Linux
// instances: EC2 reports "Linux/UNIX" for VPC instances today, while
// accounts from the EC2-Classic era, moto and much other tooling report
// "Linux/UNIX (Amazon VPC)". fleetd launches only Linux in a VPC, so both
// mean the same price.
var spotProducts = []string{"Linux/UNIX", "Linux/UNIX (Amazon VPC)"}

// typeInfo is what DescribeInstanceTypes says about one instance type.
type typeInfo struct {
	VCPUs           int
	MemoryGiB       float64
	GPUs            int
	GPUType         string // e.g. "A100"
	GPUManufacturer string // e.g. "NVIDIA"
	Arch            string // Go's name: "amd64", "arm64"; "" when EC2 names none fleetd knows
	// EFAInterfaces is EfaInfo.MaximumEfaInterfaces (0: no EFA),
	// NetworkCards NetworkInfo.MaximumNetworkCards, BandwidthGbps the sum
	// of the cards' peak bandwidth.
	EFAInterfaces int
	NetworkCards  int
	BandwidthGbps float64
}

// Offerings lists the offerings of every configured instance type in every
// zone of every configured region where EC2 offers the type
// (DescribeInstanceTypeOfferings) and, when subnets is set, the zone has a
// subnet. Each such zone has an on-demand offering when an on-demand price
// is known, and a spot offering when EC2 publishes a spot price there; a
// type with no spot price in a zone still has its on-demand offering.
// Spot offerings carry the zone's spot placement score when EC2 gives one.
func (p *Provider) Offerings(ctx context.Context, cfg providers.Config) ([]providers.Offering, error) {
	b, err := callBlock(ctx, cfg)
	if err != nil {
		return nil, err
	}
	var out []providers.Offering
	for _, region := range b.Regions {
		offs, err := p.regionOfferings(ctx, b, region)
		if err != nil {
			return nil, err
		}
		out = append(out, offs...)
	}
	return out, nil
}

func (p *Provider) regionOfferings(ctx context.Context, b block, region string) ([]providers.Offering, error) {
	client, err := p.ec2Client(ctx, b, region)
	if err != nil {
		return nil, err
	}
	infos, err := p.typeInfos(ctx, client, b, region)
	if err != nil {
		return nil, err
	}
	spot, err := p.spotPrices(ctx, client, b, region)
	if err != nil {
		return nil, err
	}
	where, err := p.typeZones(ctx, client, b, region, spot)
	if err != nil {
		return nil, err
	}
	scores := p.placementScores(ctx, client, b, region)
	vpcs := p.vpcs(ctx, client, b, region)
	odQuotes, err := p.onDemandQuotes(ctx, b, region)
	if err != nil {
		return nil, err
	}
	var out []providers.Offering
	for _, it := range b.InstanceTypes {
		info, ok := infos[it]
		if !ok {
			continue
		}
		zones := make([]string, 0, len(where[it]))
		for z := range where[it] {
			zones = append(zones, z)
		}
		sort.Strings(zones)
		for _, z := range zones {
			if !b.zoneAllowed(z) {
				continue
			}
			base := providers.Offering{
				Provider: Name, Region: region, Zone: z, InstanceType: it,
				GPUs: info.GPUs, GPUType: info.GPUType, VCPUs: info.VCPUs, MemoryGiB: info.MemoryGiB,
				Arch: info.Arch, Available: -1, VPC: vpcs.of(z),
			}
			if b.Subnets[z] != "" {
				// EFA interfaces are created in the zone's subnet: without
				// one the type launches on the standard network only.
				base.Network = info.network()
			}
			if price, ok := spot[it][z]; ok {
				s := base
				s.CapacityType, s.PricePerHour = providers.Spot, price
				s.PlacementScore, s.PlacementScoreNote = scores.score(it, z)
				s.PriceSource, s.PriceAsOf = SourceSpotHistory, p.spotTime(b, region, it, z)
				out = append(out, s)
			}
			if q, ok := odQuotes[it]; ok {
				od := base
				od.CapacityType, od.PricePerHour = providers.OnDemand, q.price
				od.PriceSource, od.PriceAsOf = q.source, q.asOf
				out = append(out, od)
			}
		}
	}
	return out, nil
}

func cacheKey(b block, region string) string {
	types := slices.Clone(b.InstanceTypes)
	sort.Strings(types)
	return b.scope() + "|" + region + "|" + strings.Join(types, ",")
}

// typeInfos describes the block's instance types in region, from cache
// when fresh.
func (p *Provider) typeInfos(ctx context.Context, client ec2API, b block, region string) (map[string]typeInfo, error) {
	return fromCache(p, p.typeCache, cacheKey(b, region), p.opts.InstanceTypeTTL, func(time.Time) (map[string]typeInfo, error) {
		return describeTypeInfos(ctx, client, b, region)
	})
}

// describeTypeInfos pages through DescribeInstanceTypes for the block's
// instance types.
func describeTypeInfos(ctx context.Context, client ec2API, b block, region string) (map[string]typeInfo, error) {
	out := map[string]typeInfo{}
	in := &ec2.DescribeInstanceTypesInput{}
	for _, t := range b.InstanceTypes {
		in.InstanceTypes = append(in.InstanceTypes, types.InstanceType(t))
	}
	for range maxPages {
		resp, err := client.DescribeInstanceTypes(ctx, in)
		if err != nil {
			return nil, classify("DescribeInstanceTypes in "+region, "", err)
		}
		for _, t := range resp.InstanceTypes {
			out[string(t.InstanceType)] = toTypeInfo(t)
		}
		if awssdk.ToString(resp.NextToken) == "" {
			break
		}
		in.NextToken = resp.NextToken
	}
	return out, nil
}

func toTypeInfo(t types.InstanceTypeInfo) typeInfo {
	var ti typeInfo
	if t.VCpuInfo != nil {
		ti.VCPUs = int(awssdk.ToInt32(t.VCpuInfo.DefaultVCpus))
	}
	if t.MemoryInfo != nil {
		ti.MemoryGiB = float64(awssdk.ToInt64(t.MemoryInfo.SizeInMiB)) / 1024
	}
	if t.ProcessorInfo != nil {
		ti.Arch = goArch(t.ProcessorInfo.SupportedArchitectures)
	}
	networkTypeInfo(t.NetworkInfo, &ti)
	if t.GpuInfo != nil {
		for _, g := range t.GpuInfo.Gpus {
			ti.GPUs += int(awssdk.ToInt32(g.Count))
			if ti.GPUType == "" {
				ti.GPUType = awssdk.ToString(g.Name)
				ti.GPUManufacturer = awssdk.ToString(g.Manufacturer)
			}
		}
	}
	return ti
}

// goArch maps EC2's processor architectures to Go's name of the one
// fleetd's agent is built for: x86_64 → amd64, arm64 → arm64 (Graviton).
// A type listing both (none does today) counts as x86_64; any other
// (i386, the Mac ones) keeps EC2's name, which no agent binary serves.
func goArch(archs []types.ArchitectureType) string {
	out := ""
	for _, a := range archs {
		switch a {
		case types.ArchitectureTypeX8664:
			return "amd64"
		case types.ArchitectureTypeArm64:
			out = "arm64"
		default:
			if out == "" {
				out = string(a)
			}
		}
	}
	return out
}

// spotPrices returns the current Linux spot price per instance type and
// zone in region (the newest entry of either Linux product description),
// from cache when younger than SpotPriceTTL.
func (p *Provider) spotPrices(ctx context.Context, client ec2API, b block, region string) (map[string]map[string]float64, error) {
	key := cacheKey(b, region)
	return fromCache(p, p.spotCache, key, p.opts.SpotPriceTTL, func(now time.Time) (map[string]map[string]float64, error) {
		return p.describeSpotPrices(ctx, client, b, region, key, now)
	})
}

// describeSpotPrices asks DescribeSpotPriceHistory for the prices in
// effect at now and remembers, under key, when each was set.
func (p *Provider) describeSpotPrices(ctx context.Context, client ec2API, b block, region, key string, now time.Time) (map[string]map[string]float64, error) {
	// With StartTime = now EC2 returns, per (type, zone), the price in
	// effect now (and nothing older), so one short query is enough.
	in := &ec2.DescribeSpotPriceHistoryInput{
		ProductDescriptions: spotProducts,
		StartTime:           awssdk.Time(now),
		MaxResults:          awssdk.Int32(1000),
	}
	for _, t := range b.InstanceTypes {
		in.InstanceTypes = append(in.InstanceTypes, types.InstanceType(t))
	}
	type latest struct {
		price float64
		at    time.Time
	}
	seen := map[string]map[string]latest{}
	for range maxPages {
		resp, err := client.DescribeSpotPriceHistory(ctx, in)
		if err != nil {
			return nil, classify("DescribeSpotPriceHistory in "+region, "", err)
		}
		for _, sp := range resp.SpotPriceHistory {
			if !slices.Contains(spotProducts, string(sp.ProductDescription)) {
				continue
			}
			price, err := strconv.ParseFloat(awssdk.ToString(sp.SpotPrice), 64)
			if err != nil || !(price > 0) {
				return nil, fmt.Errorf("ec2 DescribeSpotPriceHistory in %s: bad price %q for %s", region, awssdk.ToString(sp.SpotPrice), sp.InstanceType)
			}
			it, zone, at := string(sp.InstanceType), awssdk.ToString(sp.AvailabilityZone), awssdk.ToTime(sp.Timestamp)
			if seen[it] == nil {
				seen[it] = map[string]latest{}
			}
			if cur, ok := seen[it][zone]; !ok || at.After(cur.at) {
				seen[it][zone] = latest{price: price, at: at}
			}
		}
		if awssdk.ToString(resp.NextToken) == "" {
			break
		}
		in.NextToken = resp.NextToken
	}
	out := map[string]map[string]float64{}
	at := map[string]map[string]time.Time{}
	for it, zones := range seen {
		out[it] = map[string]float64{}
		at[it] = map[string]time.Time{}
		for z, l := range zones {
			out[it][z] = l.price
			at[it][z] = l.at
		}
	}
	p.rememberSpotTimes(key, at)
	return out, nil
}

// describeOffering fills price and shape of an offering from the caches,
// without calling EC2 (Get and List report what they know).
func (p *Provider) describeOffering(b block, o providers.Offering) providers.Offering {
	key := cacheKey(b, o.Region)
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.typeCache[key]; ok {
		if ti, ok := c.val[o.InstanceType]; ok {
			o.GPUs, o.GPUType, o.VCPUs, o.MemoryGiB, o.Arch = ti.GPUs, ti.GPUType, ti.VCPUs, ti.MemoryGiB, ti.Arch
			o.Network = ti.network()
		}
	}
	switch o.CapacityType {
	case providers.Spot:
		if c, ok := p.spotCache[key]; ok {
			o.PricePerHour = c.val[o.InstanceType][o.Zone]
			o.PriceSource, o.PriceAsOf = SourceSpotHistory, p.prices.spotAt[key][o.InstanceType][o.Zone]
		}
	case providers.OnDemand:
		q, _ := p.knownOnDemandQuoteLocked(b, o.Region, o.InstanceType)
		o.PricePerHour, o.PriceSource, o.PriceAsOf = q.price, q.source, q.asOf
	}
	o.Available = -1
	return o
}
