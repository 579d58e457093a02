package aws_test

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/aws"
	"github.com/fleetd/fleetd/providers/aws/fakeec2"
	"github.com/fleetd/fleetd/providers/aws/motoserver"
	"github.com/fleetd/fleetd/providers/providertest"
)

// testAccessKey is the static access key every test request is signed with.
const testAccessKey = "AKIAFLEETDTEST000001"

// TestMain pins the SDK's credential chain to static keys and keeps it off
// the instance metadata service and the user's ~/.aws, so no test request
// ever leaves loopback.
func TestMain(m *testing.M) {
	// A plugin subprocess runs with the test's environment, already pinned;
	// it serves and exits here, without a directory of its own to leave.
	providertest.ServePluginIfRequested(map[string]func() providers.Provider{
		aws.Name: func() providers.Provider { return aws.New(testOptions()) },
	})
	dir, err := os.MkdirTemp("", "fleetd-aws-test")
	if err != nil {
		panic(err)
	}
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID":           testAccessKey,
		"AWS_SECRET_ACCESS_KEY":       "fleetd-test-secret",
		"AWS_EC2_METADATA_DISABLED":   "true",
		"AWS_CONFIG_FILE":             filepath.Join(dir, "config"),
		"AWS_SHARED_CREDENTIALS_FILE": filepath.Join(dir, "credentials"),
	} {
		os.Setenv(k, v)
	}
	for _, k := range []string{"AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION",
		"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_EC2", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
		"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE"} {
		os.Unsetenv(k)
	}
	code := m.Run()
	if err := motoserver.CloseShared(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// testOptions keep the SDK's retries and Delete's consistency retries
// short; everything else is production behaviour.
func testOptions() aws.Options {
	return aws.Options{RetryMaxAttempts: 3, RetryMaxBackoff: 20 * time.Millisecond, ConsistencyRetryDelay: 10 * time.Millisecond}
}

// fakes maps a fake's URL to the fake, so conformance hooks that only see
// a config can reach the server behind its endpoint.
var fakes sync.Map

// Zones of the test regions; us-east-1c and us-west-2b have no subnet.
var testRegions = map[string][]string{
	"us-east-1": {"us-east-1a", "us-east-1b", "us-east-1c"},
	"us-west-2": {"us-west-2a", "us-west-2b"},
}

var testSubnets = map[string]string{
	"us-east-1a": "subnet-0aaa1111",
	"us-east-1b": "subnet-0bbb2222",
	"us-west-2a": "subnet-0ccc3333",
}

// newFake starts a fake EC2 endpoint on loopback with the test subnets.
func newFake(t *testing.T) (*fakeec2.Server, string) {
	t.Helper()
	fake := fakeec2.New(fakeec2.Options{Regions: testRegions})
	for z, sn := range testSubnets {
		fake.AddSubnet(sn, z)
	}
	for region := range testRegions {
		fake.AddSecurityGroup(region, "sg-0123456789abcdef0")
	}
	ts := httptest.NewServer(fake)
	t.Cleanup(ts.Close)
	fakes.Store(ts.URL, fake)
	t.Cleanup(func() { fakes.Delete(ts.URL) })
	return fake, ts.URL
}

func fakeOf(t *testing.T, cfg providers.Config) *fakeec2.Server {
	t.Helper()
	f, ok := fakes.Load(endpointOf(t, cfg))
	if !ok {
		t.Fatalf("no fake behind %q", endpointOf(t, cfg))
	}
	return f.(*fakeec2.Server)
}

// baseBlock is a complete provider block pointed at endpoint.
// newTestProvider is the frame of most provider tests: a fake, a provider
// and the config of fleet "f" over the base block.
func newTestProvider(t *testing.T) (*fakeec2.Server, *aws.Provider, providers.Config) {
	fake, url := newFake(t)
	return fake, aws.New(testOptions()), config(t, "f", baseBlock(url))
}

// g5Spot is the spot g5.xlarge offering of zone.
func g5Spot(zone string) providers.Offering {
	return providers.Offering{Provider: aws.Name, Region: zone[:len(zone)-1], Zone: zone, InstanceType: "g5.xlarge", CapacityType: providers.Spot}
}

func baseBlock(endpoint string) map[string]any {
	return map[string]any{
		"regions":          []string{"us-east-1", "us-west-2"},
		"instance_types":   []string{"p4d.24xlarge", "g5.xlarge"},
		"image":            "ami-0123456789abcdef0",
		"image_per_region": map[string]string{"us-west-2": "ami-0fedcba9876543210"},
		"subnets":          testSubnets,
		"security_groups":  []string{"sg-0123456789abcdef0"},
		"instance_profile": "fleetd-node",
		"endpoint":         endpoint,
	}
}

func config(t *testing.T, fleet string, block map[string]any) providers.Config {
	t.Helper()
	raw, err := json.Marshal(block)
	if err != nil {
		t.Fatal(err)
	}
	return providers.Config{Fleet: fleet, Raw: raw}
}

// with returns a copy of block with the given attributes set.
func with(block map[string]any, kv ...any) map[string]any {
	out := map[string]any{}
	for k, v := range block {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}
