package fakegce

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
	"google.golang.org/protobuf/proto"
)

func apis(t *testing.T) *apiSet {
	t.Helper()
	a, err := loadAPIs()
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestSchemaChecker(t *testing.T) {
	c := apis(t).docs[0].checker // compute
	cases := []struct {
		name   string
		schema string // a compute schema, or "legacy"/"rpc" for an error envelope
		body   string
		want   string // a substring of the one problem expected; "" for none
	}{
		{"valid instance", "Instance", `{"kind":"compute#instance","id":"4100000000000007919","name":"vm-1","status":"RUNNING",
			"labels":{"fleetd-fleet":"a"},"disks":[{"index":0,"diskSizeGb":"50","boot":true}],"scheduling":{"provisioningModel":"SPOT"}}`, ""},
		{"misspelt field", "Instance", `{"machinetype":"zones/a/machineTypes/n1"}`, `Instance: unknown field "machinetype" (did you mean "machineType"?)`},
		{"invented field", "Instance", `{"preemptedAt":"now"}`, `Instance: unknown field "preemptedAt"`},
		{"uint64 as a number", "Instance", `{"id":4100000000000007919}`, `Instance.id: number 4100000000000007919, want a string (uint64)`},
		{"int64 string not a number", "Instance", `{"disks":[{"diskSizeGb":"ten"}]}`, `Instance.disks[0].diskSizeGb: "ten" is not a valid int64`},
		{"int32 as a string", "Instance", `{"disks":[{"index":"0"}]}`, `Instance.disks[0].index: string "0", want an integer`},
		{"fractional integer", "Operation", `{"progress":99.5}`, `Operation.progress: 99.5 is not an integer`},
		{"int32 out of range", "Operation", `{"progress":4294967296}`, `out of int32 range`},
		{"number", "Quota", `{"limit":2400.5,"usage":"3"}`, `Quota.usage: string "3", want a number`},
		{"boolean as a string", "Instance", `{"canIpForward":"false"}`, `Instance.canIpForward: string "false", want a boolean`},
		{"value outside the enum", "Instance", `{"status":"BOOTING"}`, `Instance.status: "BOOTING" is not one of the enum values`},
		{"nested enum", "Instance", `{"scheduling":{"provisioningModel":"PREEMPTIBLE"}}`, `Instance.scheduling.provisioningModel: "PREEMPTIBLE" is not one of`},
		{"wrong kind", "Instance", `{"kind":"compute#instanceList"}`, `Instance.kind: "compute#instanceList", want "compute#instance"`},
		{"map value", "Instance", `{"labels":{"team":7}}`, `Instance.labels["team"]: number 7, want a string`},
		{"map of $ref", "InstanceAggregatedList", `{"items":{"zones/us-central1-a":{"instances":[{"nmae":"vm"}]}}}`,
			`InstanceAggregatedList.items["zones/us-central1-a"].instances[0]: unknown field "nmae"`},
		{"inline object", "InstanceList", `{"warning":{"code":"NO_RESULTS_ON_PAGE","data":[{"key":"scope","valeu":"x"}]}}`,
			`InstanceList.warning.data[0]: unknown field "valeu"`},
		{"null", "Instance", `{"zone":null}`, `Instance.zone: null`},
		{"object for an array", "Instance", `{"disks":{}}`, `Instance.disks: object, want an array`},
		{"byte format", "Instance", `{"fingerprint":"not base64!"}`, `is not a valid byte`},
		{"name pattern", "MachineType", `{"name":"N1_Standard"}`, `does not match the pattern`},
		{"unresolved $ref", "NoSuchSchema", `{}`, `unresolved $ref "NoSuchSchema"`},
		{"body not an object", "Instance", `[]`, `Instance: array, want an object`},
		{"data after the body", "Instance", `{} {}`, `data after the JSON value`},
		{"not JSON", "Instance", `<html>`, `body is not JSON`},
		{"compute error", "legacy", `{"error":{"code":404,"message":"gone","errors":[{"message":"gone","domain":"global","reason":"notFound"}]}}`, ""},
		{"compute error with status", "legacy", `{"error":{"code":429,"message":"slow down","status":"RESOURCE_EXHAUSTED",
			"errors":[{"message":"slow down","domain":"usageLimits","reason":"rateLimitExceeded"}]}}`, ""},
		{"compute error without errors", "legacy", `{"error":{"code":404,"message":"gone","status":"NOT_FOUND"}}`, `required field "errors" is missing`},
		{"error without code", "legacy", `{"error":{"message":"gone","errors":[{"message":"gone","domain":"global","reason":"notFound"}]}}`, `required field "code" is missing`},
		{"error item without reason", "legacy", `{"error":{"code":404,"message":"gone","errors":[{"message":"gone","domain":"global"}]}}`, `required field "reason" is missing`},
		{"error with an unknown field", "legacy", `{"error":{"code":404,"message":"gone","errors":[],"reasons":["notFound"]}}`, `unknown field "reasons"`},
		{"error status outside the enum", "legacy", `{"error":{"code":404,"message":"gone","errors":[],"status":"Not Found"}}`, `"Not Found" is not one of`},
		{"rpc error", "rpc", `{"error":{"code":403,"message":"denied","status":"PERMISSION_DENIED",
			"details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"SERVICE_DISABLED","metadata":{"service":"x"}}]}}`, ""},
		{"rpc error without status", "rpc", `{"error":{"code":403,"message":"denied"}}`, `required field "status" is missing`},
		{"rpc detail without @type", "rpc", `{"error":{"code":403,"message":"denied","status":"PERMISSION_DENIED","details":[{"reason":"X"}]}}`, `required field "@type" is missing`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := &dschema{Ref: tc.schema}
			switch tc.schema {
			case "legacy":
				s = legacyErrors
			case "rpc":
				s = rpcErrors
			}
			wantProblem(t, c.body([]byte(tc.body), s, tc.schema), tc.want)
		})
	}
}

