package aws

import (
	"context"
	"errors"
	"fmt"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/smithy-go"

	"github.com/fleetd/fleetd/providers"
)

// ec2API is the part of the EC2 client the provider uses; *ec2.Client
// implements it.
type ec2API interface {
	DescribeInstanceTypes(context.Context, *ec2.DescribeInstanceTypesInput, ...func(*ec2.Options)) (*ec2.DescribeInstanceTypesOutput, error)
	DescribeInstanceTypeOfferings(context.Context, *ec2.DescribeInstanceTypeOfferingsInput, ...func(*ec2.Options)) (*ec2.DescribeInstanceTypeOfferingsOutput, error)
	DescribeAvailabilityZones(context.Context, *ec2.DescribeAvailabilityZonesInput, ...func(*ec2.Options)) (*ec2.DescribeAvailabilityZonesOutput, error)
	GetSpotPlacementScores(context.Context, *ec2.GetSpotPlacementScoresInput, ...func(*ec2.Options)) (*ec2.GetSpotPlacementScoresOutput, error)
	DescribeSpotPriceHistory(context.Context, *ec2.DescribeSpotPriceHistoryInput, ...func(*ec2.Options)) (*ec2.DescribeSpotPriceHistoryOutput, error)
	DescribeImages(context.Context, *ec2.DescribeImagesInput, ...func(*ec2.Options)) (*ec2.DescribeImagesOutput, error)
	DescribeSubnets(context.Context, *ec2.DescribeSubnetsInput, ...func(*ec2.Options)) (*ec2.DescribeSubnetsOutput, error)
	DescribeVpcs(context.Context, *ec2.DescribeVpcsInput, ...func(*ec2.Options)) (*ec2.DescribeVpcsOutput, error)
	DescribeNetworkInterfaces(context.Context, *ec2.DescribeNetworkInterfacesInput, ...func(*ec2.Options)) (*ec2.DescribeNetworkInterfacesOutput, error)
	DescribeSecurityGroups(context.Context, *ec2.DescribeSecurityGroupsInput, ...func(*ec2.Options)) (*ec2.DescribeSecurityGroupsOutput, error)
	CreateTags(context.Context, *ec2.CreateTagsInput, ...func(*ec2.Options)) (*ec2.CreateTagsOutput, error)
	RunInstances(context.Context, *ec2.RunInstancesInput, ...func(*ec2.Options)) (*ec2.RunInstancesOutput, error)
	DescribeInstances(context.Context, *ec2.DescribeInstancesInput, ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error)
	TerminateInstances(context.Context, *ec2.TerminateInstancesInput, ...func(*ec2.Options)) (*ec2.TerminateInstancesOutput, error)
	DescribeSpotInstanceRequests(context.Context, *ec2.DescribeSpotInstanceRequestsInput, ...func(*ec2.Options)) (*ec2.DescribeSpotInstanceRequestsOutput, error)
	CreatePlacementGroup(context.Context, *ec2.CreatePlacementGroupInput, ...func(*ec2.Options)) (*ec2.CreatePlacementGroupOutput, error)
	DescribePlacementGroups(context.Context, *ec2.DescribePlacementGroupsInput, ...func(*ec2.Options)) (*ec2.DescribePlacementGroupsOutput, error)
	DeletePlacementGroup(context.Context, *ec2.DeletePlacementGroupInput, ...func(*ec2.Options)) (*ec2.DeletePlacementGroupOutput, error)
}

// loadConfig loads the SDK configuration the way the AWS CLI does
// (environment, shared config/credentials files with profile, SSO, web
// identity, container and instance roles) for one region, with fleetd's
// retry policy.
func loadConfig(ctx context.Context, profile, region string, maxAttempts int, maxBackoff func() retry.BackoffDelayer) (awssdk.Config, error) {
	opts := []func(*config.LoadOptions) error{
		config.WithRegion(region),
		config.WithRetryer(func() awssdk.Retryer { return newRetryer(maxAttempts, maxBackoff) }),
	}
	if profile != "" {
		opts = append(opts, config.WithSharedConfigProfile(profile))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		var missing config.SharedConfigProfileNotExistError
		if errors.As(err, &missing) {
			return awssdk.Config{}, providers.InvalidConfig(fmt.Errorf("provider %q: profile %q: %w", Name, profile, err))
		}
		return awssdk.Config{}, fmt.Errorf("load AWS configuration: %w", err)
	}
	return cfg, nil
}

// newRetryer is the SDK's standard retryer (throttling and 5xx with
// jittered exponential backoff and a client-side retry quota), bounded in
// attempts, and told not to retry capacity and quota answers: EC2 sends
// InsufficientInstanceCapacity as a 500, which the SDK would retry in the
// same zone, while the daemon's answer to it is a different offering, now.
func newRetryer(maxAttempts int, backoff func() retry.BackoffDelayer) awssdk.Retryer {
	return retry.NewStandard(func(o *retry.StandardOptions) {
		o.MaxAttempts = maxAttempts
		if backoff != nil {
			o.Backoff = backoff()
		}
		o.Retryables = append([]retry.IsErrorRetryable{retry.IsErrorRetryableFunc(func(err error) awssdk.Ternary {
			var ae smithy.APIError
			if errors.As(err, &ae) && noRetryCodes[ae.ErrorCode()] {
				return awssdk.FalseTernary
			}
			return awssdk.UnknownTernary
		})}, o.Retryables...)
	})
}

// noRetryCodes are answers a retry of the identical request cannot fix.
var noRetryCodes = map[string]bool{
	"InsufficientInstanceCapacity": true, "InsufficientCapacity": true, "InsufficientHostCapacity": true,
	"InsufficientReservedInstanceCapacity": true, "UnfulfillableCapacity": true, "SpotMaxPriceTooLow": true,
	"MaxSpotInstanceCountExceeded": true, "VcpuLimitExceeded": true, "InstanceLimitExceeded": true,
}

type clientKey struct{ profile, endpoint, region string }

// ec2Client returns the (cached) EC2 client for block b in region.
func (p *Provider) ec2Client(ctx context.Context, b block, region string) (ec2API, error) {
	return p.clients.Get(clientKey{b.Profile, b.Endpoint, region}, func() (ec2API, error) {
		cfg, err := loadConfig(ctx, b.Profile, region, p.opts.RetryMaxAttempts, p.backoff)
		if err != nil {
			return nil, err
		}
		return ec2.NewFromConfig(cfg, func(o *ec2.Options) { setEndpoint(&o.BaseEndpoint, b.Endpoint) }), nil
	})
}

// setEndpoint points a service client at endpoint, a block's override of
// the service's URL, when one is set.
func setEndpoint(base **string, endpoint string) {
	if endpoint != "" {
		*base = awssdk.String(endpoint)
	}
}

// backoff returns the retry backoff: the SDK's jittered exponential one,
// capped at Options.RetryMaxBackoff.
func (p *Provider) backoff() retry.BackoffDelayer {
	return retry.NewExponentialJitterBackoff(p.opts.RetryMaxBackoff)
}
