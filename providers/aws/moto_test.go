package aws_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/aws"
	"github.com/fleetd/fleetd/providers/aws/motoserver"
	"github.com/fleetd/fleetd/providers/providertest"
)

// The moto tests run the provider against moto_server, an AWS emulator
// nobody here wrote, as a second opinion beside fakeec2. One server serves
// the whole test binary (motoserver.Shared, closed by TestMain) with one
// world, so tests scope what they look at by tags or ids.

// motoWorld is the shared world: a network per region and an instance
// profile, made once.
type motoWorld struct {
	srv     *motoserver.Server
	nets    map[string]motoserver.Network // region → network
	subnets map[string]string             // zone → subnet, as testSubnets
}

// motoProfile is the instance profile the blocks name; moto checks
// RunInstances' IamInstanceProfile against its IAM.
const motoProfile = "fleetd-node"

var motoSetup struct {
	once  sync.Once
	world motoWorld
	err   error
}

// moto returns the shared world, starting moto on first use.
func moto(t *testing.T) motoWorld {
	t.Helper()
	srv := motoserver.Shared(t)
	motoSetup.once.Do(func() {
		ctx := ctxT(t)
		w := motoWorld{srv: srv, nets: map[string]motoserver.Network{}, subnets: map[string]string{}}
		// Subnets in the zones of testSubnets: us-east-1c, which moto
		// also offers, stays without one.
		for region, zones := range map[string][]string{"us-east-1": {"us-east-1a", "us-east-1b"}, "us-west-2": {"us-west-2a"}} {
			n, err := srv.SetupNetwork(ctx, region, zones)
			if err != nil {
				motoSetup.err = err
				return
			}
			w.nets[region] = n
			for z, sn := range n.Subnets {
				w.subnets[z] = sn
			}
		}
		if _, err := srv.CreateInstanceProfile(ctx, motoProfile); err != nil {
			motoSetup.err = err
			return
		}
		motoSetup.world = w
	})
	if motoSetup.err != nil {
		t.Fatalf("moto world: %v", motoSetup.err)
	}
	return motoSetup.world
}

// block is a complete provider block for the moto world; security group
// ids are regional, hence security_groups_per_region for us-west-2.
func (w motoWorld) block() map[string]any {
	return map[string]any{
		"regions":                    []string{"us-east-1", "us-west-2"},
		"instance_types":             []string{"p4d.24xlarge", "g5.xlarge"},
		"image":                      w.nets["us-east-1"].Image,
		"image_per_region":           map[string]string{"us-west-2": w.nets["us-west-2"].Image},
		"subnets":                    w.subnets,
		"security_groups":            []string{w.nets["us-east-1"].SecurityGroup},
		"security_groups_per_region": map[string][]string{"us-west-2": {w.nets["us-west-2"].SecurityGroup}},
		"instance_profile":           motoProfile,
		"endpoint":                   w.srv.URL(),
		"sqs_endpoint":               w.srv.URL(),
	}
}

// motoConformanceOptions: capacity and quota errors cannot be provoked in
// moto (it has neither), so those hooks stay nil.
func motoConformanceOptions(t *testing.T, w motoWorld) providertest.Options {
	return providertest.Options{
		InvalidConfig: func(cfg providers.Config) providers.Config {
			return config(t, cfg.Fleet, with(w.block(), "no_such_attribute", true))
		},
		Skip: map[string]string{
			"CreateIsIdempotent": "moto does not honour ClientToken; covered against the in-repo fake",
		},
	}
}

func TestConformanceMoto(t *testing.T) {
	w := moto(t)
	providertest.Run(t, func(t *testing.T) (providers.Provider, providers.Config) {
		return aws.New(testOptions()), config(t, "conformance-moto", w.block())
	}, motoConformanceOptions(t, w))
}

func TestConformanceMotoOverGRPC(t *testing.T) {
	w := moto(t)
	providertest.RunOverGRPC(t, aws.Name, func(t *testing.T) providers.Config {
		return config(t, "conformance-moto", w.block())
	}, motoConformanceOptions(t, w))
}