// wantProblem checks a checker's problems: none when want is "", else
// exactly one, containing want.
func wantProblem(t *testing.T, got []string, want string) {
	t.Helper()
	switch {
	case want == "" && len(got) > 0:
		t.Errorf("problems %q, want none", got)
	case want != "" && (len(got) != 1 || !strings.Contains(got[0], want)):
		t.Errorf("problems %q, want one containing %q", got, want)
	}
}

func TestMethodFor(t *testing.T) {
	a := apis(t)
	cases := []struct {
		verb, path string
		want       string // discovery method id; "" when the request is no method
	}{
		{"GET", "/compute/v1/projects/p/zones/us-central1-a/instances/vm-1", "compute.instances.get"},
		{"HEAD", "/compute/v1/projects/p/zones/us-central1-a/instances/vm-1", "compute.instances.get"},
		{"PUT", "/compute/v1/projects/p/zones/us-central1-a/instances/vm-1", "compute.instances.update"},
		{"POST", "/compute/v1/projects/p/zones/us-central1-a/operations/operation-1/wait", "compute.zoneOperations.wait"},
		{"GET", "/compute/v1/projects/p/aggregated/instances", "compute.instances.aggregatedList"},
		{"GET", "/compute/v1/projects/debian-cloud/global/images/family/debian-12", "compute.images.getFromFamily"}, // the literal wins
		{"GET", "/compute/v1/projects/debian-cloud/global/images/debian-12-bookworm", "compute.images.get"},
		{"GET", "/compute/v1/projects/p", "compute.projects.get"},
		{"POST", "/v1/projects/p:testIamPermissions", "cloudresourcemanager.projects.testIamPermissions"},
		{"POST", "/v1/projects/-/serviceAccounts/nodes@p.iam.gserviceaccount.com:testIamPermissions", "iam.projects.serviceAccounts.testIamPermissions"},
		{"GET", "/compute/v1/projects/p/zones/us-central1-a/instances/vm-1/start", ""}, // start is a POST
		{"GET", "/compute/v1/projects/p/zones/us-central1-a/instancez", ""},
		{"GET", "/compute/v2/projects/p", ""},
		{"GET", "/compute/v1/projects/p/zones/us-central1-a/instances/vm-1/", ""},
	}
	for _, tc := range cases {
		m, err := a.methodFor(tc.verb, tc.path)
		switch {
		case tc.want == "" && err == nil:
			t.Errorf("%s %s is %s, want no method", tc.verb, tc.path, m.ID)
		case tc.want != "" && (err != nil || m.ID != tc.want):
			t.Errorf("%s %s: %v, %v; want %s", tc.verb, tc.path, m, err, tc.want)
		}
	}
}

