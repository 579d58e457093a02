package aws_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/aws"
	"github.com/fleetd/fleetd/providers/aws/fakeec2"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

// recorder is an EC2 endpoint in front of a fake that keeps every request
// as sent on the wire (the Query form), for golden files.
type recorder struct {
	fake  *fakeec2.Server
	mu    sync.Mutex
	reqs  []url.Values
	resps map[int]string // index in reqs → response body of a 200
	url   string
}

func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	v, err := url.ParseQuery(string(body))
	req.Body = io.NopCloser(bytes.NewReader(body))
	rec := httptest.NewRecorder()
	r.fake.ServeHTTP(rec, req)
	if err == nil && firstAttempt(req) {
		r.mu.Lock()
		r.reqs = append(r.reqs, v)
		if rec.Code == http.StatusOK {
			if r.resps == nil {
				r.resps = map[int]string{}
			}
			r.resps[len(r.reqs)-1] = rec.Body.String()
		}
		r.mu.Unlock()
	}
	for k, vs := range rec.Header() {
		w.Header()[k] = vs
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes())
}

// firstAttempt reports whether a request is the SDK's first attempt at a
// call. A later one is the same request again, not one more fleetd made:
// against the fake's instant answers the client's transport now and then
// ends its write of a request in an error after the answer came, closes
// the connection under a large answer's body, and the SDK retries.
func firstAttempt(req *http.Request) bool {
	attempt, _, _ := strings.Cut(strings.TrimPrefix(req.Header.Get("Amz-Sdk-Request"), "attempt="), ";")
	return attempt == "" || attempt == "1"
}

// shapeProblems checks every recorded request of the given actions, and
// its response, against botocore's ec2 service model
// (testdata/ec2_shapes.py, run by the machine image's python3, where the
// aws CLI and moto install botocore).
func (r *recorder) shapeProblems(t *testing.T, actions ...string) string {
	t.Helper()
	type req struct {
		Action string            `json:"action"`
		Params map[string]string `json:"params"`
	}
	type resp struct {
		Action string `json:"action"`
		XML    string `json:"xml"`
	}
	var in struct {
		Requests  []req  `json:"requests"`
		Responses []resp `json:"responses"`
	}
	r.mu.Lock()
	for i, v := range r.reqs {
		a := v.Get("Action")
		if !slices.Contains(actions, a) {
			continue
		}
		p := map[string]string{}
		for k := range v {
			p[k] = v.Get(k)
		}
		in.Requests = append(in.Requests, req{a, p})
		if body, ok := r.resps[i]; ok {
			in.Responses = append(in.Responses, resp{a, body})
		}
	}
	r.mu.Unlock()
	if len(in.Requests) == 0 {
		t.Fatalf("no %v requests recorded", actions)
	}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("python3", filepath.Join("testdata", "ec2_shapes.py"))
	cmd.Stdin = bytes.NewReader(b)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("python3 (with botocore, from the aws CLI/moto install): %v", err)
	}
	if err != nil && ee.ExitCode() != 1 {
		t.Fatalf("ec2_shapes.py: %v\n%s", err, out)
	}
	return string(out)
}

func (r *recorder) requests(actions ...string) []url.Values {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []url.Values
	for _, v := range r.reqs {
		if slices.Contains(actions, v.Get("Action")) {
			out = append(out, v)
		}
	}
	return out
}

func newRecordedFake(t *testing.T) (*fakeec2.Server, *recorder, string) {
	t.Helper()
	fake, _ := newFake(t)
	rec := &recorder{fake: fake}
	ts := httptest.NewServer(rec)
	t.Cleanup(ts.Close)
	rec.url = ts.URL
	return fake, rec, ts.URL
}

// render prints a request as "Key=Value" lines in key order; UserData is
// shown by length, it is covered by the bootstrap tests.
func render(v url.Values, skip ...string) string {
	keys := make([]string, 0, len(v))
	for k := range v {
		if k == "Version" || slices.Contains(skip, k) {
			continue
		}
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return naturalLess(keys[i], keys[j]) })
	var b strings.Builder
	for _, k := range keys {
		val := v.Get(k)
		if k == "UserData" {
			val = fmt.Sprintf("<%d base64 bytes>", len(val))
		}
		fmt.Fprintf(&b, "  %s=%s\n", k, val)
	}
	return b.String()
}

