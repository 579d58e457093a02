package aws

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/smithy-go"

	"github.com/fleetd/fleetd/providers"
)

// errorKinds maps EC2 error codes to fleetd's error kinds. Capacity codes
// are per offering: the daemon marks only that (zone, type, capacity type)
// unavailable. Quota codes are per account and region (vCPU-based, per
// instance family group): long back-off and an alert. Throttling reaches
// here only after the SDK's own bounded retries.
var errorKinds = map[string]providers.ErrorKind{
	"InsufficientInstanceCapacity":         providers.KindCapacity,
	"InsufficientCapacity":                 providers.KindCapacity,
	"InsufficientHostCapacity":             providers.KindCapacity,
	"InsufficientReservedInstanceCapacity": providers.KindCapacity,
	"UnfulfillableCapacity":                providers.KindCapacity,
	// The spot price is above the max price for this offering: no point
	// retrying it now, but other offerings may be fine.
	"SpotMaxPriceTooLow": providers.KindCapacity,
	// "Your requested instance type is not supported in your requested
	// Availability Zone": a per-offering hole, not a config error.
	"Unsupported":                       providers.KindCapacity,
	"InsufficientFreeAddressesInSubnet": providers.KindCapacity,

	"MaxSpotInstanceCountExceeded": providers.KindQuota,
	"InstanceLimitExceeded":        providers.KindQuota,
	"VcpuLimitExceeded":            providers.KindQuota,

	"RequestLimitExceeded": providers.KindTransient,
	"Throttling":           providers.KindTransient,
	"ThrottlingException":  providers.KindTransient,
	"InternalError":        providers.KindTransient,
	"InternalFailure":      providers.KindTransient,
	"ServiceUnavailable":   providers.KindTransient,
	"Unavailable":          providers.KindTransient,
	"RequestTimeout":       providers.KindTransient,

	// The credentials themselves: missing, expired or not accepted. No
	// retry helps, and plan must say so instead of planning around it.
	"AuthFailure":                 providers.KindAuth,
	"ExpiredToken":                providers.KindAuth,
	"ExpiredTokenException":       providers.KindAuth,
	"RequestExpired":              providers.KindAuth, // signed too long ago: a clock or a stale signature
	"InvalidClientTokenId":        providers.KindAuth,
	"UnrecognizedClientException": providers.KindAuth,
	"SignatureDoesNotMatch":       providers.KindAuth,
	"InvalidAccessKeyId":          providers.KindAuth,
	"MissingAuthenticationToken":  providers.KindAuth,

	"InvalidParameterValue":       providers.KindInvalidConfig,
	"InvalidParameterCombination": providers.KindInvalidConfig,
	"InvalidParameter":            providers.KindInvalidConfig,
	"MissingParameter":            providers.KindInvalidConfig,
	"UnauthorizedOperation":       providers.KindInvalidConfig,
	// EC2 says UnauthorizedOperation when IAM denies a call, moto says
	// AccessDenied: either way a permission the block's credentials lack.
	"AccessDenied":                providers.KindInvalidConfig,
	"OptInRequired":               providers.KindInvalidConfig,
	"Blocked":                     providers.KindInvalidConfig,
	"InvalidInstanceType":         providers.KindInvalidConfig,
	"IdempotentParameterMismatch": providers.KindInvalidConfig, // a token reused for a different request: a caller bug

	"InvalidInstanceID.NotFound":  providers.KindNotFound,
	"InvalidInstanceID.Malformed": providers.KindNotFound,
}

// invalidConfigPrefixes are families of codes about a bad resource id in
// the block (image, subnet, security group, key pair, instance profile).
var invalidConfigPrefixes = []string{
	"InvalidAMIID.", "InvalidSubnetID.", "InvalidSubnet.", "InvalidGroup.", "InvalidGroupId.",
	"InvalidKeyPair.", "InvalidIamInstanceProfile", "InvalidSecurityGroupID.",
}

// kindOfCode classifies an EC2 error code; "" for codes fleetd does not
// branch on.
func kindOfCode(code string) providers.ErrorKind {
	if k, ok := errorKinds[code]; ok {
		return k
	}
	for _, p := range invalidConfigPrefixes {
		if strings.HasPrefix(code, p) {
			return providers.KindInvalidConfig
		}
	}
	return ""
}

// apiCode returns the EC2 error code in err's chain, or "".
func apiCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// classify turns an SDK error from op into a typed provider error about
// offering (an Offering.Key(), may be empty). Context errors stay as they
// are so callers see context.Canceled and DeadlineExceeded.
func classify(op string, offering string, err error) error {
	if err == nil {
		return nil
	}
	wrapped := fmt.Errorf("ec2 %s: %w", op, err)
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return wrapped
	}
	code := apiCode(err)
	kind := kindOfCode(code)
	switch {
	case code == "" && credentialsFailed(err):
		// The request was never sent: no credentials could be found or
		// refreshed (none configured, an SSO session or role that expired).
		kind, code = providers.KindAuth, "NoCredentials"
	case code == "":
		// No answer from EC2 at all (connection refused, DNS, TLS): the
		// SDK already retried it; worth retrying later.
		kind = providers.KindTransient
	}
	if kind == "" {
		return wrapped
	}
	pe := &providers.Error{Kind: kind, Code: code, Offering: offering, Err: wrapped}
	if kind == providers.KindTransient {
		pe.RetryAfter = time.Second
	}
	return pe
}

// credentialsFailed says whether err is the SDK failing to get credentials
// before sending a request. Depending on the service client's generation
// the SDK reports that as a signing error (the SigV4 middleware) or as an
// identity-resolution error, which has no type of its own: its text is
// "get identity: ...".
func credentialsFailed(err error) bool {
	var se *v4.SigningError
	return errors.As(err, &se) || strings.Contains(err.Error(), "get identity: ")
}