// servedBy is what a.servedRoutes makes of a mux with these route
// patterns.
func servedBy(a *apiSet, patterns ...string) map[string][]*dmethod {
	mux := http.NewServeMux()
	for _, p := range patterns {
		mux.HandleFunc(p, func(http.ResponseWriter, *http.Request) {})
	}
	return a.servedRoutes(mux)
}

func TestServedRoutes(t *testing.T) {
	a := apis(t)
	served := servedBy(a,
		"GET /compute/v1/projects/{project}/zones/{zone}/instances/{name}",
		"POST /v1/projects/{resource}",
		"GET /compute/v1/projects/{project}/invented",
		"/",
	)
	cases := []struct {
		pattern string
		want    string // a method the route serves; "" for none
	}{
		{"GET /compute/v1/projects/{project}/zones/{zone}/instances/{name}", "compute.instances.get"},
		{"POST /v1/projects/{resource}", "cloudresourcemanager.projects.testIamPermissions"},
		{"GET /compute/v1/projects/{project}/invented", ""},
		{"/", ""}, // the catch-all
	}
	for _, tc := range cases {
		var ids []string
		for _, m := range served[tc.pattern] {
			ids = append(ids, m.ID)
		}
		if (tc.want == "") != (len(ids) == 0) || (tc.want != "" && !slices.Contains(ids, tc.want)) {
			t.Errorf("route %q serves %v, want %q", tc.pattern, ids, tc.want)
		}
	}
}