// naturalLess orders "NetworkInterface.2" before "NetworkInterface.10".
func naturalLess(a, b string) bool {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(pa) && i < len(pb); i++ {
		if pa[i] == pb[i] {
			continue
		}
		var na, nb int
		_, ea := fmt.Sscanf(pa[i], "%d", &na)
		_, eb := fmt.Sscanf(pb[i], "%d", &nb)
		if ea == nil && eb == nil && fmt.Sprint(na) == pa[i] && fmt.Sprint(nb) == pb[i] {
			return na < nb
		}
		return pa[i] < pb[i]
	}
	return len(pa) < len(pb)
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if string(want) != got {
		t.Errorf("%s differs from what was sent (run with -update after checking):\n%s", path, got)
	}
}

func fastRequest(node string) providers.LaunchRequest {
	tags := nodeTags("bert", node)
	tags[providers.TagIncarnation] = "k3x9"
	return providers.LaunchRequest{Count: 1, UserData: "#cloud-config\n{}\n", Tags: tags, IdempotencyToken: "d-test." + node,
		Network: providers.NetworkRequest{Fabric: true, Group: "fleetd-bert-k3x9",
			GroupTags: map[string]string{providers.TagFleet: "bert", providers.TagDaemonID: "d-test", providers.TagIncarnation: "k3x9"}}}
}

// bertOfferings is a provider, the block of fleet "bert" with these
// instance types at the fake at url, and the block's offerings.
func bertOfferings(t *testing.T, url string, types ...string) (*aws.Provider, providers.Config, []providers.Offering) {
	t.Helper()
	p := aws.New(testOptions())
	cfg := config(t, "bert", with(baseBlock(url), "instance_types", types))
	offs, err := p.Offerings(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p, cfg, offs
}

func TestNetworkOfferings(t *testing.T) {
	_, url := newFake(t)
	p := aws.New(testOptions())
	offs, err := p.Offerings(ctxT(t), config(t, "f", with(baseBlock(url), "instance_types", []string{"p4d.24xlarge", "p5.48xlarge", "g5.xlarge"})))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		typ  string
		want providers.NetworkInfo
	}{
		{"p4d.24xlarge", providers.NetworkInfo{Fabric: providers.FabricEFA, Interfaces: 4, BandwidthGbps: 400}},
		{"p5.48xlarge", providers.NetworkInfo{Fabric: providers.FabricEFA, Interfaces: 32, BandwidthGbps: 3200}},
		{"g5.xlarge", providers.NetworkInfo{}},
	} {
		for _, ct := range []providers.CapacityType{providers.Spot, providers.OnDemand} {
			if got := find(t, offs, "us-east-1a", c.typ, ct).Network; got != c.want {
				t.Errorf("%s %s network %+v, want %+v", c.typ, ct, got, c.want)
			}
		}
	}
}

