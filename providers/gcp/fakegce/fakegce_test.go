package fakegce_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/fleetd/fleetd/providers/gcp/fakegce"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/option"
	"google.golang.org/protobuf/proto"
)

// These tests make the real cloud.google.com/go/compute REST clients parse
// every shape the fake serves, so the fake cannot drift from the wire
// format the provider meets in production.

type clients struct {
	in  *compute.InstancesClient
	ops *compute.ZoneOperationsClient
	mts *compute.MachineTypesClient
	acc *compute.AcceleratorTypesClient
}

func setup(t *testing.T) (*fakegce.Server, clients, context.Context) {
	t.Helper()
	f := fakegce.New(fakegce.Options{})
	t.Cleanup(f.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	opts := []option.ClientOption{option.WithEndpoint(f.URL), option.WithoutAuthentication()}
	var c clients
	var err error
	if c.in, err = compute.NewInstancesRESTClient(ctx, opts...); err != nil {
		t.Fatal(err)
	}
	if c.ops, err = compute.NewZoneOperationsRESTClient(ctx, opts...); err != nil {
		t.Fatal(err)
	}
	if c.mts, err = compute.NewMachineTypesRESTClient(ctx, opts...); err != nil {
		t.Fatal(err)
	}
	if c.acc, err = compute.NewAcceleratorTypesRESTClient(ctx, opts...); err != nil {
		t.Fatal(err)
	}
	return f, c, ctx
}

func spotInstance(name, zone string, labels map[string]string) *computepb.Instance {
	return &computepb.Instance{
		Name:        proto.String(name),
		MachineType: proto.String("zones/" + zone + "/machineTypes/g2-standard-8"),
		Labels:      labels,
		Scheduling: &computepb.Scheduling{
			ProvisioningModel: proto.String("SPOT"), InstanceTerminationAction: proto.String("DELETE"),
			AutomaticRestart: proto.Bool(false), OnHostMaintenance: proto.String("TERMINATE"),
		},
		Disks: []*computepb.AttachedDisk{{Boot: proto.Bool(true), AutoDelete: proto.Bool(true),
			InitializeParams: &computepb.AttachedDiskInitializeParams{SourceImage: proto.String("projects/debian-cloud/global/images/family/debian-12"), DiskSizeGb: proto.Int64(50)}}},
		NetworkInterfaces: []*computepb.NetworkInterface{{Network: proto.String("global/networks/default")}},
		Metadata:          &computepb.Metadata{Items: []*computepb.Items{{Key: proto.String("user-data"), Value: proto.String("#cloud-config\n")}}},
	}
}

func insert(t *testing.T, c clients, ctx context.Context, project, zone, reqID string, in *computepb.Instance) *computepb.Operation {
	t.Helper()
	op, err := c.in.Insert(ctx, &computepb.InsertInstanceRequest{Project: project, Zone: zone, RequestId: proto.String(reqID), InstanceResource: in})
	if err != nil {
		t.Fatalf("Insert: %v", err)
	}
	return op.Proto()
}

func waitDone(t *testing.T, c clients, ctx context.Context, project, zone string, op *computepb.Operation) *computepb.Operation {
	t.Helper()
	for i := 0; op.GetStatus() != computepb.Operation_DONE; i++ {
		if i > 50 {
			t.Fatalf("operation %s never DONE", op.GetName())
		}
		var err error
		if op, err = c.ops.Wait(ctx, &computepb.WaitZoneOperationRequest{Project: project, Zone: zone, Operation: op.GetName()}); err != nil {
			t.Fatalf("Wait: %v", err)
		}
	}
	return op
}

func TestMachineAndAcceleratorTypes(t *testing.T) {
	f, c, ctx := setup(t)
	it := c.mts.List(ctx, &computepb.ListMachineTypesRequest{Project: f.Project(), Zone: "us-central1-a",
		Filter: proto.String(`(name = "a3-highgpu-8g") OR (name = "n1-standard-8")`)})
	got := map[string]*computepb.MachineType{}
	for mt, err := range it.All() {
		if err != nil {
			t.Fatal(err)
		}
		got[mt.GetName()] = mt
	}
	a3 := got["a3-highgpu-8g"]
	if len(got) != 2 || a3.GetGuestCpus() != 208 || a3.GetMemoryMb() != 1916928 || a3.GetZone() != "us-central1-a" ||
		len(a3.GetAccelerators()) != 1 || a3.GetAccelerators()[0].GetGuestAcceleratorType() != "nvidia-h100-80gb" || a3.GetAccelerators()[0].GetGuestAcceleratorCount() != 8 {
		t.Errorf("machine types: %d (%v), a3-highgpu-8g = %v", len(got), slices.Collect(maps.Keys(got)), a3)
	}
	if len(got["n1-standard-8"].GetAccelerators()) != 0 || got["n1-standard-8"].GetId() == 0 {
		t.Errorf("n1-standard-8 = %v", got["n1-standard-8"])
	}
	ait := c.acc.List(ctx, &computepb.ListAcceleratorTypesRequest{Project: f.Project(), Zone: "us-central1-a"})
	at, err := ait.Next()
	if err != nil || at.GetName() != "nvidia-tesla-t4" || at.GetMaximumCardsPerInstance() != 4 || at.GetZone() == "" {
		t.Errorf("first accelerator type %v, %v", at, err)
	}
}

func TestInsertWaitGetDelete(t *testing.T) {
	f, c, ctx := setup(t)
	p := f.Project()
	f.SetOperationPolls(2)
	op := insert(t, c, ctx, p, "us-central1-a", "6f1c3c8e-0000-4000-8000-000000000001", spotInstance("vm-1", "us-central1-a", map[string]string{"fleetd-fleet": "a"}))
	if op.GetStatus() == computepb.Operation_DONE || op.GetOperationType() != "insert" || op.GetTargetId() == 0 || op.GetInsertTime() == "" {
		t.Fatalf("insert operation %v", op)
	}
	got, err := c.in.Get(ctx, &computepb.GetInstanceRequest{Project: p, Zone: "us-central1-a", Instance: "vm-1"})
	if err != nil || got.GetStatus() != "PROVISIONING" {
		t.Fatalf("Get while provisioning: %v, %v", got.GetStatus(), err)
	}
	done := waitDone(t, c, ctx, p, "us-central1-a", op)
	if done.GetError() != nil || done.GetProgress() != 100 || done.GetEndTime() == "" {
		t.Errorf("done operation %v", done)
	}
	if _, err := time.Parse(time.RFC3339Nano, done.GetInsertTime()); err != nil {
		t.Errorf("insertTime: %v", err)
	}
	got, err = c.in.Get(ctx, &computepb.GetInstanceRequest{Project: p, Zone: "us-central1-a", Instance: "vm-1"})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetStatus() != "RUNNING" || got.GetId() != op.GetTargetId() || got.GetScheduling().GetProvisioningModel() != "SPOT" ||
		got.GetNetworkInterfaces()[0].GetNetworkIP() == "" || got.GetDisks()[0].GetDiskSizeGb() != 50 || got.GetLabels()["fleetd-fleet"] != "a" ||
		got.GetMetadata().GetItems()[0].GetValue() != "#cloud-config\n" {
		t.Errorf("instance %v", got)
	}
	if _, err := time.Parse(time.RFC3339Nano, got.GetCreationTimestamp()); err != nil {
		t.Errorf("creationTimestamp: %v", err)
	}
	dop, err := c.in.Delete(ctx, &computepb.DeleteInstanceRequest{Project: p, Zone: "us-central1-a", Instance: "vm-1"})
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, c, ctx, p, "us-central1-a", dop.Proto())
	_, err = c.in.Get(ctx, &computepb.GetInstanceRequest{Project: p, Zone: "us-central1-a", Instance: "vm-1"})
	var ge *googleapi.Error
	if !errors.As(err, &ge) || ge.Code != 404 || len(ge.Errors) != 1 || ge.Errors[0].Reason != "notFound" {
		t.Errorf("Get after delete: %v", err)
	}
}

