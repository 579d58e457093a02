package aws_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleetd/internal/testutil"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/aws"
	"github.com/fleetd/fleetd/providers/aws/fakeec2"
)

func ctxT(t *testing.T) context.Context { return testutil.Context(t, 20*time.Second) }

func find(t *testing.T, offs []providers.Offering, zone, typ string, ct providers.CapacityType) providers.Offering {
	t.Helper()
	for _, o := range offs {
		if o.Zone == zone && o.InstanceType == typ && o.CapacityType == ct {
			return o
		}
	}
	t.Fatalf("no offering %s %s %s in %d offerings", zone, typ, ct, len(offs))
	return providers.Offering{}
}

func nodeTags(fleet, node string) map[string]string {
	return map[string]string{providers.TagFleet: fleet, providers.TagNodeID: node, providers.TagDaemonID: "d-test"}
}

func approx(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestOfferings(t *testing.T) {
	_, url := newFake(t)
	p := aws.New(testOptions())
	block := with(baseBlock(url),
		"instance_types", []string{"p4d.24xlarge", "g5.xlarge", "m5.large"},
		"on_demand_prices", map[string]float64{"g5.xlarge": 0.99})
	offs, err := p.Offerings(ctxT(t), config(t, "f", block))
	if err != nil {
		t.Fatal(err)
	}
	var zones []string
	for _, o := range offs {
		if !slices.Contains(zones, o.Zone) {
			zones = append(zones, o.Zone)
		}
	}
	sort.Strings(zones)
	if want := []string{"us-east-1a", "us-east-1b", "us-west-2a"}; !slices.Equal(zones, want) {
		t.Errorf("zones %v, want %v (zones without a subnet are skipped)", zones, want)
	}

	p4d := find(t, offs, "us-east-1b", "p4d.24xlarge", providers.Spot)
	// The fake seeds an hour-old price 20 % higher and a current one
	// (9.83 × 1.05 in the second zone): the current one must win.
	if !approx(p4d.PricePerHour, 10.3215) {
		t.Errorf("p4d spot price in us-east-1b = %v, want the latest 10.3215", p4d.PricePerHour)
	}
	if p4d.GPUs != 8 || p4d.GPUType != "A100" || p4d.VCPUs != 96 || p4d.MemoryGiB != 1152 || p4d.Region != "us-east-1" || p4d.Available != -1 {
		t.Errorf("p4d offering shape %+v", p4d)
	}
	if od := find(t, offs, "us-west-2a", "p4d.24xlarge", providers.OnDemand); !approx(od.PricePerHour, 32.7726) {
		t.Errorf("p4d on-demand = %v, want the bundled 32.7726", od.PricePerHour)
	}
	if od := find(t, offs, "us-east-1a", "g5.xlarge", providers.OnDemand); !approx(od.PricePerHour, 0.99) || od.GPUType != "A10G" || od.GPUs != 1 {
		t.Errorf("g5.xlarge on-demand = %+v, want the on_demand_prices override 0.99", od)
	}
	// m5.large is in no price table and not overridden: spot only.
	find(t, offs, "us-east-1a", "m5.large", providers.Spot)
	for _, o := range offs {
		if o.InstanceType == "m5.large" && o.CapacityType == providers.OnDemand {
			t.Errorf("on-demand offering %s without a known price", o.Key())
		}
	}
	// 3 zones × 3 types × 2 capacity types, minus m5.large on-demand in 3 zones.
	if len(offs) != 15 {
		t.Errorf("%d offerings, want 15", len(offs))
	}
}

func TestOfferingsCacheAndPagination(t *testing.T) {
	fake, url := newFake(t)
	fake.SetPageSize(2) // every Describe call pages
	var mu sync.Mutex
	now := time.Now()
	opts := testOptions()
	opts.Now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	p := aws.New(opts)
	cfg := config(t, "f", with(baseBlock(url), "regions", []string{"us-east-1"}))

	offs, err := p.Offerings(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(offs) != 8 { // 2 zones × 2 types × 2 capacity types
		t.Fatalf("%d offerings, want 8", len(offs))
	}
	spotCalls, typeCalls := fake.Calls("DescribeSpotPriceHistory"), fake.Calls("DescribeInstanceTypes")
	// 2 types × 3 zones = 6 current prices in pages of 2; 2 types in 1 page.
	if spotCalls != 3 || typeCalls != 1 {
		t.Errorf("calls: spot price history %d (want 3 pages), instance types %d (want 1)", spotCalls, typeCalls)
	}

	fake.SetSpotPrice("us-east-1a", "g5.xlarge", 0.25, time.Now())
	if _, err := p.Offerings(ctxT(t), cfg); err != nil {
		t.Fatal(err)
	}
	if got := fake.Calls("DescribeSpotPriceHistory"); got != spotCalls {
		t.Errorf("prices refetched within the TTL (%d calls, want %d)", got, spotCalls)
	}

	mu.Lock()
	now = now.Add(aws.DefaultSpotPriceTTL + time.Second)
	mu.Unlock()
	offs, err = p.Offerings(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if fake.Calls("DescribeSpotPriceHistory") == spotCalls {
		t.Error("prices not refetched after the TTL")
	}
	if fake.Calls("DescribeInstanceTypes") != typeCalls {
		t.Error("instance types refetched before their own (longer) TTL")
	}
	if o := find(t, offs, "us-east-1a", "g5.xlarge", providers.Spot); !approx(o.PricePerHour, 0.25) {
		t.Errorf("g5.xlarge spot in us-east-1a = %v after the TTL, want the new 0.25", o.PricePerHour)
	}
}

// TestCreateWireFormat checks what reaches EC2, as the fake decoded it.
func TestCreateWireFormat(t *testing.T) {
	fake, url := newFake(t)
	p := aws.New(testOptions())
	cfg := config(t, "bert", with(baseBlock(url), "key_name", "ops"))
	offs, err := p.Offerings(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	userData := "#cloud-config\nruncmd:\n  - echo hi\n"
	for _, tc := range []struct {
		off        providers.Offering
		subnet     string
		image      string
		wantMarket string
	}{
		{find(t, offs, "us-east-1b", "g5.xlarge", providers.Spot), "subnet-0bbb2222", "ami-0123456789abcdef0", fakeec2.MarketSpot},
		{find(t, offs, "us-west-2a", "g5.xlarge", providers.OnDemand), "subnet-0ccc3333", "ami-0fedcba9876543210", fakeec2.MarketOnDemand},
	} {
		t.Run(tc.off.Key(), func(t *testing.T) {
			node := "n-" + tc.off.Region
			ins, err := p.Create(ctxT(t), cfg, providers.LaunchRequest{Offering: tc.off, Count: 1, UserData: userData, Tags: nodeTags("bert", node), IdempotencyToken: "tok-" + node})
			if err != nil {
				t.Fatal(err)
			}
			var got fakeec2.Instance
			for _, in := range fake.Instances() {
				if in.ID == ins[0].ID {
					got = in
				}
			}
			if got.Region != tc.off.Region || got.Zone != tc.off.Zone || got.SubnetID != tc.subnet || got.ImageID != tc.image || got.Market != tc.wantMarket {
				t.Errorf("launched %+v, want region %s zone %s subnet %s image %s market %s", got, tc.off.Region, tc.off.Zone, tc.subnet, tc.image, tc.wantMarket)
			}
			if string(got.UserData) != userData {
				t.Errorf("user data %q, want %q", got.UserData, userData)
			}
			if !slices.Equal(got.SecurityGroups, []string{"sg-0123456789abcdef0"}) || got.IamInstanceProfile != "fleetd-node" || got.KeyName != "ops" || got.ClientToken != "tok-"+node {
				t.Errorf("groups %v, profile %q, key %q, token %q", got.SecurityGroups, got.IamInstanceProfile, got.KeyName, got.ClientToken)
			}
			for k, v := range nodeTags("bert", node) {
				if got.Tags[k] != v {
					t.Errorf("tag %s = %q, want %q", k, got.Tags[k], v)
				}
			}
			if got.Tags["Name"] != "fleetd-bert-"+node {
				t.Errorf("Name tag %q", got.Tags["Name"])
			}
			req := fake.LastRequest("RunInstances")
			if tc.wantMarket == fakeec2.MarketSpot {
				if req.Get("InstanceMarketOptions.SpotOptions.SpotInstanceType") != "one-time" || req.Get("InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior") != "terminate" {
					t.Errorf("spot options %v", req)
				}
			} else if req.Get("InstanceMarketOptions.MarketType") != "" {
				t.Errorf("on-demand launch sent market options %v", req)
			}
			if req.Get("MetadataOptions.HttpTokens") != "required" || req.Get("TagSpecification.2.ResourceType") != "volume" {
				t.Errorf("metadata options / volume tags missing: %v", req)
			}
			if b, _ := base64.StdEncoding.DecodeString(req.Get("UserData")); string(b) != userData {
				t.Errorf("UserData on the wire is not base64 of the document: %q", req.Get("UserData"))
			}
			if ins[0].State != providers.StatePending || ins[0].Address == "" || ins[0].LaunchedAt.IsZero() || ins[0].Offering.Key() != tc.off.Key() {
				t.Errorf("Create returned %+v", ins[0])
			}
			g, err := p.Get(ctxT(t), cfg, ins[0].ID)
			if err != nil {
				t.Fatal(err)
			}
			if g.State != providers.StateRunning || g.Offering.Key() != tc.off.Key() || !approx(g.Offering.PricePerHour, tc.off.PricePerHour) || g.Offering.GPUs != 1 {
				t.Errorf("Get = %+v, want running with the offering %+v", g, tc.off)
			}
		})
	}
}

func TestClientToken(t *testing.T) {
	long := strings.Repeat("node-0123456789-", 8)
	for _, tc := range []struct{ in, want string }{
		{"node-1-attempt-0", "node-1-attempt-0"},
		{strings.Repeat("x", 64), strings.Repeat("x", 64)},
		{long, ""},
		{"nöde", ""},
		{"has space", ""},
	} {
		got := aws.ClientToken(tc.in)
		if tc.want != "" && got != tc.want {
			t.Errorf("ClientToken(%q) = %q, want it unchanged", tc.in, got)
		}
		if len(got) > 64 || !strings.HasPrefix(got, "fleetd-") && tc.want == "" {
			t.Errorf("ClientToken(%q) = %q, want a fleetd- hash of at most 64 chars", tc.in, got)
		}
		if got != aws.ClientToken(tc.in) {
			t.Errorf("ClientToken(%q) is not stable", tc.in)
		}
	}
	if aws.ClientToken(long) == aws.ClientToken(long+"x") {
		t.Error("different long tokens hash alike")
	}
}

func TestCreateIdempotency(t *testing.T) {
	fake, p, cfg := newTestProvider(t)
	offs, err := p.Offerings(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	off := find(t, offs, "us-east-1a", "g5.xlarge", providers.Spot)
	token := strings.Repeat("fleet-f/node-7/attempt-", 4) // > 64 characters: hashed
	req := providers.LaunchRequest{Offering: off, Count: 2, Tags: nodeTags("f", "n7"), IdempotencyToken: token}
	first, err := p.Create(ctxT(t), cfg, req)
	if err != nil {
		t.Fatal(err)
	}
	if tok := fake.LastRequest("RunInstances").Get("ClientToken"); tok != aws.ClientToken(token) || len(tok) > 64 {
		t.Errorf("ClientToken on the wire %q, want %q", tok, aws.ClientToken(token))
	}
	again, err := p.Create(ctxT(t), cfg, req)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := first[0].ID+first[1].ID, again[0].ID+again[1].ID; a != b {
		t.Errorf("retry launched %s, want the first call's %s", b, a)
	}
	if n := len(fake.Live()); n != 2 {
		t.Errorf("%d live instances after a retried Create, want 2", n)
	}

	// The same token for a different request is EC2's
	// IdempotentParameterMismatch: a caller bug, reported as such.
	req.Count = 3
	_, err = p.Create(ctxT(t), cfg, req)
	var pe *providers.Error
	if !errors.As(err, &pe) || pe.Kind != providers.KindInvalidConfig || pe.Code != "IdempotentParameterMismatch" {
		t.Errorf("token reuse with other parameters: %v, want invalid-config IdempotentParameterMismatch", err)
	}
}

// TestErrorMapping drives every mapped EC2 error code through the real SDK
// and checks the typed error, its Code and Offering, and how often the
// SDK called (throttling and 5xx are retried by the SDK first, capacity
// and quota answers are not).
func TestErrorMapping(t *testing.T) {
	const attempts = 3 // testOptions().RetryMaxAttempts
	for _, tc := range []struct {
		code      string
		kind      providers.ErrorKind
		retried   bool // the SDK retries it up to attempts
		noOffered bool // the error names no offering (not about capacity)
	}{
		{code: "InsufficientInstanceCapacity", kind: providers.KindCapacity},
		{code: "SpotMaxPriceTooLow", kind: providers.KindCapacity},
		{code: "UnfulfillableCapacity", kind: providers.KindCapacity},
		{code: "InsufficientCapacity", kind: providers.KindCapacity},
		{code: "MaxSpotInstanceCountExceeded", kind: providers.KindQuota},
		{code: "InstanceLimitExceeded", kind: providers.KindQuota},
		{code: "VcpuLimitExceeded", kind: providers.KindQuota},
		{code: "RequestLimitExceeded", kind: providers.KindTransient, retried: true},
		{code: "Throttling", kind: providers.KindTransient, retried: true},
		{code: "InternalError", kind: providers.KindTransient, retried: true},
		{code: "InvalidParameterValue", kind: providers.KindInvalidConfig},
		{code: "InvalidAMIID.NotFound", kind: providers.KindInvalidConfig},
		{code: "InvalidAMIID.Malformed", kind: providers.KindInvalidConfig},
		{code: "UnauthorizedOperation", kind: providers.KindInvalidConfig},
		{code: "InvalidSubnetID.NotFound", kind: providers.KindInvalidConfig},
	} {
		t.Run(tc.code, func(t *testing.T) {
			fake, p, cfg := newTestProvider(t)
			offs, err := p.Offerings(ctxT(t), cfg)
			if err != nil {
				t.Fatal(err)
			}
			off := find(t, offs, "us-east-1a", "p4d.24xlarge", providers.Spot)
			fake.FailNext("RunInstances", tc.code, "injected "+tc.code, attempts)
			_, err = p.Create(ctxT(t), cfg, providers.LaunchRequest{Offering: off, Count: 1, Tags: nodeTags("f", "n1"), IdempotencyToken: "tok-1"})
			var pe *providers.Error
			if !errors.As(err, &pe) {
				t.Fatalf("Create: %v, want a *providers.Error", err)
			}
			if pe.Kind != tc.kind || pe.Code != tc.code || pe.Offering != off.Key() {
				t.Errorf("Create: kind %s code %q offering %q, want %s %q %q", pe.Kind, pe.Code, pe.Offering, tc.kind, tc.code, off.Key())
			}
			if !strings.Contains(err.Error(), "injected "+tc.code) {
				t.Errorf("error %q lost EC2's message", err)
			}
			want := 1
			if tc.retried {
				want = attempts
			}
			if got := fake.Calls("RunInstances"); got != want {
				t.Errorf("RunInstances called %d times, want %d", got, want)
			}
			if live := fake.Live(); len(live) != 0 {
				t.Errorf("failed Create left %d instances", len(live))
			}
		})
	}
}

// TestErrorsFromFakeState provokes the same codes through the fake's state
// (not scripted answers), so the fake's own checks are exercised too.
func TestErrorsFromFakeState(t *testing.T) {
	for _, tc := range []struct {
		name   string
		setup  func(f *fakeec2.Server)
		block  func(map[string]any) map[string]any
		ct     providers.CapacityType
		code   string
		kindOK func(error) bool
	}{
		{name: "capacity", setup: func(f *fakeec2.Server) { f.SetCapacity("us-east-1a", "p4d.24xlarge", 0) }, ct: providers.Spot, code: "InsufficientInstanceCapacity", kindOK: providers.IsCapacity},
		{name: "spot quota", setup: func(f *fakeec2.Server) { f.SetVCPUQuota("us-east-1", fakeec2.MarketSpot, 64) }, ct: providers.Spot, code: "MaxSpotInstanceCountExceeded", kindOK: providers.IsQuota},
		{name: "on-demand quota", setup: func(f *fakeec2.Server) { f.SetVCPUQuota("us-east-1", fakeec2.MarketOnDemand, 0) }, ct: providers.OnDemand, code: "VcpuLimitExceeded", kindOK: providers.IsQuota},
		{name: "throttled", setup: func(f *fakeec2.Server) { f.Throttle(3) }, ct: providers.Spot, code: "RequestLimitExceeded", kindOK: providers.IsTransient},
		{name: "image gone", setup: func(f *fakeec2.Server) { f.RemoveImage("us-east-1", "ami-0123456789abcdef0") }, ct: providers.Spot, code: "InvalidAMIID.NotFound", kindOK: providers.IsInvalidConfig},
		{name: "unknown subnet", block: func(b map[string]any) map[string]any {
			return with(b, "subnets", map[string]string{"us-east-1a": "subnet-0ddd4444"})
		}, ct: providers.Spot, code: "InvalidSubnetID.NotFound", kindOK: providers.IsInvalidConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake, url := newFake(t)
			p := aws.New(testOptions())
			block := baseBlock(url)
			if tc.block != nil {
				block = tc.block(block)
			}
			cfg := config(t, "f", block)
			off := providers.Offering{Provider: aws.Name, Region: "us-east-1", Zone: "us-east-1a", InstanceType: "p4d.24xlarge", CapacityType: tc.ct}
			if tc.setup != nil {
				tc.setup(fake)
			}
			_, err := p.Create(ctxT(t), cfg, providers.LaunchRequest{Offering: off, Count: 1, Tags: nodeTags("f", "n1"), IdempotencyToken: "tok-1"})
			var pe *providers.Error
			if !tc.kindOK(err) || !errors.As(err, &pe) || pe.Code != tc.code || pe.Offering != off.Key() {
				t.Fatalf("Create: %v, want code %s about %s", err, tc.code, off.Key())
			}
		})
	}
}

// TestCapacityFailover is the daemon's use of capacity errors in
// miniature: us-east-1a has no p4d capacity; the error names that offering
// only, so the loop marks it unavailable and the next-best zone launches.
func TestCapacityFailover(t *testing.T) {
	fake, url := newFake(t)
	fake.SetCapacity("us-east-1a", "p4d.24xlarge", 0)
	p := aws.New(testOptions())
	cfg := config(t, "f", with(baseBlock(url), "regions", []string{"us-east-1"}))
	offs, err := p.Offerings(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var cands []providers.Offering
	for _, o := range offs {
		if o.InstanceType == "p4d.24xlarge" && o.CapacityType == providers.Spot {
			cands = append(cands, o)
		}
	}
	sort.Slice(cands, func(i, j int) bool { return cands[i].PricePerHour < cands[j].PricePerHour })
	if len(cands) != 2 || cands[0].Zone != "us-east-1a" {
		t.Fatalf("candidates %v, want us-east-1a (cheapest) then us-east-1b", cands)
	}

	unavailable := map[string]string{} // offering key → code
	var launched []providers.Instance
	for attempt, off := range cands {
		if _, ok := unavailable[off.Key()]; ok {
			continue
		}
		ins, err := p.Create(ctxT(t), cfg, providers.LaunchRequest{
			Offering: off, Count: 1, Tags: nodeTags("f", "n1"),
			IdempotencyToken: fmt.Sprintf("f-n1-%d", attempt), // a new attempt, a new token
		})
		var pe *providers.Error
		if errors.As(err, &pe) && (pe.Kind == providers.KindCapacity || pe.Kind == providers.KindQuota) {
			unavailable[pe.Offering] = pe.Code
			continue
		}
		if err != nil {
			t.Fatalf("Create %s: %v", off.Key(), err)
		}
		launched = ins
		break
	}
	want := map[string]string{cands[0].Key(): "InsufficientInstanceCapacity"}
	if fmt.Sprint(unavailable) != fmt.Sprint(want) {
		t.Errorf("unavailable offerings %v, want only %v", unavailable, want)
	}
	if len(launched) != 1 || launched[0].Offering.Zone != "us-east-1b" {
		t.Fatalf("launched %+v, want one instance in us-east-1b", launched)
	}
	if live := fake.Live(); len(live) != 1 || live[0].Zone != "us-east-1b" {
		t.Errorf("EC2 holds %+v, want one instance in us-east-1b", live)
	}
}

func TestListPagination(t *testing.T) {
	fake, p, cfg := newTestProvider(t)
	off := g5Spot("us-east-1a")
	var ids []string
	for i := range 3 {
		ins, err := p.Create(ctxT(t), cfg, providers.LaunchRequest{Offering: off, Count: 2, Tags: nodeTags("f", fmt.Sprint("n", i)), IdempotencyToken: fmt.Sprint("tok-", i)})
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range ins {
			ids = append(ids, in.ID)
		}
	}
	other := g5Spot("us-west-2a")
	ins, err := p.Create(ctxT(t), cfg, providers.LaunchRequest{Offering: other, Count: 1, Tags: nodeTags("f", "w"), IdempotencyToken: "tok-w"})
	if err != nil {
		t.Fatal(err)
	}
	ids = append(ids, ins[0].ID)
	if _, err := p.Create(ctxT(t), cfg, providers.LaunchRequest{Offering: off, Count: 1, Tags: nodeTags("other-fleet", "x"), IdempotencyToken: "tok-x"}); err != nil {
		t.Fatal(err)
	}
	if err := p.Delete(ctxT(t), cfg, ids[0]); err != nil {
		t.Fatal(err)
	}

	fake.SetPageSize(2)
	before := fake.Calls("DescribeInstances")
	got, err := p.List(ctxT(t), cfg, map[string]string{providers.TagFleet: "f"})
	if err != nil {
		t.Fatal(err)
	}
	var gotIDs []string
	for _, in := range got {
		gotIDs = append(gotIDs, in.ID)
		if in.Tags[providers.TagFleet] != "f" || in.State == providers.StateTerminated {
			t.Errorf("List returned %+v", in)
		}
	}
	want := slices.Clone(ids[1:]) // the deleted one is left out
	sort.Strings(want)
	if !slices.Equal(gotIDs, want) {
		t.Errorf("List = %v, want %v", gotIDs, want)
	}
	// us-east-1: 6 of fleet f (one terminated, still listed by EC2) in
	// pages of 2 = 3 calls; us-west-2: 1 call.
	if calls := fake.Calls("DescribeInstances") - before; calls != 4 {
		t.Errorf("%d DescribeInstances calls, want 4 (pages of 2)", calls)
	}
}

func TestDelayedConsistency(t *testing.T) {
	fake, p, cfg := newTestProvider(t)
	off := g5Spot("us-west-2a")
	fake.SetConsistencyDelay(4)
	ins, err := p.Create(ctxT(t), cfg, providers.LaunchRequest{Offering: off, Count: 1, Tags: nodeTags("f", "n1"), IdempotencyToken: "tok-1"})
	if err != nil {
		t.Fatal(err)
	}
	id := ins[0].ID

	// EC2 says "no such instance"; the provider vouches for it.
	g, err := p.Get(ctxT(t), cfg, id)
	if err != nil || g.ID != id || g.State != providers.StatePending {
		t.Fatalf("Get of a just-launched, not yet visible instance: %+v, %v", g, err)
	}
	l, err := p.List(ctxT(t), cfg, map[string]string{providers.TagNodeID: "n1"})
	if err != nil || len(l) != 1 || l[0].ID != id {
		t.Fatalf("List of a just-launched, not yet visible instance: %+v, %v", l, err)
	}
	// A different provider process (e.g. after a plugin restart) knows
	// nothing of the launch and sees EC2's answer.
	if _, err := aws.New(testOptions()).Get(ctxT(t), cfg, id); !providers.IsNotFound(err) {
		t.Fatalf("fresh provider Get: %v, want not-found while EC2 hides the instance", err)
	}

	// Delete must not take EC2's NotFound for "already gone": it retries
	// until EC2 shows the instance, and terminates it.
	before := fake.Calls("TerminateInstances")
	if err := p.Delete(ctxT(t), cfg, id); err != nil {
		t.Fatal(err)
	}
	if calls := fake.Calls("TerminateInstances") - before; calls < 2 {
		t.Errorf("Delete made %d TerminateInstances calls, want retries while the instance was hidden", calls)
	}
	if live := fake.Live(); len(live) != 0 {
		t.Errorf("instance not terminated: %+v", live)
	}
	g, err = p.Get(ctxT(t), cfg, id)
	if err != nil || g.State != providers.StateTerminated {
		t.Errorf("Get after Delete: %+v, %v; want terminated", g, err)
	}
}

func TestDeleteStillHiddenIsTransient(t *testing.T) {
	fake, p, cfg := newTestProvider(t)
	off := g5Spot("us-east-1a")
	fake.SetConsistencyDelay(100) // longer than Delete's bounded retries
	ins, err := p.Create(ctxT(t), cfg, providers.LaunchRequest{Offering: off, Count: 1, Tags: nodeTags("f", "n1"), IdempotencyToken: "tok-1"})
	if err != nil {
		t.Fatal(err)
	}
	err = p.Delete(ctxT(t), cfg, ins[0].ID)
	if !providers.IsTransient(err) {
		t.Fatalf("Delete of an instance EC2 keeps hiding: %v, want a transient error (never a silent success)", err)
	}
}

func TestSpotInterruptionMarked(t *testing.T) {
	fake, p, cfg := newTestProvider(t)
	off := providers.Offering{Provider: aws.Name, Region: "us-east-1", Zone: "us-east-1b", InstanceType: "p4d.24xlarge", CapacityType: providers.Spot}
	ins, err := p.Create(ctxT(t), cfg, providers.LaunchRequest{Offering: off, Count: 2, Tags: nodeTags("f", "n1"), IdempotencyToken: "tok-1"})
	if err != nil {
		t.Fatal(err)
	}
	victim, other := ins[0].ID, ins[1].ID
	marked := time.Now()
	if err := fake.InterruptSpot(victim, -1); err != nil {
		t.Fatal(err)
	}
	g, err := p.Get(ctxT(t), cfg, victim)
	if err != nil {
		t.Fatal(err)
	}
	if g.Interruption == nil || g.Interruption.Kind != "spot-interruption" || g.State != providers.StateRunning {
		t.Fatalf("Get of a marked instance: %+v", g)
	}
	if d := g.Interruption.Deadline.Sub(marked); d < aws.NoticeLead-2*time.Second || d > aws.NoticeLead+2*time.Second {
		t.Errorf("deadline %v is %v after the mark, want about %v", g.Interruption.Deadline, d, aws.NoticeLead)
	}
	l, err := p.List(ctxT(t), cfg, map[string]string{providers.TagNodeID: "n1"})
	if err != nil || len(l) != 2 {
		t.Fatalf("List: %+v, %v", l, err)
	}
	for _, in := range l {
		if (in.ID == victim) != (in.Interruption != nil) {
			t.Errorf("List: %s interruption %+v", in.ID, in.Interruption)
		}
	}

	if err := fake.Reclaim(victim); err != nil {
		t.Fatal(err)
	}
	l, err = p.List(ctxT(t), cfg, map[string]string{providers.TagNodeID: "n1"})
	if err != nil || len(l) != 1 || l[0].ID != other {
		t.Errorf("List after the reclaim: %+v, %v; want only %s", l, err, other)
	}
	g, err = p.Get(ctxT(t), cfg, victim)
	if err != nil || g.State != providers.StateTerminated {
		t.Errorf("Get after the reclaim: %+v, %v", g, err)
	}
}

func TestProfile(t *testing.T) {
	fake, url := newFake(t)
	creds := filepath.Join(t.TempDir(), "credentials")
	if err := os.WriteFile(creds, []byte("[fleetd-test]\naws_access_key_id = AKIAPROFILE000000001\naws_secret_access_key = s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", creds)
	p := aws.New(testOptions())
	if _, err := p.Offerings(ctxT(t), config(t, "f", with(baseBlock(url), "profile", "fleetd-test"))); err != nil {
		t.Fatal(err)
	}
	if k := fake.LastAccessKeyID("DescribeSpotPriceHistory"); k != "AKIAPROFILE000000001" {
		t.Errorf("signed with %q, want the profile's key", k)
	}
	if _, err := p.Offerings(ctxT(t), config(t, "f", baseBlock(url))); err != nil {
		t.Fatal(err)
	}
	if k := fake.LastAccessKeyID("DescribeSpotPriceHistory"); k != testAccessKey {
		t.Errorf("without a profile signed with %q, want the environment's %q", k, testAccessKey)
	}
	_, err := p.Offerings(ctxT(t), config(t, "f", with(baseBlock(url), "profile", "no-such-profile")))
	if !providers.IsInvalidConfig(err) {
		t.Errorf("unknown profile: %v, want invalid-config", err)
	}
}

func TestBlockValidation(t *testing.T) {
	p := aws.New(testOptions())
	base := baseBlock("http://127.0.0.1:1")
	for _, tc := range []struct {
		name  string
		block map[string]any
		want  string
	}{
		{"unknown attribute", with(base, "regionz", []string{"x"}), "regionz"},
		{"no regions", with(base, "regions", []string{}), "regions"},
		{"no types", with(base, "instance_types", []string{}), "instance_types"},
		{"no image", with(base, "image", "", "image_per_region", map[string]string{"us-west-2": "ami-1"}), "no AMI for region us-east-1"},
		{"empty subnet", with(base, "subnets", map[string]string{"us-east-1a": ""}), "us-east-1a"},
		{"bad price", with(base, "on_demand_prices", map[string]float64{"p4d.24xlarge": 0}), "on_demand_prices"},
		{"price not a number", with(base, "on_demand_prices", map[string]string{"p4d.24xlarge": "cheap"}), "on_demand_prices"},
		{"bad endpoint", with(base, "endpoint", "localhost:9"), "endpoint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := p.Offerings(ctxT(t), config(t, "f", tc.block))
			if !providers.IsInvalidConfig(err) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Offerings: %v, want invalid-config mentioning %q", err, tc.want)
			}
		})
	}
	// Launch requests the block does not allow.
	cfg := config(t, "f", base)
	for _, off := range []providers.Offering{
		{Provider: aws.Name, Region: "eu-west-1", Zone: "eu-west-1a", InstanceType: "g5.xlarge", CapacityType: providers.Spot},
		{Provider: aws.Name, Region: "us-east-1", Zone: "us-east-1c", InstanceType: "g5.xlarge", CapacityType: providers.Spot}, // no subnet
		{Provider: aws.Name, Region: "us-east-1", Zone: "us-east-1a", InstanceType: "m5.large", CapacityType: providers.Spot},
		{Provider: "gcp", Region: "us-east-1", Zone: "us-east-1a", InstanceType: "g5.xlarge", CapacityType: providers.Spot},
	} {
		if _, err := p.Create(ctxT(t), cfg, providers.LaunchRequest{Offering: off, Count: 1}); !providers.IsInvalidConfig(err) {
			t.Errorf("Create %s: %v, want invalid-config", off.Key(), err)
		}
	}
}

func TestInterruptionQueues(t *testing.T) {
	base := baseBlock("http://127.0.0.1:1")
	for _, tc := range []struct {
		queue string
		want  []aws.InterruptionQueue
	}{
		{"", nil},
		{"fleetd-interruptions", []aws.InterruptionQueue{{Region: "us-east-1", Queue: "fleetd-interruptions"}, {Region: "us-west-2", Queue: "fleetd-interruptions"}}},
		{"https://sqs.us-west-2.amazonaws.com/123456789012/q", []aws.InterruptionQueue{{Region: "us-west-2", Queue: "https://sqs.us-west-2.amazonaws.com/123456789012/q"}}},
		{"http://127.0.0.1:9/123456789012/q", []aws.InterruptionQueue{{Region: "us-east-1", Queue: "http://127.0.0.1:9/123456789012/q"}}},
	} {
		block := base
		if tc.queue != "" {
			block = with(base, "interruption_queue", tc.queue)
		}
		got, err := aws.InterruptionQueues(config(t, "f", block))
		if err != nil || fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("InterruptionQueues(%q) = %v, %v; want %v", tc.queue, got, err, tc.want)
		}
	}
}
