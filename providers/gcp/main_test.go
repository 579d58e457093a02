package gcp_test

import (
	"encoding/json"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/gcp"
	"github.com/fleetd/fleetd/providers/gcp/fakegce"
	"github.com/fleetd/fleetd/providers/providertest"
)

// testPoll keeps operation polling fast against the fake, whose wait
// answers at once instead of blocking like the real one.
const testPoll = 5 * time.Millisecond

func TestMain(m *testing.M) {
	providertest.ServePluginIfRequested(map[string]func() providers.Provider{
		gcp.Name: func() providers.Provider { return gcp.New(gcp.Options{PollInterval: testPoll}) },
	})
	os.Exit(m.Run())
}

// fakes maps a fake's URL to it, so conformance hooks that only see a
// config can reach the fake behind it.
var fakes sync.Map

// newFake starts a fake GCE and returns it with a block pointing at it.
func newFake(t *testing.T, opts fakegce.Options, extra map[string]any) (*fakegce.Server, providers.Config) {
	t.Helper()
	f := fakegce.New(opts)
	t.Cleanup(f.Close)
	fakes.Store(f.URL, f)
	t.Cleanup(func() { fakes.Delete(f.URL) })
	return f, blockFor(t, f, extra)
}

func blockFor(t *testing.T, f *fakegce.Server, extra map[string]any) providers.Config {
	t.Helper()
	block := map[string]any{
		"project":       f.Project(),
		"zones":         []string{"us-central1-a", "us-central1-b"},
		"machine_types": []string{"a2-highgpu-1g", "g2-standard-8", "n1-standard-8"},
		"accelerators":  map[string]any{"type": "nvidia-tesla-t4", "count": 1},
		"image":         "projects/deeplearning-platform-release/global/images/family/pytorch-latest-gpu",
		"endpoint":      f.URL,
	}
	for k, v := range extra {
		if v == nil {
			delete(block, k)
			continue
		}
		block[k] = v
	}
	raw, err := json.Marshal(block)
	if err != nil {
		t.Fatal(err)
	}
	return providers.Config{Fleet: "conformance", Raw: raw}
}

func fakeOf(t *testing.T, cfg providers.Config) *fakegce.Server {
	t.Helper()
	var b struct {
		Endpoint string `json:"endpoint"`
	}
	if err := json.Unmarshal(cfg.Raw, &b); err != nil {
		t.Fatal(err)
	}
	f, ok := fakes.Load(b.Endpoint)
	if !ok {
		t.Fatalf("no fake at %q", b.Endpoint)
	}
	return f.(*fakegce.Server)
}

func newProvider() *gcp.Provider { return gcp.New(gcp.Options{PollInterval: testPoll}) }

// newTestProvider is the frame of most provider tests: a fake with its
// default zones, the config of a block on it, and a provider.
func newTestProvider(t *testing.T) (*fakegce.Server, *gcp.Provider, providers.Config) {
	f, cfg := newFake(t, fakegce.Options{}, nil)
	return f, newProvider(), cfg
}

// wantCreated checks how many instances the fake has created.
func wantCreated(t *testing.T, f *fakegce.Server, want int) {
	t.Helper()
	if n := f.Stats().InstancesCreated; n != want {
		t.Errorf("%d instances created, want %d", n, want)
	}
}
