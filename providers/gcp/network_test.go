package gcp_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/gcp/fakegce"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

type recorded struct{ method, path, body string }

// recordingProxy sits between the provider and the fake and keeps every
// request as sent, for golden files.
func recordingProxy(t *testing.T, f *fakegce.Server) (string, func() []recorded) {
	t.Helper()
	target, err := url.Parse(f.URL)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	var mu sync.Mutex
	var reqs []recorded
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		mu.Lock()
		reqs = append(reqs, recorded{r.Method, r.URL.RequestURI(), string(body)})
		mu.Unlock()
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	return ts.URL, func() []recorded {
		mu.Lock()
		defer mu.Unlock()
		return append([]recorded(nil), reqs...)
	}
}

func fastReq(off providers.Offering, node string) providers.LaunchRequest {
	req := launchReq(off, node)
	req.Tags[providers.TagIncarnation] = "k3x9"
	req.Network = providers.NetworkRequest{Fabric: true, Group: "fleetd-bert-k3x9",
		GroupTags: map[string]string{providers.TagFleet: "bert", providers.TagIncarnation: "k3x9", providers.TagDaemonID: "d1"}}
	return req
}

var gpuSubnets = []string{"gpu-1", "gpu-2", "gpu-3", "gpu-4"}

// TestFastLaunchA3Golden: the requests fleetd sends for an 8-node
// a3-highgpu-8g spot fleet on the fast network: the zone's compact
// placement policy looked up (absent) and inserted once, then 8 inserts,
// each with the 4 GPUDirect-TCPX NICs and the policy.
func TestFastLaunchA3Golden(t *testing.T) {
	f := fakegce.New(fakegce.Options{})
	t.Cleanup(f.Close)
	proxy, requests := recordingProxy(t, f)
	cfg := blockFor(t, f, map[string]any{"endpoint": proxy, "machine_types": []string{"a3-highgpu-8g"}, "accelerators": nil,
		"subnetwork": "mgmt", "gpu_subnetworks": gpuSubnets})
	p := newProvider()
	off := offering(t, p, cfg, "us-central1-a", "a3-highgpu-8g", providers.Spot)
	if want := (providers.NetworkInfo{Fabric: providers.FabricTCPX, Interfaces: 4, BandwidthGbps: 800}); off.Network != want {
		t.Fatalf("a3-highgpu-8g network %+v, want %+v", off.Network, want)
	}
	for i := 1; i <= 8; i++ {
		if _, err := p.Create(ctxT(t), cfg, fastReq(off, fmt.Sprintf("bert-k3x9-%d-abcd", i))); err != nil {
			t.Fatalf("launch %d: %v", i, err)
		}
	}
	var b strings.Builder
	var first map[string]any
	inserts := 0
	for _, r := range requests() {
		if !strings.Contains(r.path, "/resourcePolicies") && !(r.method == http.MethodPost && strings.HasSuffix(strings.Split(r.path, "?")[0], "/instances")) {
			continue
		}
		fmt.Fprintf(&b, "%s %s\n", r.method, r.path)
		if r.body == "" {
			continue
		}
		var body map[string]any
		if err := json.Unmarshal([]byte(r.body), &body); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(r.path, "/instances") {
			out, _ := json.MarshalIndent(body, "  ", "  ")
			fmt.Fprintf(&b, "  %s\n", out)
			continue
		}
		inserts++
		// Per node: name, description, labels, metadata (user data, tags).
		for _, k := range []string{"name", "description", "labels", "metadata"} {
			delete(body, k)
		}
		if first == nil {
			first = body
			out, _ := json.MarshalIndent(body, "  ", "  ")
			fmt.Fprintf(&b, "  %s\n", out)
			continue
		}
		a, _ := json.Marshal(first)
		c, _ := json.Marshal(body)
		if !bytes.Equal(a, c) {
			t.Errorf("insert %d differs from the first beyond the node's own fields:\n%s", inserts, c)
		}
		fmt.Fprintln(&b, "  (the first body, with this node's name, labels and metadata)")
	}
	if inserts != 8 {
		t.Errorf("%d inserts, want 8", inserts)
	}
	path := filepath.Join("testdata", "a3_spot_8_nodes.golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update)", err)
	}
	if string(want) != b.String() {
		t.Errorf("%s differs from what was sent (run with -update after checking):\n%s", path, b.String())
	}
	if pols := f.Policies(); len(pols) != 1 || pols["us-central1/fleetd-bert-k3x9-us-central1-a"].GroupPlacementPolicy.Collocation != "COLLOCATED" {
		t.Errorf("policies %+v", pols)
	}
}