// TestFastLaunchP5Golden: the requests fleetd sends for an 8-node p5 spot
// fleet on the fast network: the zone's cluster placement group described
// (unknown), created with the incarnation's tags, then 8 RunInstances,
// each with 32 EFA interfaces in the zone's subnet and the group.
func TestFastLaunchP5Golden(t *testing.T) {
	fake, rec, url := newRecordedFake(t)
	p, cfg, offs := bertOfferings(t, url, "p5.48xlarge")
	off := find(t, offs, "us-east-1a", "p5.48xlarge", providers.Spot)
	for i := 1; i <= 8; i++ {
		req := fastRequest(fmt.Sprintf("bert-k3x9-%d-abcd", i))
		req.Offering = off
		if _, err := p.Create(ctxT(t), cfg, req); err != nil {
			t.Fatalf("launch %d: %v", i, err)
		}
	}
	var b strings.Builder
	runs := rec.requests("RunInstances")
	for _, v := range rec.requests("DescribePlacementGroups", "CreatePlacementGroup", "RunInstances") {
		if v.Get("Action") == "RunInstances" && v.Get("ClientToken") != runs[0].Get("ClientToken") {
			continue
		}
		fmt.Fprintf(&b, "%s\n%s\n", v.Get("Action"), render(v, "Action"))
	}
	// The other 7 differ from the first only in their node's token and tags.
	for _, v := range runs[1:] {
		var diff []string
		for k := range v {
			if v.Get(k) != runs[0].Get(k) {
				diff = append(diff, k)
			}
		}
		for k := range runs[0] {
			if !v.Has(k) {
				diff = append(diff, k+" (missing)")
			}
		}
		sort.Strings(diff)
		fmt.Fprintf(&b, "RunInstances for %s differs in: %s\n", v.Get("ClientToken"), strings.Join(diff, ", "))
	}
	golden(t, "p5_spot_8_nodes.golden", b.String())
	if n := len(rec.requests("CreatePlacementGroup")); n != 1 {
		t.Errorf("%d CreatePlacementGroup calls, want 1 (the group is reused)", n)
	}
	if n := len(rec.requests("DescribePlacementGroups")); n != 1 {
		t.Errorf("%d DescribePlacementGroups calls, want 1 (known groups are remembered)", n)
	}
	live := fake.Live()
	if len(live) != 8 {
		t.Fatalf("%d instances, want 8", len(live))
	}
	for _, in := range live {
		if in.PlacementGroup != "fleetd-bert-k3x9-us-east-1a" || len(in.Interfaces) != 32 || in.Interfaces[0] != "0/0:efa" || in.Interfaces[31] != "31/0:efa-only" || in.SubnetID != "subnet-0aaa1111" {
			t.Errorf("instance %s: group %q, subnet %s, %d interfaces %v", in.ID, in.PlacementGroup, in.SubnetID, len(in.Interfaces), in.Interfaces[:min(2, len(in.Interfaces))])
		}
	}
	groups := fake.PlacementGroups()
	if len(groups) != 1 || groups[0].Strategy != "cluster" || groups[0].Zone != "us-east-1a" || groups[0].Tags[aws.TagNetworkGroup] != "fleetd-bert-k3x9" || groups[0].Tags[providers.TagIncarnation] != "k3x9" {
		t.Errorf("placement groups %+v", groups)
	}

	// Every request and response of the fast path, as botocore's ec2
	// model describes them (a release of another incarnation's groups
	// adds a filtered DescribePlacementGroups).
	if _, err := p.Offerings(ctxT(t), config(t, "bert2", with(baseBlock(rec.url), "instance_types", []string{"p4d.24xlarge"}))); err != nil {
		t.Fatal(err)
	}
	if err := p.ReleaseNetwork(ctxT(t), cfg, "fleetd-bert-other"); err != nil {
		t.Fatal(err)
	}
	if probs := rec.shapeProblems(t, "DescribePlacementGroups", "CreatePlacementGroup", "RunInstances", "DescribeInstanceTypes", "DeletePlacementGroup"); probs != "" {
		t.Errorf("requests or responses that botocore's ec2 model does not describe:\n%s", probs)
	}

}

// TestPlacementGroupCapacity: a full cluster group answers
// InsufficientInstanceCapacity, which is a capacity error about the
// offering (placement backs it off and moves), and the same offering
// launches without the group ("auto"'s fallback).
func TestPlacementGroupCapacity(t *testing.T) {
	fake, url := newFake(t)
	p, cfg, offs := bertOfferings(t, url, "p4d.24xlarge")
	off := find(t, offs, "us-east-1b", "p4d.24xlarge", providers.Spot)
	fake.SetGroupCapacity("fleetd-bert-k3x9-us-east-1b", 1)
	req := fastRequest("n1")
	req.Offering = off
	if _, err := p.Create(ctxT(t), cfg, req); err != nil {
		t.Fatal(err)
	}
	req = fastRequest("n2")
	req.Offering = off
	_, err := p.Create(ctxT(t), cfg, req)
	var pe *providers.Error
	if !providers.IsCapacity(err) || !errors.As(err, &pe) || pe.Offering != off.Key() || pe.Code != "InsufficientInstanceCapacity" {
		t.Fatalf("launch into a full group: %v, want a capacity error for %s", err, off.Key())
	}
	req = fastRequest("n3")
	req.Offering, req.Network.Group, req.Network.GroupTags = off, "", nil
	ins, err := p.Create(ctxT(t), cfg, req)
	if err != nil {
		t.Fatalf("launch without the group: %v", err)
	}
	for _, in := range fake.Live() {
		if in.ID == ins[0].ID && (in.PlacementGroup != "" || len(in.Interfaces) != 4) {
			t.Errorf("fallback launch: group %q, interfaces %v", in.PlacementGroup, in.Interfaces)
		}
	}
}