func TestRequestIDAndConflicts(t *testing.T) {
	f, c, ctx := setup(t)
	p := f.Project()
	const rid = "6f1c3c8e-0000-4000-8000-000000000002"
	first := insert(t, c, ctx, p, "us-central1-a", rid, spotInstance("vm-2", "us-central1-a", nil))
	again := insert(t, c, ctx, p, "us-central1-a", rid, spotInstance("vm-2", "us-central1-a", nil))
	if again.GetName() != first.GetName() || f.Stats().InstancesCreated != 1 {
		t.Errorf("same requestId: operation %s then %s, %d created", first.GetName(), again.GetName(), f.Stats().InstancesCreated)
	}
	cases := []struct {
		name   string
		reqID  string
		in     *computepb.Instance
		status int
		reason string
	}{
		{"same name", "6f1c3c8e-0000-4000-8000-000000000003", spotInstance("vm-2", "us-central1-a", nil), 409, "alreadyExists"},
		{"requestId not a UUID", "retry-1", spotInstance("vm-3", "us-central1-a", nil), 400, "invalid"},
		{"bad name", "6f1c3c8e-0000-4000-8000-000000000004", spotInstance("VM_3", "us-central1-a", nil), 400, "invalid"},
		{"bad label", "6f1c3c8e-0000-4000-8000-000000000005", spotInstance("vm-3", "us-central1-a", map[string]string{"Fleet": "x"}), 400, "invalid"},
		{"machine type of another zone", "6f1c3c8e-0000-4000-8000-000000000006", spotInstance("vm-3", "us-central1-b", nil), 400, "invalid"},
		{"spot with restart", "6f1c3c8e-0000-4000-8000-000000000007", func() *computepb.Instance {
			in := spotInstance("vm-3", "us-central1-a", nil)
			in.Scheduling.AutomaticRestart = proto.Bool(true)
			return in
		}(), 400, "invalid"},
		{"GPU VM that live-migrates", "6f1c3c8e-0000-4000-8000-000000000008", func() *computepb.Instance {
			in := spotInstance("vm-3", "us-central1-a", nil)
			in.Scheduling = &computepb.Scheduling{ProvisioningModel: proto.String("STANDARD")}
			return in
		}(), 400, "invalid"},
		{"T4 on a G2", "6f1c3c8e-0000-4000-8000-000000000009", func() *computepb.Instance {
			in := spotInstance("vm-3", "us-central1-a", nil)
			in.GuestAccelerators = []*computepb.AcceleratorConfig{{AcceleratorType: proto.String("zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4"), AcceleratorCount: proto.Int32(1)}}
			return in
		}(), 400, "invalid"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			zone := "us-central1-a"
			_, err := c.in.Insert(ctx, &computepb.InsertInstanceRequest{Project: p, Zone: zone, RequestId: proto.String(tc.reqID), InstanceResource: tc.in})
			var ge *googleapi.Error
			if !errors.As(err, &ge) || ge.Code != tc.status || len(ge.Errors) == 0 || ge.Errors[0].Reason != tc.reason || ge.Message == "" {
				t.Errorf("Insert: %v, want %d %s", err, tc.status, tc.reason)
			}
		})
	}
}

