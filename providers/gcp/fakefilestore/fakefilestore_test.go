package fakefilestore_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	file "google.golang.org/api/file/v1"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/option"

	"github.com/fleetd/fleetd/providers/gcp/fakefilestore"
)

// TestRealClient: the file/v1 client lists the fake's instances by
// location and across pages, decodes their shares and networks, and
// reads a denial as a googleapi 403.
func TestRealClient(t *testing.T) {
	f := fakefilestore.New("p-test")
	t.Cleanup(f.Close)
	f.SetPageSize(2)
	for i := range 5 {
		f.Add("us-central1-a", fmt.Sprintf("fs-%d", i), "share", "default", fmt.Sprintf("10.0.0.%d", i), "")
	}
	f.Add("europe-west4-b", "far", "vol", "projects/host/global/networks/shared", "10.9.0.2", "CREATING")
	ctx := context.Background()
	svc, err := file.NewService(ctx, option.WithEndpoint(f.URL+"/"), option.WithoutAuthentication())
	if err != nil {
		t.Fatal(err)
	}
	list := func(project, loc string) ([]*file.Instance, error) {
		var out []*file.Instance
		err := svc.Projects.Locations.Instances.List("projects/"+project+"/locations/"+loc).Pages(ctx, func(r *file.ListInstancesResponse) error {
			out = append(out, r.Instances...)
			return nil
		})
		return out, err
	}
	cases := []struct {
		loc  string
		want int
	}{{"-", 6}, {"us-central1-a", 5}, {"europe-west4-b", 1}, {"us-east1-b", 0}}
	for _, tc := range cases {
		got, err := list("p-test", tc.loc)
		if err != nil || len(got) != tc.want {
			t.Errorf("list %s: %d instances (%v), want %d", tc.loc, len(got), err, tc.want)
		}
	}
	far, _ := list("p-test", "europe-west4-b")
	if in := far[0]; in.State != "CREATING" || in.FileShares[0].Name != "vol" || in.FileShares[0].CapacityGb != 2560 ||
		in.Networks[0].IpAddresses[0] != "10.9.0.2" || in.Networks[0].Network != "projects/host/global/networks/shared" {
		t.Errorf("decoded %+v", in)
	}
	var ge *googleapi.Error
	if _, err := list("other", "-"); !errors.As(err, &ge) || ge.Code != http.StatusForbidden {
		t.Errorf("another project: %v, want 403", err)
	}
	f.Deny("denied")
	if _, err := list("p-test", "-"); !errors.As(err, &ge) || ge.Code != http.StatusForbidden || ge.Message != "denied" {
		t.Errorf("denied: %v", err)
	}
}