func TestFastLaunchRules(t *testing.T) {
	_, url := newFake(t)
	p, cfg, offs := bertOfferings(t, url, "p4d.24xlarge", "g5.xlarge")
	// A type without EFA cannot be launched with the fabric.
	req := fastRequest("n1")
	req.Offering = find(t, offs, "us-east-1a", "g5.xlarge", providers.Spot)
	if _, err := p.Create(ctxT(t), cfg, req); !providers.IsInvalidConfig(err) {
		t.Errorf("EFA launch of g5.xlarge: %v, want invalid-config", err)
	}
	// EFA interfaces need the zone's subnet.
	noSubnets := config(t, "bert", with(baseBlock(url), "instance_types", []string{"p4d.24xlarge"}, "subnets", map[string]string{}))
	offs2, err := p.Offerings(ctxT(t), noSubnets)
	if err != nil {
		t.Fatal(err)
	}
	req = fastRequest("n2")
	req.Offering = find(t, offs2, "us-east-1c", "p4d.24xlarge", providers.Spot)
	if req.Offering.Network.Fast() {
		t.Errorf("p4d in a zone without a subnet offers %+v; EFA interfaces need the zone's subnet", req.Offering.Network)
	}
	req.Offering.Network = find(t, offs, "us-east-1a", "p4d.24xlarge", providers.Spot).Network // a stale offering
	if _, err := p.Create(ctxT(t), noSubnets, req); !providers.IsInvalidConfig(err) || !strings.Contains(err.Error(), "subnets") {
		t.Errorf("EFA launch without a subnet: %v", err)
	}
}

func TestReleaseNetwork(t *testing.T) {
	fake, rec, url := newRecordedFake(t)
	p, cfg, offs := bertOfferings(t, url, "p4d.24xlarge")
	var ids []string
	for i, z := range []string{"us-east-1a", "us-east-1b", "us-west-2a"} {
		req := fastRequest(fmt.Sprintf("n%d", i))
		req.Offering = find(t, offs, z, "p4d.24xlarge", providers.Spot)
		ins, err := p.Create(ctxT(t), cfg, req)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, ins[0].ID)
	}
	// Another incarnation's group is not ours to delete.
	other := fastRequest("other")
	other.Network.Group = "fleetd-bert-zzzz"
	other.Offering = find(t, offs, "us-east-1a", "p4d.24xlarge", providers.OnDemand)
	if _, err := p.Create(ctxT(t), cfg, other); err != nil {
		t.Fatal(err)
	}
	if len(fake.PlacementGroups()) != 4 {
		t.Fatalf("groups %+v", fake.PlacementGroups())
	}
	if err := p.ReleaseNetwork(ctxT(t), cfg, "fleetd-bert-k3x9"); !providers.IsTransient(err) {
		t.Fatalf("release with live members: %v, want transient", err)
	}
	for _, id := range ids {
		if err := p.Delete(ctxT(t), cfg, id); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Get(ctxT(t), cfg, id); err != nil && !providers.IsNotFound(err) {
			t.Fatal(err) // observed once: shutting-down → terminated
		}
	}
	if err := p.ReleaseNetwork(ctxT(t), cfg, "fleetd-bert-k3x9"); err != nil {
		t.Fatalf("release: %v", err)
	}
	if err := p.ReleaseNetwork(ctxT(t), cfg, "fleetd-bert-k3x9"); err != nil {
		t.Fatalf("second release: %v", err)
	}
	if g := fake.PlacementGroups(); len(g) != 1 || g[0].Name != "fleetd-bert-zzzz-us-east-1a" {
		t.Errorf("groups left %+v, want only the other incarnation's", g)
	}
	if probs := rec.shapeProblems(t, "DescribePlacementGroups", "DeletePlacementGroup"); probs != "" {
		t.Errorf("requests or responses that botocore's ec2 model does not describe:\n%s", probs)
	}
}