func TestFaults(t *testing.T) {
	f, c, ctx := setup(t)
	p := f.Project()
	f.SetStockout("us-central1-a", true)
	op := insert(t, c, ctx, p, "us-central1-a", "6f1c3c8e-0000-4000-8000-00000000000a", spotInstance("vm-4", "us-central1-a", nil))
	done := waitDone(t, c, ctx, p, "us-central1-a", op)
	errs := done.GetError().GetErrors()
	if len(errs) != 1 || errs[0].GetCode() != "ZONE_RESOURCE_POOL_EXHAUSTED" || errs[0].GetMessage() == "" || done.GetHttpErrorStatusCode() != 503 {
		t.Errorf("stockout operation %v", done)
	}
	if _, ok := f.Instance("us-central1-a", "vm-4"); ok {
		t.Error("a stocked-out insert created the instance")
	}
	// The same stockout through the client's own Operation.Wait, which
	// turns httpErrorStatusCode into an error.
	h, err := c.in.Insert(ctx, &computepb.InsertInstanceRequest{Project: p, Zone: "us-central1-a", RequestId: proto.String("6f1c3c8e-0000-4000-8000-00000000000b"), InstanceResource: spotInstance("vm-5", "us-central1-a", nil)})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Wait(ctx); err == nil {
		t.Error("Operation.Wait of a stocked-out insert: nil error")
	}

	f.SetInsertFault("", &fakegce.Fault{HTTPStatus: 429, Reason: "rateLimitExceeded", Message: "Rate Limit Exceeded", Count: 1})
	_, err = c.in.Insert(ctx, &computepb.InsertInstanceRequest{Project: p, Zone: "us-central1-b", RequestId: proto.String("6f1c3c8e-0000-4000-8000-00000000000c"), InstanceResource: spotInstance("vm-6", "us-central1-b", nil)})
	var ge *googleapi.Error
	if !errors.As(err, &ge) || ge.Code != 429 || ge.Errors[0].Reason != "rateLimitExceeded" {
		t.Errorf("throttled insert: %v", err)
	}
	// Count 1: the next insert goes through.
	op = insert(t, c, ctx, p, "us-central1-b", "6f1c3c8e-0000-4000-8000-00000000000d", spotInstance("vm-6", "us-central1-b", nil))
	if done := waitDone(t, c, ctx, p, "us-central1-b", op); done.GetError() != nil {
		t.Errorf("insert after the counted fault: %v", done.GetError())
	}
}

