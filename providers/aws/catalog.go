package aws

import (
	"context"
	"errors"
	"strings"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
)

// typeZones returns, per configured instance type, the zones of region
// where EC2 offers it (DescribeInstanceTypeOfferings, location type
// availability-zone), from cache when younger than InstanceTypeTTL: the
// catalogue changes when AWS adds a type to a zone, which is rare.
//
// An account whose IAM policy predates this call (it was not in fleetd's
// least-privilege policy before) is not locked out: when the call is
// denied, the zones come from the spot price history as they used to, and
// the denial is logged once per cache period by the caller's Check.
func (p *Provider) typeZones(ctx context.Context, client ec2API, b block, region string, spot map[string]map[string]float64) (map[string]map[string]bool, error) {
	out, err := fromCache(p, p.zoneCache, cacheKey(b, region), p.opts.InstanceTypeTTL, func(time.Time) (map[string]map[string]bool, error) {
		return describeTypeZones(ctx, client, b.InstanceTypes)
	})
	if err != nil {
		var ae smithy.APIError
		if errors.As(err, &ae) && (ae.ErrorCode() == "UnauthorizedOperation" || ae.ErrorCode() == "AccessDenied") {
			out = map[string]map[string]bool{}
			for it, zones := range spot {
				out[it] = map[string]bool{}
				for z := range zones {
					out[it][z] = true
				}
			}
			// Not cached: a fixed policy takes effect on the next call.
			return out, nil
		}
		return nil, classify("DescribeInstanceTypeOfferings in "+region, "", err)
	}
	return out, nil
}

// describeTypeZones pages through DescribeInstanceTypeOfferings for the
// given types.
func describeTypeZones(ctx context.Context, client ec2API, instanceTypes []string) (map[string]map[string]bool, error) {
	in := &ec2.DescribeInstanceTypeOfferingsInput{
		LocationType: types.LocationTypeAvailabilityZone,
		Filters:      []types.Filter{{Name: awssdk.String("instance-type"), Values: instanceTypes}},
		MaxResults:   awssdk.Int32(1000),
	}
	out := map[string]map[string]bool{}
	for range maxPages {
		resp, err := client.DescribeInstanceTypeOfferings(ctx, in)
		if err != nil {
			return nil, err
		}
		for _, o := range resp.InstanceTypeOfferings {
			if o.LocationType != "" && o.LocationType != types.LocationTypeAvailabilityZone {
				continue
			}
			it, zone := string(o.InstanceType), awssdk.ToString(o.Location)
			if out[it] == nil {
				out[it] = map[string]bool{}
			}
			out[it][zone] = true
		}
		if awssdk.ToString(resp.NextToken) == "" {
			break
		}
		in.NextToken = resp.NextToken
	}
	return out, nil
}

// zoneIDs maps the zone ids of region ("use1-az4") to the account's zone
// names ("us-east-1a"); the mapping differs per account, and spot placement
// scores come by id. Cached like the catalogue.
func (p *Provider) zoneIDs(ctx context.Context, client ec2API, b block, region string) (map[string]string, error) {
	return fromCache(p, p.zoneIDCache, b.scope()+"|"+region, p.opts.InstanceTypeTTL, func(time.Time) (map[string]string, error) {
		return describeZoneIDs(ctx, client)
	})
}

func describeZoneIDs(ctx context.Context, client ec2API) (map[string]string, error) {
	resp, err := client.DescribeAvailabilityZones(ctx, &ec2.DescribeAvailabilityZonesInput{})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, z := range resp.AvailabilityZones {
		if id, name := awssdk.ToString(z.ZoneId), awssdk.ToString(z.ZoneName); id != "" && name != "" {
			out[id] = name
		}
	}
	return out, nil
}

// apiErrorText is "Code: message" of an SDK error, or its text.
func apiErrorText(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		msg := strings.TrimSpace(ae.ErrorMessage())
		if msg == "" {
			return ae.ErrorCode()
		}
		return ae.ErrorCode() + ": " + msg
	}
	return err.Error()
}
