package fakegce

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/api/option"
	"google.golang.org/protobuf/proto"
)

// TestCompactPlacementAndGPUNICs drives the resource-policy routes and a
// multi-NIC a3 insert through the real compute clients (every exchange is
// checked against the discovery document by this package's harness).
func TestCompactPlacementAndGPUNICs(t *testing.T) {
	f := New(Options{})
	t.Cleanup(f.Close)
	p := f.Project()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	opts := []option.ClientOption{option.WithEndpoint(f.URL), option.WithoutAuthentication()}
	rps, err := compute.NewResourcePoliciesRESTClient(ctx, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer rps.Close()
	rops, err := compute.NewRegionOperationsRESTClient(ctx, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer rops.Close()
	ins, err := compute.NewInstancesRESTClient(ctx, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer ins.Close()

	const region, name = "us-central1", "fleetd-bert-k3x9-us-central1-a"
	subs, err := compute.NewSubnetworksRESTClient(ctx, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer subs.Close()
	f.AddSubnetwork(region, "gpu-1")
	if sn, err := subs.Get(ctx, &computepb.GetSubnetworkRequest{Project: p, Region: region, Subnetwork: "gpu-1"}); err != nil || !strings.HasSuffix(sn.GetNetwork(), "/global/networks/gpu-1-net") {
		t.Fatalf("subnetwork %v, %v", sn, err)
	}
	if _, err := subs.Get(ctx, &computepb.GetSubnetworkRequest{Project: p, Region: region, Subnetwork: "gpu-9"}); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("unknown subnetwork: %v", err)
	}
	op, err := rps.Insert(ctx, &computepb.InsertResourcePolicyRequest{Project: p, Region: region, ResourcePolicyResource: &computepb.ResourcePolicy{
		Name: proto.String(name), Description: proto.String("fleetd compact placement"),
		GroupPlacementPolicy: &computepb.ResourcePolicyGroupPlacementPolicy{Collocation: proto.String("COLLOCATED")}}})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := rops.Get(ctx, &computepb.GetRegionOperationRequest{Project: p, Region: region, Operation: op.Name()}); err != nil || got.GetStatus() != computepb.Operation_DONE || got.GetOperationType() != "insert" {
		t.Fatalf("region operation %v, %v", got, err)
	}
	if _, err := rops.Wait(ctx, &computepb.WaitRegionOperationRequest{Project: p, Region: region, Operation: op.Name()}); err != nil {
		t.Fatal(err)
	}
	got, err := rps.Get(ctx, &computepb.GetResourcePolicyRequest{Project: p, Region: region, ResourcePolicy: name})
	if err != nil || got.GetGroupPlacementPolicy().GetCollocation() != "COLLOCATED" || got.GetStatus() != "READY" {
		t.Fatalf("policy %v, %v", got, err)
	}
	if _, err := rps.Insert(ctx, &computepb.InsertResourcePolicyRequest{Project: p, Region: region, ResourcePolicyResource: &computepb.ResourcePolicy{
		Name: proto.String(name), GroupPlacementPolicy: &computepb.ResourcePolicyGroupPlacementPolicy{Collocation: proto.String("COLLOCATED")}}}); err == nil || !strings.Contains(err.Error(), "409") {
		t.Errorf("second insert: %v, want alreadyExists", err)
	}

	vm := func(name string, gpuNICs int, policy string) *computepb.Instance {
		res := &computepb.Instance{Name: proto.String(name), MachineType: proto.String("zones/us-central1-a/machineTypes/a3-highgpu-8g"),
			Scheduling: &computepb.Scheduling{OnHostMaintenance: proto.String("TERMINATE"), ProvisioningModel: proto.String("SPOT"), InstanceTerminationAction: proto.String("DELETE")},
			Disks: []*computepb.AttachedDisk{{Boot: proto.Bool(true), AutoDelete: proto.Bool(true), Type: proto.String("PERSISTENT"),
				InitializeParams: &computepb.AttachedDiskInitializeParams{SourceImage: proto.String("projects/p/global/images/i")}}},
			NetworkInterfaces: []*computepb.NetworkInterface{{Subnetwork: proto.String("regions/us-central1/subnetworks/mgmt"), NicType: proto.String("GVNIC")}},
		}
		for i := 1; i <= gpuNICs; i++ {
			res.NetworkInterfaces = append(res.NetworkInterfaces, &computepb.NetworkInterface{
				Subnetwork: proto.String("regions/us-central1/subnetworks/gpu-" + strconv.Itoa(i)), NicType: proto.String("GVNIC")})
		}
		if policy != "" {
			res.ResourcePolicies = []string{policy}
		}
		return res
	}
	link := "projects/" + p + "/regions/us-central1/resourcePolicies/" + name
	if _, err := ins.Insert(ctx, &computepb.InsertInstanceRequest{Project: p, Zone: "us-central1-a", InstanceResource: vm("vm-1", 4, link)}); err != nil {
		t.Fatalf("a3-highgpu-8g with 4 GPU NICs in the policy: %v", err)
	}
	for _, c := range []struct {
		name, policy string
		nics         int
		want         string
	}{
		{"vm-2", link, 2, "takes 5 gVNIC and 0 MRDMA interfaces"},
		{"vm-3", "projects/" + p + "/regions/us-central1/resourcePolicies/nope", 4, "does not exist"},
	} {
		if _, err := ins.Insert(ctx, &computepb.InsertInstanceRequest{Project: p, Zone: "us-central1-a", InstanceResource: vm(c.name, c.nics, c.policy)}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	inst, ok := f.Instance("us-central1-a", "vm-1")
	if !ok || len(inst.NetworkInterfaces) != 5 || inst.NetworkInterfaces[4].NicType != "GVNIC" || len(inst.ResourcePolicies) != 1 {
		t.Fatalf("vm-1 as stored: %+v", inst)
	}
	if _, err := rps.Delete(ctx, &computepb.DeleteResourcePolicyRequest{Project: p, Region: region, ResourcePolicy: name}); err == nil || !strings.Contains(err.Error(), "already being used") {
		t.Errorf("delete of a used policy: %v", err)
	}
	f.Remove("us-central1-a", "vm-1")
	if _, err := rps.Delete(ctx, &computepb.DeleteResourcePolicyRequest{Project: p, Region: region, ResourcePolicy: name}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, err := rps.Get(ctx, &computepb.GetResourcePolicyRequest{Project: p, Region: region, ResourcePolicy: name}); err == nil {
		t.Error("policy still there after delete")
	}
}
