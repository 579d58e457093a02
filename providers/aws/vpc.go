package aws

import (
	"context"
	"sort"
	"strings"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
)

// regionVPCs is where nodes of one region land: the VPC of each zone's
// configured subnet, or the region's default VPC when the block sets no
// subnets (RunInstances then picks the default subnet of the zone).
type regionVPCs struct {
	byZone     map[string]string
	defaultVPC string
}

// of is the VPC a node launched in zone lands in; "" when unknown.
func (v regionVPCs) of(zone string) string {
	if vpc, ok := v.byZone[zone]; ok {
		return vpc
	}
	return v.defaultVPC
}

// vpcs says which VPC the block's nodes in region land in, describing
// the region's configured subnets (or its default VPC) once per
// InstanceTypeTTL: a subnet never changes VPC. A failed lookup leaves
// the VPCs unknown, never the offerings unlisted: placement then keeps
// the offerings and the plan says their network is unchecked, while
// `fleetd check` reports the subnet itself.
func (p *Provider) vpcs(ctx context.Context, client ec2API, b block, region string) regionVPCs {
	subnets := map[string]string{} // subnet id → zone
	for z, id := range b.Subnets {
		if regionOfZone(b.Regions, z) == region {
			subnets[id] = z
		}
	}
	ids := make([]string, 0, len(subnets))
	for id := range subnets {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	key := b.scope() + "|" + region + "|" + strings.Join(ids, ",")
	v, err := fromCache(p, p.vpcCache, key, p.opts.InstanceTypeTTL, func(time.Time) (regionVPCs, error) {
		if len(ids) == 0 {
			return describeDefaultVPC(ctx, client, region)
		}
		return describeSubnetVPCs(ctx, client, region, ids, subnets)
	})
	if err != nil {
		return regionVPCs{}
	}
	return v
}

func describeSubnetVPCs(ctx context.Context, client ec2API, region string, ids []string, zoneOf map[string]string) (regionVPCs, error) {
	v := regionVPCs{byZone: map[string]string{}}
	in := &ec2.DescribeSubnetsInput{SubnetIds: ids}
	for range maxPages {
		resp, err := client.DescribeSubnets(ctx, in)
		if err != nil {
			return regionVPCs{}, classify("DescribeSubnets in "+region, "", err)
		}
		for _, sn := range resp.Subnets {
			if z, ok := zoneOf[awssdk.ToString(sn.SubnetId)]; ok {
				v.byZone[z] = awssdk.ToString(sn.VpcId)
			}
		}
		if awssdk.ToString(resp.NextToken) == "" {
			break
		}
		in.NextToken = resp.NextToken
	}
	return v, nil
}

func describeDefaultVPC(ctx context.Context, client ec2API, region string) (regionVPCs, error) {
	resp, err := client.DescribeVpcs(ctx, &ec2.DescribeVpcsInput{
		Filters: []types.Filter{{Name: awssdk.String("isDefault"), Values: []string{"true"}}},
	})
	if err != nil {
		return regionVPCs{}, classify("DescribeVpcs in "+region, "", err)
	}
	if len(resp.Vpcs) == 0 {
		// No default VPC: a launch without subnets fails, and the
		// network is unknown.
		return regionVPCs{}, nil
	}
	return regionVPCs{defaultVPC: awssdk.ToString(resp.Vpcs[0].VpcId)}, nil
}