func TestAggregatedListAndPreemptions(t *testing.T) {
	f, c, ctx := setup(t)
	p := f.Project()
	for i, zone := range []string{"us-central1-a", "us-central1-b", "us-central1-a", "us-central1-b", "us-central1-a"} {
		fleet := "a"
		if i == 4 {
			fleet = "b"
		}
		name := "vm-" + string(rune('a'+i))
		op := insert(t, c, ctx, p, zone, "6f1c3c8e-0000-4000-8000-0000000001"+string(rune('a'+i))+"0", spotInstance(name, zone, map[string]string{"fleetd-fleet": fleet}))
		waitDone(t, c, ctx, p, zone, op)
	}
	it := c.in.AggregatedList(ctx, &computepb.AggregatedListInstancesRequest{Project: p, Filter: proto.String(`(labels.fleetd-fleet = "a") (status = RUNNING)`), MaxResults: proto.Uint32(2)})
	var names []string
	pages := 0
	for pair, err := range it.All() {
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range pair.Value.GetInstances() {
			names = append(names, in.GetName())
		}
		if pair.Value.GetWarning().GetCode() == "NO_RESULTS_ON_PAGE" {
			continue
		}
		pages++
	}
	if len(names) != 4 || pages < 2 {
		t.Errorf("aggregated list of fleet a: %v over %d non-empty scopes", names, pages)
	}

	pre, err := f.Preempt("us-central1-a", "vm-a")
	if err != nil {
		t.Fatal(err)
	}
	oit := c.ops.List(ctx, &computepb.ListZoneOperationsRequest{Project: p, Zone: "us-central1-a", Filter: proto.String(`operationType="compute.instances.preempted"`)})
	var ops []*computepb.Operation
	for op, err := range oit.All() {
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops, op)
	}
	if len(ops) != 1 || ops[0].GetName() != pre.Name || ops[0].GetStatus() != computepb.Operation_DONE || ops[0].GetTargetId() == 0 ||
		ops[0].GetTargetLink() != fakegce.APIBase+"projects/"+p+"/zones/us-central1-a/instances/vm-a" || ops[0].GetStatusMessage() == "" {
		t.Errorf("preempted operations %v", ops)
	}
	got, _ := c.in.Get(ctx, &computepb.GetInstanceRequest{Project: p, Zone: "us-central1-a", Instance: "vm-a"})
	if got.GetStatus() != "TERMINATED" || got.GetLastStopTimestamp() == "" {
		t.Errorf("preempted instance %v", got)
	}
	_, err = c.ops.List(ctx, &computepb.ListZoneOperationsRequest{Project: p, Zone: "us-central1-a", Filter: proto.String(`operationType = (`)}).Next()
	var ge *googleapi.Error
	if !errors.As(err, &ge) || ge.Code != 400 {
		t.Errorf("bad filter: %v, want 400", err)
	}
}