func TestCheckExchange(t *testing.T) {
	a := apis(t)
	served := servedBy(a,
		"GET /compute/v1/projects/{project}/zones/{zone}/operations/{op}",
		"DELETE /compute/v1/projects/{project}/zones/{zone}/operations/{op}",
		"POST /v1/projects/{resource}",
		"GET /compute/v1/projects/{project}/invented",
		"/",
	)
	const (
		op       = "/compute/v1/projects/p/zones/z/operations/operation-1"
		opRoute  = "GET /compute/v1/projects/{project}/zones/{zone}/operations/{op}"
		crm      = "/v1/projects/p:testIamPermissions"
		crmRoute = "POST /v1/projects/{resource}"
		jsonType = "application/json; charset=UTF-8"
		notFound = `{"error":{"code":404,"message":"gone","errors":[{"message":"gone","domain":"global","reason":"notFound"}]}}`
	)
	cases := []struct {
		name string
		e    exchange
		want string // a substring of the one problem expected; "" for none
	}{
		{"operation", exchange{method: "GET", path: op, pattern: opRoute, status: 200, contentType: jsonType,
			body: []byte(`{"kind":"compute#operation","id":"1","status":"DONE","progress":100}`)}, ""},
		{"misspelt operation", exchange{method: "GET", path: op, pattern: opRoute, status: 200, contentType: jsonType,
			body: []byte(`{"kind":"compute#operation","Status":"DONE"}`)}, `compute.zoneOperations.get): Operation: unknown field "Status" (did you mean "status"?)`},
		{"compute error", exchange{method: "GET", path: op, pattern: opRoute, status: 404, contentType: jsonType, body: []byte(notFound)}, ""},
		{"compute error in the rpc shape", exchange{method: "GET", path: op, pattern: opRoute, status: 404, contentType: jsonType,
			body: []byte(`{"error":{"code":404,"message":"gone","status":"NOT_FOUND"}}`)}, `required field "errors" is missing`},
		{"error code and status differ", exchange{method: "GET", path: op, pattern: opRoute, status: 410, contentType: jsonType, body: []byte(notFound)},
			"error.code 404 differs from the HTTP status 410"},
		{"plain-text error", exchange{method: "GET", path: op, pattern: "", status: 405, contentType: "text/plain; charset=utf-8", body: []byte("Method Not Allowed\n")},
			`HTTP 405 with Content-Type "text/plain; charset=utf-8", want application/json`},
		{"redirect", exchange{method: "GET", path: op, pattern: opRoute, status: 301, contentType: jsonType}, "HTTP 301, want a 2xx success"},
		{"body of a method without a response", exchange{method: "DELETE", path: op, pattern: "DELETE /compute/v1/projects/{project}/zones/{zone}/operations/{op}",
			status: 200, contentType: jsonType, body: []byte(`{}`)}, "compute.zoneOperations.delete has no response body"},
		{"rpc error", exchange{method: "POST", path: crm, pattern: crmRoute, status: 403, contentType: jsonType,
			body: []byte(`{"error":{"code":403,"message":"denied","status":"PERMISSION_DENIED"}}`)}, ""},
		{"permissions", exchange{method: "POST", path: crm, pattern: crmRoute, status: 200, contentType: jsonType,
			body: []byte(`{"permissions":["compute.instances.create"]}`)}, ""},
		{"success to a request that is no method", exchange{method: "POST", path: "/v1/projects/p", pattern: crmRoute, status: 200, contentType: jsonType,
			body: []byte(`{}`)}, "to a request that is no API method"},
		{"catch-all error", exchange{method: "POST", path: "/compute/v1/projects/p/zones/z/instances/vm/start", pattern: "/", status: 404, contentType: jsonType,
			body: []byte(notFound)}, ""},
		{"catch-all success", exchange{method: "GET", path: "/nowhere", pattern: "/", status: 200, contentType: jsonType, body: []byte(`{}`)},
			"to a request that is no API method"},
		{"invented route", exchange{method: "GET", path: "/compute/v1/projects/p/invented", pattern: "GET /compute/v1/projects/{project}/invented",
			status: 404, contentType: jsonType, body: []byte(notFound)}, "serves no method of the discovery documents"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wantProblem(t, a.checkExchange(served, tc.e), tc.want)
		})
	}
}

