package fleet

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/providertest"
)

// offeringsFailing is a provider whose market view fails with err.
type offeringsFailing struct {
	providers.Provider
	err error
}

func (o offeringsFailing) Offerings(ctx context.Context, cfg providers.Config) ([]providers.Offering, error) {
	return nil, o.err
}

// TestPlanFailsOnAuthErrors: a provider whose credentials fail makes plan
// fail with the cause, as a 424 (the daemon's credentials, not
// the caller's token); other offering errors stay notes on a plan that
// succeeds, since the market may come back. (apply -auto-approve meets bad
// credentials in its preflight, which already refuses.)
func TestPlanFailsOnAuthErrors(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		wantCode int // 0: the plan succeeds
		wantNote string
	}{
		{"expired credentials", providers.Errorf(providers.KindAuth, "ec2 DescribeInstanceTypes: api error ExpiredToken: the token is expired"), http.StatusFailedDependency, ""},
		{"throttled", providers.Errorf(providers.KindTransient, "ec2 DescribeInstanceTypes: throttled"), 0, "throttled"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mem := providertest.NewMemProvider()
			td := launchTestDaemon(t, t.TempDir(), staticProviders{providertest.MemName: offeringsFailing{mem, tc.err}}, mem, Options{})
			req := api.ApplyRequest{Filename: "train.hcl", Source: memSpec}
			p, err := td.client.Plan(context.Background(), req)
			if tc.wantCode == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(strings.Join(p.Fleets[0].Notes, "\n"), tc.wantNote) {
					t.Errorf("notes %q lack %q", p.Fleets[0].Notes, tc.wantNote)
				}
				return
			}
			var he *api.HTTPError
			if !errors.As(err, &he) || he.StatusCode != tc.wantCode {
				t.Fatalf("plan: %v, want HTTP %d", err, tc.wantCode)
			}
			for _, w := range []string{`fleet "train"`, "provider mem", "auth", "ExpiredToken", "fleetd check"} {
				if !strings.Contains(he.Body.Error, w) {
					t.Errorf("error %q lacks %q", he.Body.Error, w)
				}
			}
		})
	}
}