func TestNetworkOfferingsNeedSubnets(t *testing.T) {
	_, cfg := newFake(t, fakegce.Options{}, map[string]any{"machine_types": []string{"a3-highgpu-8g", "a3-megagpu-8g"}, "accelerators": nil,
		"gpu_subnetworks": gpuSubnets, "prices": map[string]any{"a3-megagpu-8g": map[string]float64{"spot": 30, "on_demand": 90}}})
	p := newProvider()
	if n := offering(t, p, cfg, "us-central1-a", "a3-highgpu-8g", providers.Spot).Network; n.Fabric != providers.FabricTCPX {
		t.Errorf("a3-highgpu-8g with 4 GPU subnetworks: %+v", n)
	}
	// a3-megagpu-8g needs 8: without them it is a standard offering.
	if n := offering(t, p, cfg, "us-central1-a", "a3-megagpu-8g", providers.Spot).Network; n.Fast() {
		t.Errorf("a3-megagpu-8g with 4 GPU subnetworks: %+v, want none", n)
	}
}

func TestReleaseNetworkGCP(t *testing.T) {
	f, cfg := newFake(t, fakegce.Options{}, map[string]any{"machine_types": []string{"a3-highgpu-8g"}, "accelerators": nil, "gpu_subnetworks": gpuSubnets})
	p := newProvider()
	off := offering(t, p, cfg, "us-central1-a", "a3-highgpu-8g", providers.Spot)
	ins, err := p.Create(ctxT(t), cfg, fastReq(off, "n1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.ReleaseNetwork(ctxT(t), cfg, "fleetd-bert-k3x9"); !providers.IsTransient(err) {
		t.Fatalf("release with a member: %v, want transient", err)
	}
	f.Remove("us-central1-a", ins[0].ID[strings.LastIndex(ins[0].ID, "/")+1:])
	if err := p.ReleaseNetwork(ctxT(t), cfg, "fleetd-bert-k3x9"); err != nil {
		t.Fatalf("release: %v", err)
	}
	if len(f.Policies()) != 0 {
		t.Errorf("policies left %+v", f.Policies())
	}
}

func TestCheckNetworkGCP(t *testing.T) {
	f, cfg := newFake(t, fakegce.Options{}, map[string]any{"machine_types": []string{"a3-highgpu-8g", "a3-megagpu-8g"}, "accelerators": nil,
		"gpu_subnetworks": gpuSubnets, "prices": map[string]any{"a3-megagpu-8g": map[string]float64{"spot": 30, "on_demand": 90}}})
	p := newProvider()
	rows := func(network bool) map[string]providers.CheckResult {
		rs, err := p.Check(ctxT(t), cfg, providers.CheckOptions{Network: network})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]providers.CheckResult{}
		for _, r := range rs {
			out[r.Check] = r
		}
		return out
	}
	if _, ok := rows(false)["GPU NICs a3-highgpu-8g"]; ok {
		t.Error("GPU NIC rows without CheckOptions.Network")
	}
	rs := rows(true)
	if r := rs["GPU NICs a3-highgpu-8g"]; r.Status != providers.CheckOK || !strings.Contains(r.Detail, "gpudirect-tcpx ×4") {
		t.Errorf("a3-highgpu-8g row %+v", r)
	}
	if r := rs["GPU NICs a3-megagpu-8g"]; r.Status != providers.CheckFailed || !strings.Contains(r.Detail, "takes 8 GPU NICs") || !strings.Contains(r.Fix, "gpu_subnetworks") {
		t.Errorf("a3-megagpu-8g row %+v", r)
	}
	if r := rs["GPU subnetwork gpu-3"]; r.Status != providers.CheckFailed || !strings.Contains(r.Detail, "regions/us-central1/subnetworks/gpu-3 does not exist") {
		t.Errorf("missing GPU subnetwork row %+v", r)
	}
	for _, sn := range gpuSubnets {
		f.AddSubnetwork("us-central1", sn)
	}
	if r := rows(true)["GPU subnetwork gpu-3"]; r.Status != providers.CheckOK || !strings.Contains(r.Detail, "gpu-3-net") {
		t.Errorf("GPU subnetwork row once it exists %+v", r)
	}
	if r := rs["compact placement"]; r.Status != providers.CheckOK || !strings.Contains(r.Detail, "best-effort") {
		t.Errorf("compact placement row %+v", r)
	}
	// One compact policy per zone must fit in the region's quota.
	if r := rs["quota RESOURCE_POLICIES"]; r.Status != providers.CheckOK || !strings.Contains(r.Detail, "needs 2 (one per zone)") {
		t.Errorf("resource policy quota row %+v", r)
	}
	if _, ok := rows(false)["quota RESOURCE_POLICIES"]; ok {
		t.Error("resource policy quota row without CheckOptions.Network")
	}
	f.SetQuota("us-central1", "RESOURCE_POLICIES", 10, 10)
	if r := rows(true)["quota RESOURCE_POLICIES"]; r.Status != providers.CheckFailed || !strings.Contains(r.Fix, "resource-policies list") {
		t.Errorf("resource policy quota row with the quota used up %+v", r)
	}
	// The policy permissions are tested too: four more than without.
	var without, with int
	fmt.Sscanf(rows(false)["permissions"].Detail, "all %d permissions", &without)
	fmt.Sscanf(rs["permissions"].Detail, "all %d permissions", &with)
	if without == 0 || with != without+4 {
		t.Errorf("permissions tested: %d with the fast network, %d without; want 4 more (compute.resourcePolicies.*)", with, without)
	}
}