// TestResponsesMatchDiscovery drives every route of the fake through the
// real clients, successes and failures, and checks each response against
// the discovery documents. (TestMain checks the other tests' traffic the
// same way, and that every route answered a success somewhere.)
func TestResponsesMatchDiscovery(t *testing.T) {
	a := apis(t)
	f := New(Options{})
	t.Cleanup(f.Close)
	p := f.Project()
	const za, zb = "us-central1-a", "us-central1-b"

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	opts := []option.ClientOption{option.WithEndpoint(f.URL), option.WithoutAuthentication()}
	in, err1 := compute.NewInstancesRESTClient(ctx, opts...)
	ops, err2 := compute.NewZoneOperationsRESTClient(ctx, opts...)
	mts, err3 := compute.NewMachineTypesRESTClient(ctx, opts...)
	acc, err4 := compute.NewAcceleratorTypesRESTClient(ctx, opts...)
	projects, err5 := compute.NewProjectsRESTClient(ctx, opts...)
	zones, err6 := compute.NewZonesRESTClient(ctx, opts...)
	regions, err7 := compute.NewRegionsRESTClient(ctx, opts...)
	images, err8 := compute.NewImagesRESTClient(ctx, opts...)
	if err := errors.Join(err1, err2, err3, err4, err5, err6, err7, err8); err != nil {
		t.Fatal(err)
	}
	for _, c := range []interface{ Close() error }{in, ops, mts, acc, projects, zones, regions, images} {
		defer c.Close()
	}
	// testIamPermissions of Resource Manager and IAM, which live on other
	// hosts, sent as the provider sends them (their generated clients
	// would add modules to go.mod).
	testPermissions := func(path string, perms ...string) error {
		body, _ := json.Marshal(map[string][]string{"permissions": perms})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.URL+path, bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		return googleapi.CheckResponse(resp)
	}

	// drain runs an iterator to its end.
	drain := func(next func() error) error {
		for {
			if err := next(); errors.Is(err, iterator.Done) {
				return nil
			} else if err != nil {
				return err
			}
		}
	}
	vm := func(name, zone, typ string, spot bool) *computepb.Instance {
		res := &computepb.Instance{
			Name: proto.String(name), Description: proto.String("fleetd node"),
			MachineType: proto.String("zones/" + zone + "/machineTypes/" + typ),
			Labels:      map[string]string{"fleetd-fleet": "bert", "fleetd-node": name},
			Scheduling:  &computepb.Scheduling{AutomaticRestart: proto.Bool(false), OnHostMaintenance: proto.String("TERMINATE"), ProvisioningModel: proto.String("STANDARD")},
			Disks: []*computepb.AttachedDisk{{Boot: proto.Bool(true), AutoDelete: proto.Bool(true), Type: proto.String("PERSISTENT"),
				InitializeParams: &computepb.AttachedDiskInitializeParams{
					SourceImage: proto.String("projects/deeplearning-platform-release/global/images/family/pytorch-latest-gpu"),
					DiskSizeGb:  proto.Int64(200), DiskType: proto.String("zones/" + zone + "/diskTypes/pd-balanced")}}},
			NetworkInterfaces: []*computepb.NetworkInterface{{
				Network: proto.String("global/networks/default"), Subnetwork: proto.String("regions/us-central1/subnetworks/train"),
				AccessConfigs: []*computepb.AccessConfig{{Name: proto.String("External NAT"), Type: proto.String("ONE_TO_ONE_NAT")}},
			}},
			Metadata: &computepb.Metadata{Items: []*computepb.Items{
				{Key: proto.String("user-data"), Value: proto.String("#cloud-config\n")},
				{Key: proto.String("fleetd-tags"), Value: proto.String(`{"fleetd-fleet":"bert"}`)},
			}},
			ServiceAccounts: []*computepb.ServiceAccount{{Email: proto.String("nodes@p.iam.gserviceaccount.com"),
				Scopes: []string{"https://www.googleapis.com/auth/cloud-platform"}}},
		}
		if spot {
			res.Scheduling.ProvisioningModel, res.Scheduling.InstanceTerminationAction = proto.String("SPOT"), proto.String("DELETE")
		}
		if strings.HasPrefix(typ, "n1-") {
			res.GuestAccelerators = []*computepb.AcceleratorConfig{{
				AcceleratorType: proto.String("zones/" + zone + "/acceleratorTypes/nvidia-tesla-t4"), AcceleratorCount: proto.Int32(1)}}
		}
		return res
	}
	insert := func(zone, rid string, res *computepb.Instance) (*compute.Operation, error) {
		return in.Insert(ctx, &computepb.InsertInstanceRequest{Project: p, Zone: zone, RequestId: proto.String(rid), InstanceResource: res})
	}
	var running *computepb.Operation // the insert operation of vm-1, left RUNNING
	waitAll := func(zone string) error {
		for _, o := range f.Operations(zone) {
			if _, err := ops.Wait(ctx, &computepb.WaitZoneOperationRequest{Project: p, Zone: zone, Operation: o.Name}); err != nil {
				return err
			}
		}
		return nil
	}

	steps := []struct {
		name   string
		method string // the discovery method the step must reach; "" for a route the fake does not serve
		status int    // the HTTP status it must answer
		do     func() error
	}{
		{"machine types, filtered and paged", "compute.machineTypes.list", 200, func() error {
			it := mts.List(ctx, &computepb.ListMachineTypesRequest{Project: p, Zone: za, MaxResults: proto.Uint32(3),
				Filter: proto.String(`(name = "a3-highgpu-8g") OR (name = "n1-standard-8") OR (name = "g2-standard-8") OR (name = "e2-standard-4")`)})
			return drain(func() error { _, err := it.Next(); return err })
		}},
		{"machine type", "compute.machineTypes.get", 200, func() error {
			_, err := mts.Get(ctx, &computepb.GetMachineTypeRequest{Project: p, Zone: za, MachineType: "a2-highgpu-1g"})
			return err
		}},
		{"unknown machine type", "compute.machineTypes.get", 404, func() error {
			_, err := mts.Get(ctx, &computepb.GetMachineTypeRequest{Project: p, Zone: za, MachineType: "z9-huge"})
			return err
		}},
		{"accelerator types", "compute.acceleratorTypes.list", 200, func() error {
			it := acc.List(ctx, &computepb.ListAcceleratorTypesRequest{Project: p, Zone: zb})
			return drain(func() error { _, err := it.Next(); return err })
		}},
		{"unknown zone", "compute.acceleratorTypes.list", 404, func() error {
			_, err := acc.List(ctx, &computepb.ListAcceleratorTypesRequest{Project: p, Zone: "mars-north1-a"}).Next()
			return err
		}},
		{"unknown project", "compute.instances.list", 404, func() error {
			_, err := in.List(ctx, &computepb.ListInstancesRequest{Project: "no-such-project", Zone: za}).Next()
			return err
		}},
		{"insert a spot VM with an attached GPU", "compute.instances.insert", 200, func() error {
			f.SetOperationPolls(1)
			op, err := insert(za, "6f1c3c8e-0000-4000-8000-000000000101", vm("vm-1", za, "n1-standard-8", true))
			if err == nil {
				running = op.Proto()
			}
			return err
		}},
		{"running operation", "compute.zoneOperations.get", 200, func() error {
			_, err := ops.Get(ctx, &computepb.GetZoneOperationRequest{Project: p, Zone: za, Operation: running.GetName()})
			return err
		}},
		{"operation waited to DONE", "compute.zoneOperations.wait", 200, func() error {
			f.SetOperationPolls(0)
			_, err := ops.Wait(ctx, &computepb.WaitZoneOperationRequest{Project: p, Zone: za, Operation: running.GetName()})
			return err
		}},
		{"instance", "compute.instances.get", 200, func() error {
			_, err := in.Get(ctx, &computepb.GetInstanceRequest{Project: p, Zone: za, Instance: "vm-1"})
			return err
		}},
		{"repeated requestId", "compute.instances.insert", 200, func() error {
			_, err := insert(za, "6f1c3c8e-0000-4000-8000-000000000101", vm("vm-1", za, "n1-standard-8", true))
			return err
		}},
		{"insert of an existing name", "compute.instances.insert", 409, func() error {
			_, err := insert(za, "6f1c3c8e-0000-4000-8000-000000000102", vm("vm-1", za, "n1-standard-8", true))
			return err
		}},
		{"invalid insert", "compute.instances.insert", 400, func() error {
			_, err := insert(za, "6f1c3c8e-0000-4000-8000-000000000103", vm("VM_2", za, "n1-standard-8", true))
			return err
		}},
		{"throttled insert", "compute.instances.insert", 429, func() error {
			f.SetInsertFault("", &Fault{HTTPStatus: 429, Reason: "rateLimitExceeded", Message: "Rate Limit Exceeded", Count: 1})
			_, err := insert(za, "6f1c3c8e-0000-4000-8000-000000000104", vm("vm-2", za, "g2-standard-8", true))
			return err
		}},
		{"insert over quota", "compute.instances.insert", 403, func() error {
			f.SetInsertFault("", &Fault{HTTPStatus: 403, Reason: "quotaExceeded", Message: "Quota 'NVIDIA_L4_GPUS' exceeded.  Limit: 0.0 in region us-central1.", Count: 1})
			_, err := insert(za, "6f1c3c8e-0000-4000-8000-000000000105", vm("vm-2", za, "g2-standard-8", true))
			return err
		}},
		{"stockout through Operation.Wait", "compute.zoneOperations.get", 200, func() error {
			f.SetStockout(za, true)
			defer f.SetStockout(za, false)
			op, err := insert(za, "6f1c3c8e-0000-4000-8000-000000000106", vm("vm-2", za, "g2-standard-8", true))
			if err != nil {
				return err
			}
			if err := op.Wait(ctx); err == nil {
				return errors.New("a stocked-out insert succeeded")
			}
			return nil
		}},
		{"async quota failure", "compute.zoneOperations.wait", 200, func() error {
			f.SetInsertFault(zb, QuotaFault("GPUS_ALL_REGIONS", ""))
			defer f.SetInsertFault(zb, nil)
			if _, err := insert(zb, "6f1c3c8e-0000-4000-8000-000000000107", vm("vm-3", zb, "g2-standard-8", true)); err != nil {
				return err
			}
			return waitAll(zb)
		}},
		{"on-demand VM with built-in GPUs", "compute.zoneOperations.wait", 200, func() error {
			if _, err := insert(zb, "6f1c3c8e-0000-4000-8000-000000000108", vm("vm-4", zb, "a2-highgpu-1g", false)); err != nil {
				return err
			}
			return waitAll(zb)
		}},
		{"instances of a fleet", "compute.instances.list", 200, func() error {
			it := in.List(ctx, &computepb.ListInstancesRequest{Project: p, Zone: za, Filter: proto.String(`labels.fleetd-fleet = "bert"`)})
			return drain(func() error { _, err := it.Next(); return err })
		}},
		{"bad filter", "compute.instances.list", 400, func() error {
			_, err := in.List(ctx, &computepb.ListInstancesRequest{Project: p, Zone: za, Filter: proto.String(`status = (`)}).Next()
			return err
		}},
		{"aggregated list, one instance a page", "compute.instances.aggregatedList", 200, func() error {
			it := in.AggregatedList(ctx, &computepb.AggregatedListInstancesRequest{Project: p, MaxResults: proto.Uint32(1),
				Filter: proto.String(`(labels.fleetd-fleet = "bert") (status = RUNNING)`)})
			return drain(func() error { _, err := it.Next(); return err })
		}},
		{"preemption in the operations list", "compute.zoneOperations.list", 200, func() error {
			if _, err := f.Preempt(za, "vm-1"); err != nil {
				return err
			}
			it := ops.List(ctx, &computepb.ListZoneOperationsRequest{Project: p, Zone: za, Filter: proto.String(`operationType = "compute.instances.preempted"`)})
			return drain(func() error { _, err := it.Next(); return err })
		}},
		{"delete", "compute.instances.delete", 200, func() error {
			op, err := in.Delete(ctx, &computepb.DeleteInstanceRequest{Project: p, Zone: za, Instance: "vm-1", RequestId: proto.String("6f1c3c8e-0000-4000-8000-000000000109")})
			if err != nil {
				return err
			}
			return op.Wait(ctx)
		}},
		{"deleted instance", "compute.instances.get", 404, func() error {
			_, err := in.Get(ctx, &computepb.GetInstanceRequest{Project: p, Zone: za, Instance: "vm-1"})
			return err
		}},
		{"delete of a missing instance", "compute.instances.delete", 404, func() error {
			_, err := in.Delete(ctx, &computepb.DeleteInstanceRequest{Project: p, Zone: za, Instance: "vm-1"})
			return err
		}},
		{"unknown operation", "compute.zoneOperations.get", 404, func() error {
			_, err := ops.Get(ctx, &computepb.GetZoneOperationRequest{Project: p, Zone: za, Operation: "operation-0-nope"})
			return err
		}},
		{"project", "compute.projects.get", 200, func() error {
			_, err := projects.Get(ctx, &computepb.GetProjectRequest{Project: p})
			return err
		}},
		{"zone", "compute.zones.get", 200, func() error {
			_, err := zones.Get(ctx, &computepb.GetZoneRequest{Project: p, Zone: zb})
			return err
		}},
		{"region with quotas in use", "compute.regions.get", 200, func() error {
			_, err := regions.Get(ctx, &computepb.GetRegionRequest{Project: p, Region: "us-central1"})
			return err
		}},
		{"unknown region", "compute.regions.get", 404, func() error {
			_, err := regions.Get(ctx, &computepb.GetRegionRequest{Project: p, Region: "mars-north1"})
			return err
		}},
		{"accelerator type", "compute.acceleratorTypes.get", 200, func() error {
			_, err := acc.Get(ctx, &computepb.GetAcceleratorTypeRequest{Project: p, Zone: za, AcceleratorType: "nvidia-tesla-t4"})
			return err
		}},
		{"unknown accelerator type", "compute.acceleratorTypes.get", 404, func() error {
			_, err := acc.Get(ctx, &computepb.GetAcceleratorTypeRequest{Project: p, Zone: za, AcceleratorType: "nvidia-tesla-k80"})
			return err
		}},
		{"deprecated image", "compute.images.get", 200, func() error {
			_, err := images.Get(ctx, &computepb.GetImageRequest{Project: "debian-cloud", Image: "debian-12-bookworm-v20260701"})
			return err
		}},
		{"unknown image", "compute.images.get", 404, func() error {
			_, err := images.Get(ctx, &computepb.GetImageRequest{Project: "debian-cloud", Image: "debian-7"})
			return err
		}},
		{"image of a family", "compute.images.getFromFamily", 200, func() error {
			_, err := images.GetFromFamily(ctx, &computepb.GetFromFamilyImageRequest{Project: "deeplearning-platform-release", Family: "pytorch-latest-gpu"})
			return err
		}},
		{"unknown image family", "compute.images.getFromFamily", 404, func() error {
			_, err := images.GetFromFamily(ctx, &computepb.GetFromFamilyImageRequest{Project: "debian-cloud", Family: "debian-7"})
			return err
		}},
		{"project permissions", "cloudresourcemanager.projects.testIamPermissions", 200, func() error {
			f.SetDeniedPermissions("compute.instances.delete")
			return testPermissions("/v1/projects/"+p+":testIamPermissions", "compute.instances.create", "compute.instances.delete")
		}},
		{"invalid permission", "cloudresourcemanager.projects.testIamPermissions", 400, func() error {
			return testPermissions("/v1/projects/"+p+":testIamPermissions", "compute.*")
		}},
		{"Resource Manager disabled", "cloudresourcemanager.projects.testIamPermissions", 403, func() error {
			f.SetResourceManagerDisabled(true)
			defer f.SetResourceManagerDisabled(false)
			return testPermissions("/v1/projects/"+p+":testIamPermissions", "compute.instances.create")
		}},
		{"service account permissions", "iam.projects.serviceAccounts.testIamPermissions", 200, func() error {
			return testPermissions("/v1/projects/-/serviceAccounts/nodes@p.iam.gserviceaccount.com:testIamPermissions", "iam.serviceAccounts.actAs")
		}},
		{"a method the fake does not serve", "", 404, func() error {
			_, err := in.Start(ctx, &computepb.StartInstanceRequest{Project: p, Zone: zb, Instance: "vm-4"})
			return err
		}},
		{"a verb the fake does not serve on a path it does", "", 404, func() error {
			_, err := in.Update(ctx, &computepb.UpdateInstanceRequest{Project: p, Zone: zb, Instance: "vm-4", InstanceResource: vm("vm-4", zb, "a2-highgpu-1g", false)})
			return err
		}},
	}

	served := a.servedRoutes(traffic.routes())
	seen := 0
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			err := st.do()
			if ok := st.status < 300; ok != (err == nil) {
				t.Errorf("client error %v, want HTTP %d", err, st.status)
			}
			all := traffic.of(f.URL)
			mine := all[seen:]
			seen = len(all)
			reached := false
			for _, e := range mine {
				for _, problem := range a.checkExchange(served, e) {
					t.Error(problem)
				}
				id := ""
				if m, err := a.methodFor(e.method, e.path); err == nil && e.pattern != "" && !isCatchAll(e.pattern) {
					id = m.ID
				}
				reached = reached || (id == st.method && e.status == st.status)
			}
			if !reached {
				t.Errorf("no response of %q with HTTP %d among %d requests", st.method, st.status, len(mine))
			}
		})
	}
}
