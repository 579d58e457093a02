package fleet

import (
	"reflect"
	"testing"

	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/providers"
)

// TestFileSystemChecks: a provider block's preflight gets the fleet's file
// systems of its own cloud only, with the zones zone_policy = "required"
// pins the job to.
func TestFileSystemChecks(t *testing.T) {
	fl := &spec.Fleet{Training: spec.Training{Data: []spec.Data{
		{Source: "s3://bucket/x", Region: "us-east-1"},
		{Source: "fsx://fs-0123456789abcdef0", Region: "us-east-1", Zone: "us-east-1a", ZonePolicy: spec.ZonePrefer},
		{Source: "efs://fs-0abc", Region: "us-east-1", Zone: "us-east-1b", ZonePolicy: spec.ZoneRequired},
		{Source: "filestore://10.0.0.2/share", Region: "us-central1", Zone: "us-central1-a", ZonePolicy: spec.ZonePrefer},
		{Source: "nfs://nas/export", ZonePolicy: spec.ZonePrefer},
	}}}
	cases := []struct {
		provider string
		want     []providers.FileSystemCheck
	}{
		{"aws", []providers.FileSystemCheck{
			{Source: "fsx://fs-0123456789abcdef0", Scheme: "fsx", Host: "fs-0123456789abcdef0", Region: "us-east-1", Zone: "us-east-1a"},
			{Source: "efs://fs-0abc", Scheme: "efs", Host: "fs-0abc", Region: "us-east-1", Zone: "us-east-1b", Zones: []string{"us-east-1b"}},
		}},
		{"gcp", []providers.FileSystemCheck{
			{Source: "filestore://10.0.0.2/share", Scheme: "filestore", Host: "10.0.0.2", Path: "/share", Region: "us-central1", Zone: "us-central1-a"},
		}},
		{"local", nil},
	}
	for _, tc := range cases {
		t.Run(tc.provider, func(t *testing.T) {
			if got := fileSystemChecks(fl, tc.provider); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}