// TestMotoPermissionDenied runs the provider with credentials of an IAM
// user whose policy lacks permissions, with moto enforcing IAM: a denied
// launch or terminate is an invalid-config error (never a silent success),
// a denied DescribeInstanceTypeOfferings falls back to the spot price
// zones, and denied placement scores become a note.
func TestMotoPermissionDenied(t *testing.T) {
	w := moto(t)
	ctx := ctxT(t)
	const describeAll = `{"Effect":"Allow","Action":"ec2:Describe*","Resource":"*"}`
	users := map[string]string{
		"describe-only": `{"Version":"2012-10-17","Statement":[` + describeAll + `]}`,
		"no-type-offerings": `{"Version":"2012-10-17","Statement":[` + describeAll +
			`,{"Effect":"Allow","Action":["ec2:RunInstances","ec2:CreateTags","ec2:TerminateInstances"],"Resource":"*"}` +
			`,{"Effect":"Deny","Action":"ec2:DescribeInstanceTypeOfferings","Resource":"*"}]}`,
	}
	var profiles strings.Builder
	for name, policy := range users {
		creds, err := w.srv.CreateUser(ctx, "fleetd-"+name+"-"+randSuffix(), policy)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&profiles, "[%s]\naws_access_key_id = %s\naws_secret_access_key = %s\n", name, creds.AccessKeyID, creds.SecretAccessKey)
	}
	credsFile := filepath.Join(t.TempDir(), "credentials")
	if err := os.WriteFile(credsFile, []byte(profiles.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", credsFile)

	// An instance to fail to terminate, launched while any key works.
	admin := aws.New(testOptions())
	adminCfg := config(t, "denied", w.block())
	offs, err := admin.Offerings(ctx, adminCfg)
	if err != nil {
		t.Fatal(err)
	}
	victim, err := admin.Create(ctx, adminCfg, providers.LaunchRequest{
		Offering: find(t, offs, "us-east-1a", "g5.xlarge", providers.OnDemand), Count: 1, Tags: nodeTags("denied", "victim"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := admin.Delete(context.Background(), adminCfg, victim[0].ID); err != nil {
			t.Errorf("cleanup: Delete %s: %v", victim[0].ID, err)
		}
	})

	if err := w.srv.EnforceIAM(ctx, 0); err != nil {
		t.Fatal(err)
	}
	// Before the cleanups above, which need any key to work again.
	t.Cleanup(func() {
		if err := w.srv.DisableIAM(context.Background()); err != nil {
			t.Errorf("DisableIAM: %v", err)
		}
	})

	tests := []struct {
		name    string
		profile string
		check   func(t *testing.T, p *aws.Provider, cfg providers.Config)
	}{
		{"launch denied", "describe-only", func(t *testing.T, p *aws.Provider, cfg providers.Config) {
			offs, err := p.Offerings(ctxT(t), cfg)
			if err != nil {
				t.Fatalf("Offerings with ec2:Describe*: %v", err)
			}
			spot := find(t, offs, "us-east-1a", "g5.xlarge", providers.Spot)
			if !strings.Contains(spot.PlacementScoreNote, "denied (AccessDenied)") {
				t.Errorf("placement score note %q, want it to say the call was denied", spot.PlacementScoreNote)
			}
			ins, err := p.Create(ctxT(t), cfg, providers.LaunchRequest{Offering: spot, Count: 1, Tags: nodeTags("denied", "n1")})
			if !providers.IsInvalidConfig(err) || len(ins) != 0 {
				t.Errorf("Create without ec2:RunInstances: %d instances, %v; want an invalid-config error", len(ins), err)
			}
			if err := p.Delete(ctxT(t), cfg, victim[0].ID); !providers.IsInvalidConfig(err) {
				t.Errorf("Delete without ec2:TerminateInstances: %v, want an invalid-config error", err)
			}
			if got, err := p.Get(ctxT(t), cfg, victim[0].ID); err != nil || got.State == providers.StateTerminated {
				t.Errorf("Get after a denied Delete: %v, %v; want it still alive", got.State, err)
			}
		}},
		{"type offerings denied", "no-type-offerings", func(t *testing.T, p *aws.Provider, cfg providers.Config) {
			offs, err := p.Offerings(ctxT(t), cfg)
			if err != nil {
				t.Fatalf("Offerings without ec2:DescribeInstanceTypeOfferings: %v", err)
			}
			if got, want := offeringKeys(offs), offeringKeys(mustOfferings(t, admin, adminCfg)); !slices.Equal(got, want) {
				t.Errorf("offerings from spot price zones %v, want %v", got, want)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.check(t, aws.New(testOptions()), config(t, "denied", with(w.block(), "profile", tc.profile)))
		})
	}
}

func mustOfferings(t *testing.T, p *aws.Provider, cfg providers.Config) []providers.Offering {
	t.Helper()
	offs, err := p.Offerings(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return offs
}

func offeringKeys(offs []providers.Offering) []string {
	var keys []string
	for _, o := range offs {
		keys = append(keys, o.Key())
	}
	slices.Sort(keys)
	return keys
}

// randSuffix keeps IAM user names unique on the shared server.
func randSuffix() string { return strconv.FormatInt(time.Now().UnixNano(), 36) }
