package fakefsx_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/fsx"
	"github.com/aws/aws-sdk-go-v2/service/fsx/types"

	"github.com/fleetd/fleetd/providers/aws/fakefsx"
)

// TestRealClient: the SDK's FSx client decodes the fake's answers into
// its types, per region, and its unknown-id error into the typed
// FileSystemNotFound.
func TestRealClient(t *testing.T) {
	f := fakefsx.New()
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	f.Add("us-east-1", fakefsx.FileSystem{FileSystemID: "fs-1", FileSystemType: "LUSTRE", Lifecycle: "AVAILABLE", VpcID: "vpc-1",
		SubnetIDs: []string{"subnet-1"}, NetworkInterfaceIDs: []string{"eni-1"}})
	f.Add("us-west-2", fakefsx.FileSystem{FileSystemID: "fs-2", FileSystemType: "LUSTRE", Lifecycle: "CREATING"})
	client := func(region string) *fsx.Client {
		return fsx.NewFromConfig(awssdk.Config{Region: region, BaseEndpoint: awssdk.String(srv.URL),
			Credentials: credentials.NewStaticCredentialsProvider("AKID", "secret", "")})
	}
	ctx := context.Background()
	cases := []struct {
		name, region string
		ids          []string
		want         []string // ids answered
		notFound     bool
	}{
		{name: "by id", region: "us-east-1", ids: []string{"fs-1"}, want: []string{"fs-1"}},
		{name: "all of a region", region: "us-west-2", want: []string{"fs-2"}},
		{name: "another region's id", region: "us-west-2", ids: []string{"fs-1"}, notFound: true},
		{name: "unknown", region: "us-east-1", ids: []string{"fs-1", "fs-9"}, notFound: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := client(tc.region).DescribeFileSystems(ctx, &fsx.DescribeFileSystemsInput{FileSystemIds: tc.ids})
			var nf *types.FileSystemNotFound
			if tc.notFound {
				if !errors.As(err, &nf) {
					t.Fatalf("err %v, want FileSystemNotFound", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, fs := range out.FileSystems {
				got = append(got, awssdk.ToString(fs.FileSystemId))
			}
			if len(got) != len(tc.want) || got[0] != tc.want[0] {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
	out, err := client("us-east-1").DescribeFileSystems(ctx, &fsx.DescribeFileSystemsInput{FileSystemIds: []string{"fs-1"}})
	if err != nil {
		t.Fatal(err)
	}
	fs := out.FileSystems[0]
	if fs.Lifecycle != types.FileSystemLifecycleAvailable || fs.FileSystemType != types.FileSystemTypeLustre || awssdk.ToString(fs.VpcId) != "vpc-1" ||
		len(fs.SubnetIds) != 1 || len(fs.NetworkInterfaceIds) != 1 || awssdk.ToString(fs.DNSName) != "fs-1.fsx.us-east-1.amazonaws.com" {
		t.Errorf("decoded %+v", fs)
	}
}
