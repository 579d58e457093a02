package aws_test

import (
	"testing"

	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/aws"
)

// TestCredentialErrorsAreAuth: missing, expired or rejected credentials are
// KindAuth (plan fails on them), not transient (retried forever) or a
// configuration error of the block.
func TestCredentialErrorsAreAuth(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, f fakeFailer)
		want  providers.ErrorKind
	}{
		{"no credentials anywhere", func(t *testing.T, _ fakeFailer) {
			// TestMain's config files are empty and IMDS is off, so with the
			// key variables unset the SDK's chain finds nothing.
			t.Setenv("AWS_ACCESS_KEY_ID", "")
			t.Setenv("AWS_SECRET_ACCESS_KEY", "")
		}, providers.KindAuth},
		{"expired session token", func(t *testing.T, f fakeFailer) {
			f.FailNext("DescribeInstanceTypeOfferings", "ExpiredToken", "The security token included in the request is expired", 1)
		}, providers.KindAuth},
		{"key not accepted", func(t *testing.T, f fakeFailer) {
			f.FailNext("DescribeInstanceTypeOfferings", "AuthFailure", "AWS was not able to validate the provided access credentials", 1)
		}, providers.KindAuth},
		{"throttled stays transient", func(t *testing.T, f fakeFailer) {
			f.FailNext("DescribeInstanceTypeOfferings", "RequestLimitExceeded", "Request limit exceeded.", 10)
		}, providers.KindTransient},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fake, url := newFake(t)
			tc.setup(t, fake)
			p := aws.New(testOptions())
			_, err := p.Offerings(ctxT(t), config(t, "f", baseBlock(url)))
			if got := providers.KindOf(err); got != tc.want {
				t.Fatalf("kind %q, want %q: %v", got, tc.want, err)
			}
			t.Log(err)
		})
	}
}

// fakeFailer is the part of the fake EC2 the cases use.
type fakeFailer interface {
	FailNext(action, code, message string, n int)
}
