package gcp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/proto"

	"github.com/fleetd/fleetd/internal/testutil"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/gcp"
	"github.com/fleetd/fleetd/providers/gcp/fakegce"
)

func ctxT(t *testing.T) context.Context { return testutil.Context(t, 20*time.Second) }

// offering picks one offering of the provider's list.
func offering(t *testing.T, p *gcp.Provider, cfg providers.Config, zone, typ string, ct providers.CapacityType) providers.Offering {
	t.Helper()
	offs, err := p.Offerings(ctxT(t), cfg)
	if err != nil {
		t.Fatalf("Offerings: %v", err)
	}
	for _, o := range offs {
		if o.Zone == zone && o.InstanceType == typ && o.CapacityType == ct {
			return o
		}
	}
	t.Fatalf("no offering %s %s %s in %v", zone, typ, ct, offs)
	return providers.Offering{}
}

func launchReq(off providers.Offering, node string) providers.LaunchRequest {
	return providers.LaunchRequest{
		Offering: off, Count: 1, UserData: "#cloud-config\nruncmd: [echo hi]\n",
		Tags:             map[string]string{providers.TagFleet: "bert", providers.TagNodeID: node, providers.TagDaemonID: "d1"},
		IdempotencyToken: "node:" + node,
	}
}

func TestInsertBody(t *testing.T) {
	f, cfg := newFake(t, fakegce.Options{}, map[string]any{
		"subnetwork": "train", "service_account": "nodes@p.iam.gserviceaccount.com",
		"scopes": []string{"https://www.googleapis.com/auth/devstorage.read_write"}, "disk_size_gb": 300,
	})
	p := newProvider()
	cases := []struct {
		typ       string
		ct        providers.CapacityType
		wantModel string
		wantAccel string
		wantOHM   string
	}{
		{"n1-standard-8", providers.Spot, "SPOT", "nvidia-tesla-t4", "TERMINATE"},
		{"a2-highgpu-1g", providers.OnDemand, "STANDARD", "", "TERMINATE"},
	}
	for _, tc := range cases {
		t.Run(tc.typ, func(t *testing.T) {
			off := offering(t, p, cfg, "us-central1-b", tc.typ, tc.ct)
			req := launchReq(off, "Node_"+tc.typ+" With Spaces")
			req.Tags["Team"] = "ML Research/Vision"
			ins, err := p.Create(ctxT(t), cfg, req)
			if err != nil {
				t.Fatalf("Create: %v", err)
			}
			zone, name, ok := gcp.ParseInstanceID(ins[0].ID)
			if !ok || zone != "us-central1-b" {
				t.Fatalf("id %q is not us-central1-b/NAME", ins[0].ID)
			}
			if !regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`).MatchString(name) {
				t.Errorf("name %q is not RFC 1035", name)
			}
			got, ok := f.Instance(zone, name)
			if !ok {
				t.Fatalf("fake has no %s", ins[0].ID)
			}
			sc := got.Scheduling
			if sc.ProvisioningModel != tc.wantModel || sc.OnHostMaintenance != tc.wantOHM || sc.AutomaticRestart == nil || *sc.AutomaticRestart {
				t.Errorf("scheduling %+v, want model %s, onHostMaintenance %s, automaticRestart false", sc, tc.wantModel, tc.wantOHM)
			}
			if tc.ct == providers.Spot && sc.InstanceTerminationAction != "DELETE" {
				t.Errorf("instanceTerminationAction %q, want DELETE", sc.InstanceTerminationAction)
			}
			var accel string
			for _, a := range got.GuestAccelerators {
				accel = a.AcceleratorType[strings.LastIndexByte(a.AcceleratorType, '/')+1:]
			}
			if accel != tc.wantAccel {
				t.Errorf("guest accelerator %q, want %q", accel, tc.wantAccel)
			}
			if ud, _ := got.MetadataValue("user-data"); ud != req.UserData {
				t.Errorf("user-data %q, want %q", ud, req.UserData)
			}
			if len(got.Disks) != 1 || got.Disks[0].DiskSizeGb != 300 || !got.Disks[0].Boot || !got.Disks[0].AutoDelete {
				t.Errorf("disks %+v, want one 300 GB auto-delete boot disk", got.Disks)
			}
			nic := got.NetworkInterfaces[0]
			if !strings.HasSuffix(nic.Network, "/global/networks/default") || !strings.HasSuffix(nic.Subnetwork, "/regions/us-central1/subnetworks/train") || len(nic.AccessConfigs) != 1 {
				t.Errorf("network interface %+v", nic)
			}
			if len(got.ServiceAccounts) != 1 || got.ServiceAccounts[0].Email != "nodes@p.iam.gserviceaccount.com" || !slices.Equal(got.ServiceAccounts[0].Scopes, []string{"https://www.googleapis.com/auth/devstorage.read_write"}) {
				t.Errorf("service accounts %+v", got.ServiceAccounts)
			}
			for k, v := range got.Labels {
				if !regexp.MustCompile(`^[a-z][a-z0-9_-]{0,62}$`).MatchString(k) || !regexp.MustCompile(`^[a-z0-9_-]{0,63}$`).MatchString(v) {
					t.Errorf("label %q=%q breaks the GCE label rules", k, v)
				}
			}
			if got.Labels["fleetd-fleet"] != "bert" {
				t.Errorf("labels %v lack fleetd-fleet=bert", got.Labels)
			}
			// The exact tags come back, though the labels could not hold them.
			if ins[0].Tags["Team"] != "ML Research/Vision" || ins[0].Tags[providers.TagNodeID] != req.Tags[providers.TagNodeID] {
				t.Errorf("tags %v, want %v", ins[0].Tags, req.Tags)
			}
			if ins[0].Offering.Key() != off.Key() || ins[0].Offering.PricePerHour != off.PricePerHour || ins[0].Offering.GPUs != off.GPUs {
				t.Errorf("offering %+v, want %+v", ins[0].Offering, off)
			}
			if ins[0].Address == "" || ins[0].State != providers.StateRunning || ins[0].LaunchedAt.IsZero() {
				t.Errorf("instance %+v: want an address, running, a launch time", ins[0])
			}
		})
	}
}

func TestCreateSameTokenIsOneInstance(t *testing.T) {
	f, p, cfg := newTestProvider(t)
	off := offering(t, p, cfg, "us-central1-a", "g2-standard-8", providers.Spot)
	req := launchReq(off, "n1")
	req.Count = 3
	first, err := p.Create(ctxT(t), cfg, req)
	if err != nil {
		t.Fatal(err)
	}
	again, err := p.Create(ctxT(t), cfg, req)
	if err != nil {
		t.Fatal(err)
	}
	ids := func(ins []providers.Instance) []string {
		var out []string
		for _, in := range ins {
			out = append(out, in.ID)
		}
		slices.Sort(out)
		return out
	}
	if !slices.Equal(ids(first), ids(again)) || len(first) != 3 {
		t.Fatalf("first %v, again %v: want the same 3", ids(first), ids(again))
	}
	st := f.Stats()
	if st.InstancesCreated != 3 || st.DedupedInserts != 3 {
		t.Errorf("stats %+v: want 3 created and 3 inserts answered by requestId", st)
	}
}

// TestLaunchErrors maps each Compute Engine failure, synchronous or in the
// operation, to its typed error, with the cloud's code and the offering.
func TestLaunchErrors(t *testing.T) {
	cases := []struct {
		name     string
		fault    *fakegce.Fault
		wantKind providers.ErrorKind
		wantCode string
	}{
		{"stockout", &fakegce.Fault{OpErrors: []fakegce.OperationErrorItem{{Code: "ZONE_RESOURCE_POOL_EXHAUSTED", Message: "The zone 'projects/p/zones/us-central1-a' does not have enough resources available to fulfill the request."}}, OpHTTPStatus: 503}, providers.KindCapacity, "ZONE_RESOURCE_POOL_EXHAUSTED"},
		{"stockout with details", &fakegce.Fault{OpErrors: []fakegce.OperationErrorItem{{Code: "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", Message: "A g2-standard-8 VM instance is currently unavailable in the us-central1-a zone."}}, OpHTTPStatus: 503}, providers.KindCapacity, "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"},
		{"global GPU quota", fakegce.QuotaFault("GPUS_ALL_REGIONS", ""), providers.KindQuota, "QUOTA_EXCEEDED"},
		{"regional GPU quota", fakegce.QuotaFault("NVIDIA_L4_GPUS", "us-central1"), providers.KindQuota, "QUOTA_EXCEEDED"},
		{"quota and stockout", &fakegce.Fault{OpErrors: []fakegce.OperationErrorItem{{Code: "QUOTA_EXCEEDED", Message: "Quota 'CPUS' exceeded."}, {Code: "ZONE_RESOURCE_POOL_EXHAUSTED", Message: "no"}}}, providers.KindCapacity, "ZONE_RESOURCE_POOL_EXHAUSTED"},
		{"sync quota", &fakegce.Fault{HTTPStatus: 403, Reason: "quotaExceeded", Message: "Quota 'NVIDIA_L4_GPUS' exceeded.  Limit: 0.0 in region us-central1."}, providers.KindQuota, "quotaExceeded"},
		{"rate limited 429", fakegce.RateLimitFault(), providers.KindTransient, "rateLimitExceeded"},
		{"rate limited 403", &fakegce.Fault{HTTPStatus: 403, Reason: "rateLimitExceeded", Message: "Rate Limit Exceeded"}, providers.KindTransient, "rateLimitExceeded"},
		{"backend error", &fakegce.Fault{HTTPStatus: 503, Reason: "backendError", Message: "Internal error. Please try again."}, providers.KindTransient, "backendError"},
		{"operation rate", &fakegce.Fault{OpErrors: []fakegce.OperationErrorItem{{Code: "RESOURCE_OPERATION_RATE_EXCEEDED", Message: "Operation rate exceeded for resource."}}}, providers.KindTransient, "RESOURCE_OPERATION_RATE_EXCEEDED"},
		{"invalid", &fakegce.Fault{HTTPStatus: 400, Reason: "invalid", Message: "Invalid value for field 'resource.disks[0].initializeParams.sourceImage'"}, providers.KindInvalidConfig, "invalid"},
		{"image not found", &fakegce.Fault{OpErrors: []fakegce.OperationErrorItem{{Code: "RESOURCE_NOT_FOUND", Message: "The resource 'projects/p/global/images/nope' was not found"}}, OpHTTPStatus: 404}, providers.KindInvalidConfig, "RESOURCE_NOT_FOUND"},
		{"permission denied", &fakegce.Fault{HTTPStatus: 403, Reason: "forbidden", Message: "Required 'compute.instances.create' permission for 'projects/p/zones/us-central1-a/instances/x'"}, providers.KindInvalidConfig, "forbidden"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, p, cfg := newTestProvider(t)
			off := offering(t, p, cfg, "us-central1-a", "g2-standard-8", providers.Spot)
			f.SetInsertFault("us-central1-a", tc.fault)
			ins, err := p.Create(ctxT(t), cfg, launchReq(off, "e1"))
			var pe *providers.Error
			if !errors.As(err, &pe) {
				t.Fatalf("Create: %v, want a *providers.Error", err)
			}
			if pe.Kind != tc.wantKind || pe.Code != tc.wantCode || pe.Offering != off.Key() {
				t.Errorf("got kind %s code %q offering %q, want %s %q %q (%v)", pe.Kind, pe.Code, pe.Offering, tc.wantKind, tc.wantCode, off.Key(), err)
			}
			if len(ins) != 0 || len(f.Instances()) != 0 {
				t.Errorf("a failed launch left instances: %v, %v", ins, f.Instances())
			}
		})
	}
}

func TestStockoutInOneZone(t *testing.T) {
	f, p, cfg := newTestProvider(t)
	f.SetStockout("us-central1-a", true)
	offA := offering(t, p, cfg, "us-central1-a", "a2-highgpu-1g", providers.Spot)
	offB := offering(t, p, cfg, "us-central1-b", "a2-highgpu-1g", providers.Spot)
	_, err := p.Create(ctxT(t), cfg, launchReq(offA, "s1"))
	if !providers.IsCapacity(err) {
		t.Fatalf("Create in the stocked-out zone: %v, want a capacity error", err)
	}
	var pe *providers.Error
	errors.As(err, &pe)
	if pe.Offering != offA.Key() {
		t.Errorf("capacity error names %q, want %q", pe.Offering, offA.Key())
	}
	ins, err := p.Create(ctxT(t), cfg, launchReq(offB, "s1"))
	if err != nil || len(ins) != 1 || ins[0].Offering.Zone != "us-central1-b" {
		t.Fatalf("Create in the other zone: %v, %v", ins, err)
	}
}

// TestRetryAfterStockoutClears: GCE answers a repeated requestId with the
// original (failed) operation; a retry after the stockout ended must
// launch anyway, once.
func TestRetryAfterStockoutClears(t *testing.T) {
	f, p, cfg := newTestProvider(t)
	off := offering(t, p, cfg, "us-central1-a", "g2-standard-8", providers.Spot)
	f.SetStockout("us-central1-a", true)
	if _, err := p.Create(ctxT(t), cfg, launchReq(off, "r1")); !providers.IsCapacity(err) {
		t.Fatalf("first Create: %v, want capacity", err)
	}
	f.SetStockout("us-central1-a", false)
	time.Sleep(2100 * time.Millisecond) // the failed operation must predate the retry
	first, err := p.Create(ctxT(t), cfg, launchReq(off, "r1"))
	if err != nil || len(first) != 1 {
		t.Fatalf("retry: %v, %v", first, err)
	}
	again, err := p.Create(ctxT(t), cfg, launchReq(off, "r1"))
	if err != nil || len(again) != 1 || again[0].ID != first[0].ID {
		t.Fatalf("third Create: %v, %v; want %s again", again, err, first[0].ID)
	}
	wantCreated(t, f, 1)
}

func TestSlowOperations(t *testing.T) {
	f, p, cfg := newTestProvider(t)
	off := offering(t, p, cfg, "us-central1-a", "g2-standard-8", providers.Spot)
	f.SetOperationPolls(4)
	ins, err := p.Create(ctxT(t), cfg, launchReq(off, "slow"))
	if err != nil || len(ins) != 1 || ins[0].State != providers.StateRunning {
		t.Fatalf("Create: %v, %v", ins, err)
	}
	if n := f.Stats().OperationPolls; n < 5 {
		t.Errorf("%d operation polls, want at least 5 (4 not done + 1 done)", n)
	}
	if err := p.Delete(ctxT(t), cfg, ins[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Get(ctxT(t), cfg, ins[0].ID); !providers.IsNotFound(err) {
		t.Errorf("Get after the slow Delete: %v, want not found", err)
	}
}

func TestAlreadyExists(t *testing.T) {
	f, p, cfg := newTestProvider(t)
	off := offering(t, p, cfg, "us-central1-a", "g2-standard-8", providers.Spot)
	req := launchReq(off, "x1")
	ins, err := p.Create(ctxT(t), cfg, req)
	if err != nil {
		t.Fatal(err)
	}
	// Another offering (a different requestId) with the same token and
	// zone lands on the same instance name: 409, and the instance is ours.
	other := offering(t, p, cfg, "us-central1-a", "g2-standard-8", providers.OnDemand)
	req2 := req
	req2.Offering = other
	again, err := p.Create(ctxT(t), cfg, req2)
	if err != nil || len(again) != 1 || again[0].ID != ins[0].ID {
		t.Fatalf("Create of an existing name: %v, %v; want %s adopted", again, err, ins[0].ID)
	}
	wantCreated(t, f, 1)
}

func TestPreemption(t *testing.T) {
	f, p, cfg := newTestProvider(t)
	off := offering(t, p, cfg, "us-central1-a", "g2-standard-8", providers.Spot)
	ins, err := p.Create(ctxT(t), cfg, launchReq(off, "p1"))
	if err != nil {
		t.Fatal(err)
	}
	keep, err := p.Create(ctxT(t), cfg, launchReq(off, "p2"))
	if err != nil {
		t.Fatal(err)
	}
	zone, name, _ := gcp.ParseInstanceID(ins[0].ID)
	op, err := f.Preempt(zone, name)
	if err != nil {
		t.Fatal(err)
	}
	got, err := p.Get(ctxT(t), cfg, ins[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	insert, _ := time.Parse(time.RFC3339Nano, op.InsertTime)
	if got.State != providers.StateTerminated || got.Interruption == nil || got.Interruption.Kind != "preempted" || !got.Interruption.Deadline.Equal(insert.Add(30*time.Second)) {
		t.Fatalf("preempted instance: state %s, interruption %+v; want terminated, preempted at %v", got.State, got.Interruption, insert.Add(30*time.Second))
	}
	all, err := p.List(ctxT(t), cfg, map[string]string{providers.TagFleet: "bert"})
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range all {
		if (in.ID == keep[0].ID) != (in.Interruption == nil) {
			t.Errorf("List: %s interruption %+v", in.ID, in.Interruption)
		}
	}

	// A Spot VM fleetd is deleting is stopping, not preempted.
	f.SetOperationPolls(100)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := p.Delete(ctx, cfg, keep[0].ID); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Delete with a slow operation: %v, want the deadline", err)
	}
	got, err = p.Get(ctxT(t), cfg, keep[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != providers.StateStopping || got.Interruption != nil {
		t.Errorf("instance being deleted: state %s, interruption %+v; want stopping, none", got.State, got.Interruption)
	}
	f.CompleteOperations()
}

func TestListPagesAndTags(t *testing.T) {
	_, cfg := newFake(t, fakegce.Options{}, nil)
	p := gcp.New(gcp.Options{PollInterval: testPoll, PageSize: 2})
	var want []string
	for i := range 5 {
		zone := []string{"us-central1-a", "us-central1-b"}[i%2]
		off := offering(t, p, cfg, zone, "n1-standard-8", providers.Spot)
		req := launchReq(off, fmt.Sprintf("node-%d", i))
		req.Tags[providers.TagFleet] = "Fleet With Caps & Spaces"
		ins, err := p.Create(ctxT(t), cfg, req)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, ins[0].ID)
	}
	other := launchReq(offering(t, p, cfg, "us-central1-a", "n1-standard-8", providers.Spot), "other")
	other.Tags[providers.TagFleet] = "fleet-with-caps---spaces" // what naive sanitizing would collide with
	if _, err := p.Create(ctxT(t), cfg, other); err != nil {
		t.Fatal(err)
	}
	got, err := p.List(ctxT(t), cfg, map[string]string{providers.TagFleet: "Fleet With Caps & Spaces"})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, in := range got {
		ids = append(ids, in.ID)
		if in.Tags[providers.TagFleet] != "Fleet With Caps & Spaces" {
			t.Errorf("%s: fleet tag %q", in.ID, in.Tags[providers.TagFleet])
		}
	}
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Errorf("List over pages of 2: %v, want %v", ids, want)
	}
	all, err := p.List(ctxT(t), cfg, nil)
	if err != nil || len(all) != 6 {
		t.Errorf("List without tags: %d instances (%v), want 6", len(all), err)
	}
}

func TestOfferings(t *testing.T) {
	zones := []fakegce.Zone{
		{Name: "us-central1-a"},
		// No T4 here: the N1 offering (which needs one) is left out.
		{Name: "europe-west4-a", AcceleratorTypes: []fakegce.AcceleratorTypeSpec{{Name: "nvidia-tesla-v100", MaxPerVM: 8}}},
	}
	_, cfg := newFake(t, fakegce.Options{Zones: zones}, map[string]any{
		"zones":         []string{"us-central1-a", "europe-west4-a"},
		"machine_types": []string{"a2-highgpu-8g", "a3-highgpu-8g", "g2-standard-24", "n1-standard-8"},
		"prices":        map[string]any{"a3-highgpu-8g": map[string]any{"spot": 25.0}, "g2-standard-24/europe-west4": map[string]any{"on_demand": 9.5}},
	})
	offs, err := newProvider().Offerings(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	byKey := map[string]providers.Offering{}
	for _, o := range offs {
		byKey[o.Key()] = o
	}
	cases := []struct {
		key                string
		gpus               int
		gpuType            string
		vcpus              int
		memGiB, price      float64
		wantAbsent         bool
		priceApproximately bool
	}{
		{key: "gcp/us-central1/us-central1-a/a2-highgpu-8g/on-demand", gpus: 8, gpuType: "A100", vcpus: 96, memGiB: 680, price: 29.3871},
		{key: "gcp/us-central1/us-central1-a/a2-highgpu-8g/spot", gpus: 8, gpuType: "A100", vcpus: 96, memGiB: 680, price: 15.4242},
		{key: "gcp/us-central1/us-central1-a/a3-highgpu-8g/spot", gpus: 8, gpuType: "H100", vcpus: 208, memGiB: 1872, price: 25},
		{key: "gcp/us-central1/us-central1-a/a3-highgpu-8g/on-demand", gpus: 8, gpuType: "H100", vcpus: 208, memGiB: 1872, price: 88.49},
		{key: "gcp/us-central1/us-central1-a/g2-standard-24/spot", gpus: 2, gpuType: "L4", vcpus: 24, memGiB: 96, price: 1.12482},
		{key: "gcp/europe-west4/europe-west4-a/g2-standard-24/on-demand", gpus: 2, gpuType: "L4", vcpus: 24, memGiB: 96, price: 9.5},
		// n1-standard-8 + 1 × T4 at the bundled prices.
		{key: "gcp/us-central1/us-central1-a/n1-standard-8/spot", gpus: 1, gpuType: "T4", vcpus: 8, memGiB: 30, price: 0.13402 + 0.11},
		{key: "gcp/us-central1/us-central1-a/n1-standard-8/on-demand", gpus: 1, gpuType: "T4", vcpus: 8, memGiB: 30, price: 0.379998 + 0.35},
		{key: "gcp/europe-west4/europe-west4-a/n1-standard-8/spot", wantAbsent: true},
	}
	for _, tc := range cases {
		o, ok := byKey[tc.key]
		if tc.wantAbsent {
			if ok {
				t.Errorf("%s offered, want absent", tc.key)
			}
			continue
		}
		if !ok {
			t.Errorf("%s missing from %d offerings", tc.key, len(offs))
			continue
		}
		if o.GPUs != tc.gpus || o.GPUType != tc.gpuType || o.VCPUs != tc.vcpus || o.MemoryGiB != tc.memGiB || math.Abs(o.PricePerHour-tc.price) > 1e-6 || o.Available != -1 || o.Arch != "amd64" {
			t.Errorf("%s = %+v, want %d×%s, %d vCPUs, %v GiB, $%v", tc.key, o, tc.gpus, tc.gpuType, tc.vcpus, tc.memGiB, tc.price)
		}
	}
	if len(offs) != 14 {
		t.Errorf("%d offerings, want 14 (4 types × 2 zones × 2, minus N1 in europe-west4)", len(offs))
	}
}

func TestConfigErrors(t *testing.T) {
	f := fakegce.New(fakegce.Options{})
	defer f.Close()
	p := newProvider()
	cases := map[string]map[string]any{
		"unknown attribute":         {"zone": "us-central1-a"},
		"no project":                {"project": nil},
		"bad zone":                  {"zones": []string{"us-central1"}},
		"unknown zone":              {"zones": []string{"mars-north1-a"}},
		"no image":                  {"image": nil},
		"unknown machine type":      {"machine_types": []string{"z9-ultragpu-1g"}},
		"no price":                  {"machine_types": []string{"e2-standard-4"}},
		"bad accelerator":           {"accelerators": map[string]any{"type": "nvidia-tesla-t4", "count": 0}},
		"too many accelerators":     {"accelerators": map[string]any{"type": "nvidia-tesla-t4", "count": 8}},
		"bad prices":                {"prices": map[string]any{"a2-highgpu-1g": map[string]any{"spot": -1}}},
		"prices with unknown field": {"prices": map[string]any{"a2-highgpu-1g": map[string]any{"reserved": 1}}},
		"wrong project":             {"project": "someone-elses"},
	}
	for name, extra := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := p.Offerings(ctxT(t), blockFor(t, f, extra))
			if !providers.IsInvalidConfig(err) {
				t.Errorf("Offerings: %v, want invalid config", err)
			}
		})
	}
	// A priced type passes once the block prices it.
	ok := blockFor(t, f, map[string]any{"machine_types": []string{"e2-standard-4"}, "prices": map[string]any{"e2-standard-4": map[string]any{"spot": 0.05, "on_demand": 0.13}}})
	if offs, err := p.Offerings(ctxT(t), ok); err != nil || len(offs) != 4 {
		t.Errorf("Offerings with a priced e2: %v, %v", offs, err)
	}
}

func TestUnreachableIsTransient(t *testing.T) {
	f := fakegce.New(fakegce.Options{})
	cfg := blockFor(t, f, nil)
	f.Close()
	_, err := newProvider().Offerings(ctxT(t), cfg)
	if !providers.IsTransient(err) {
		t.Errorf("Offerings against a closed endpoint: %v, want transient", err)
	}
}

func TestBlockDecodesFromSchema(t *testing.T) {
	// Every schema attribute is accepted by the decoder (and nothing else).
	block := map[string]any{}
	for _, a := range gcp.Schema.Attributes {
		switch a.Type {
		case providers.TypeString:
			block[a.Name] = "x"
		case providers.TypeListString:
			block[a.Name] = []string{"x"}
		case providers.TypeNumber:
			block[a.Name] = 100
		case providers.TypeBool:
			block[a.Name] = false
		case providers.TypeJSON:
			block[a.Name] = map[string]any{}
		}
	}
	raw, _ := json.Marshal(block)
	_, err := newProvider().Offerings(ctxT(t), providers.Config{Raw: raw})
	// The values are nonsense, so the block is invalid, but not because of
	// an attribute the decoder does not know.
	if !providers.IsInvalidConfig(err) || strings.Contains(err.Error(), "unknown field") {
		t.Errorf("Offerings: %v", err)
	}
}

// TestMachineArch maps GCE's architecture field, and the machine series
// when the field is missing, to the agent binary a node needs.
func TestMachineArch(t *testing.T) {
	tests := []struct {
		name, arch, want string
	}{
		{"a3-highgpu-8g", "X86_64", "amd64"},
		{"c4a-standard-8", "ARM64", "arm64"},
		{"a4x-highgpu-4g", "", "arm64"},
		{"t2a-standard-4", "", "arm64"},
		{"c4a-highmem-72", "ARCHITECTURE_UNSPECIFIED", "arm64"},
		{"g2-standard-24", "", "amd64"},
		{"n1-standard-8", "ARCHITECTURE_UNSPECIFIED", "amd64"},
	}
	for _, tt := range tests {
		mt := &computepb.MachineType{Name: proto.String(tt.name)}
		if tt.arch != "" {
			mt.Architecture = proto.String(tt.arch)
		}
		if got := gcp.MachineArch(mt); got != tt.want {
			t.Errorf("%s (architecture %q) = %q, want %q", tt.name, tt.arch, got, tt.want)
		}
	}
}

// TestTwoDaemonsSameNodeIDInOneProject: two daemons whose fleets share a
// name (and even a node id) launch in one project. Their tokens differ
// (fleetd puts the daemon id in them), so the instance names differ and
// each gets its own instance; neither adopts the other's.
func TestTwoDaemonsSameNodeIDInOneProject(t *testing.T) {
	f, p, cfg := newTestProvider(t)
	off := offering(t, p, cfg, "us-central1-a", "g2-standard-8", providers.Spot)
	var ids []string
	for _, daemon := range []string{"d1", "d2"} {
		req := launchReq(off, "demo-k3v9x2ab-1-7fqa")
		req.Tags[providers.TagDaemonID] = daemon
		req.IdempotencyToken = daemon + ".demo-k3v9x2ab-1-7fqa"
		ins, err := p.Create(ctxT(t), cfg, req)
		if err != nil || len(ins) != 1 {
			t.Fatalf("daemon %s: Create = %v, %v", daemon, ins, err)
		}
		if got := ins[0].Tags[providers.TagDaemonID]; got != daemon {
			t.Errorf("daemon %s got an instance tagged for %q", daemon, got)
		}
		ids = append(ids, ins[0].ID)
	}
	if ids[0] == ids[1] {
		t.Fatalf("both daemons got instance %s", ids[0])
	}
	wantCreated(t, f, 2)
}
