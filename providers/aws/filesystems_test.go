package aws_test

import (
	"errors"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/efs"
	efstypes "github.com/aws/aws-sdk-go-v2/service/efs/types"

	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/aws"
	"github.com/fleetd/fleetd/providers/aws/fakefsx"
	"github.com/fleetd/fleetd/providers/aws/motoserver"
)

// fsWorld is a VPC for the nodes and one elsewhere, in moto, with file
// systems in both: EFS in moto itself, FSx for Lustre in fakefsx (moto's
// FSx has no Lifecycle, VPC or network interfaces), whose network
// interfaces are moto ENIs carrying the file systems' security groups.
type fsWorld struct {
	srv       *motoserver.Server
	fsxURL    string
	nodes     motoserver.Network // us-east-1a, us-east-1b
	elsewhere motoserver.Network
	fsx       map[string]string // name → FSx id
	efs       map[string]string // name → EFS id
}

const fsRegion = "us-east-1"

func newFSWorld(t *testing.T) fsWorld {
	t.Helper()
	ctx := ctxT(t)
	srv := motoserver.Shared(t)
	w := fsWorld{srv: srv, fsx: map[string]string{}, efs: map[string]string{}}
	var err error
	if w.nodes, err = srv.SetupNetwork(ctx, fsRegion, []string{"us-east-1a", "us-east-1b"}); err != nil {
		t.Fatal(err, srv.LogTail())
	}
	if w.elsewhere, err = srv.SetupNetwork(ctx, fsRegion, []string{"us-east-1a"}); err != nil {
		t.Fatal(err)
	}
	c := srv.EC2(fsRegion)
	fromNodes := func(from, to int32) ec2types.IpPermission {
		return ec2types.IpPermission{IpProtocol: awssdk.String("tcp"), FromPort: awssdk.Int32(from), ToPort: awssdk.Int32(to),
			UserIdGroupPairs: []ec2types.UserIdGroupPair{{GroupId: awssdk.String(w.nodes.SecurityGroup)}}}
	}
	fromCIDR := func(cidr string, from, to int32) ec2types.IpPermission {
		return ec2types.IpPermission{IpProtocol: awssdk.String("tcp"), FromPort: awssdk.Int32(from), ToPort: awssdk.Int32(to),
			IpRanges: []ec2types.IpRange{{CidrIp: awssdk.String(cidr)}}}
	}
	sg := func(vpc, name string, perms ...ec2types.IpPermission) string {
		out, err := c.CreateSecurityGroup(ctx, &ec2.CreateSecurityGroupInput{GroupName: awssdk.String(name + "-" + vpc), Description: awssdk.String(name), VpcId: awssdk.String(vpc)})
		if err != nil {
			t.Fatal(err)
		}
		if len(perms) > 0 {
			if _, err := c.AuthorizeSecurityGroupIngress(ctx, &ec2.AuthorizeSecurityGroupIngressInput{GroupId: out.GroupId, IpPermissions: perms}); err != nil {
				t.Fatal(err)
			}
		}
		return awssdk.ToString(out.GroupId)
	}
	lustre := sg(w.nodes.VPC, "lustre", fromNodes(988, 988), fromNodes(1018, 1023))
	lustreCIDR := sg(w.nodes.VPC, "lustre-cidr", fromCIDR("10.0.0.0/16", 0, 65535))
	lustreHalf := sg(w.nodes.VPC, "lustre-half", fromNodes(988, 988))
	nfs := sg(w.nodes.VPC, "nfs", fromNodes(2049, 2049))
	ssh := sg(w.nodes.VPC, "ssh", fromCIDR("0.0.0.0/0", 22, 22))
	far := sg(w.elsewhere.VPC, "far", fromCIDR("0.0.0.0/0", 0, 65535))

	fake := fakefsx.New()
	hs := httptest.NewServer(fake)
	t.Cleanup(hs.Close)
	w.fsxURL = hs.URL
	lustreFS := func(name, id, lifecycle, vpc, subnet, group string) {
		eni, err := c.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: awssdk.String(subnet), Groups: []string{group}})
		if err != nil {
			t.Fatal(err)
		}
		fake.Add(fsRegion, fakefsx.FileSystem{FileSystemID: id, FileSystemType: "LUSTRE", Lifecycle: lifecycle, StorageCapacity: 1200,
			VpcID: vpc, SubnetIDs: []string{subnet}, NetworkInterfaceIDs: []string{awssdk.ToString(eni.NetworkInterface.NetworkInterfaceId)}})
		w.fsx[name] = id
	}
	a := w.nodes.Subnets["us-east-1a"]
	lustreFS("ok", "fs-0aaaaaaaaaaaaaaa1", "AVAILABLE", w.nodes.VPC, a, lustre)
	lustreFS("cidr", "fs-0aaaaaaaaaaaaaaa2", "AVAILABLE", w.nodes.VPC, a, lustreCIDR)
	lustreFS("half", "fs-0aaaaaaaaaaaaaaa3", "AVAILABLE", w.nodes.VPC, a, lustreHalf)
	lustreFS("closed", "fs-0aaaaaaaaaaaaaaa4", "AVAILABLE", w.nodes.VPC, a, ssh)
	lustreFS("creating", "fs-0aaaaaaaaaaaaaaa5", "CREATING", w.nodes.VPC, a, lustre)
	lustreFS("far", "fs-0aaaaaaaaaaaaaaa6", "AVAILABLE", w.elsewhere.VPC, w.elsewhere.Subnets["us-east-1a"], far)

	ec := efs.NewFromConfig(srv.Config(fsRegion))
	efsFS := func(name, zone string, mounts map[string]string) {
		in := &efs.CreateFileSystemInput{CreationToken: awssdk.String(name + "-" + w.nodes.VPC)}
		if zone != "" {
			in.AvailabilityZoneName = awssdk.String(zone)
		}
		fs, err := ec.CreateFileSystem(ctx, in)
		var exists *efstypes.FileSystemAlreadyExists
		if errors.As(err, &exists) {
			// The SDK retried a create whose first answer was lost (a
			// loaded moto): the creation token makes it idempotent.
			var out *efs.DescribeFileSystemsOutput
			if out, err = ec.DescribeFileSystems(ctx, &efs.DescribeFileSystemsInput{CreationToken: in.CreationToken}); err == nil {
				if len(out.FileSystems) != 1 {
					t.Fatalf("%d file systems with token %s", len(out.FileSystems), *in.CreationToken)
				}
				fs = &efs.CreateFileSystemOutput{FileSystemId: out.FileSystems[0].FileSystemId}
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		for subnet, group := range mounts {
			if _, err := ec.CreateMountTarget(ctx, &efs.CreateMountTargetInput{FileSystemId: fs.FileSystemId, SubnetId: awssdk.String(subnet), SecurityGroups: []string{group}}); err != nil {
				t.Fatal(err)
			}
		}
		w.efs[name] = awssdk.ToString(fs.FileSystemId)
	}
	b := w.nodes.Subnets["us-east-1b"]
	efsFS("ok", "", map[string]string{a: nfs, b: nfs})
	efsFS("closed", "", map[string]string{a: ssh, b: ssh})
	efsFS("one-a", "", map[string]string{a: nfs})
	efsFS("onezone", "us-east-1b", map[string]string{b: nfs})
	efsFS("none", "", nil)
	return w
}

func (w fsWorld) block(zones ...string) map[string]any {
	subnets := map[string]string{}
	for _, z := range zones {
		subnets[z] = w.nodes.Subnets[z]
	}
	return map[string]any{
		"regions":                 []string{fsRegion},
		"instance_types":          []string{"g5.xlarge"},
		"image":                   w.nodes.Image,
		"subnets":                 subnets,
		"security_groups":         []string{w.nodes.SecurityGroup},
		"endpoint":                w.srv.URL(),
		"service_quotas_endpoint": w.srv.URL(),
		"efs_endpoint":            w.srv.URL(),
		"fsx_endpoint":            w.fsxURL,
	}
}

func fsCheck(scheme, id, zone string, zones ...string) providers.FileSystemCheck {
	return providers.FileSystemCheck{Source: scheme + "://" + id, Scheme: scheme, Host: id, Region: fsRegion, Zone: zone, Zones: zones}
}

// fsRows are the file-system rows of a report.
func fsRows(rs []providers.CheckResult) []providers.CheckResult {
	var out []providers.CheckResult
	for _, r := range rs {
		if strings.HasPrefix(r.Check, "file system") {
			out = append(out, r)
		}
	}
	return out
}

func TestCheckFileSystemsMoto(t *testing.T) {
	w := newFSWorld(t)
	// After moto started: it must not inherit the empty AWS_PROFILE.
	motoserver.UseStaticKeys(t)
	ab := []string{"us-east-1a", "us-east-1b"}
	cases := []struct {
		name  string
		zones []string // the block's subnets
		fs    providers.FileSystemCheck
		// failed are the checks that must fail, exactly; fix a substring
		// of the first one's fix. Every other file-system row is ok.
		failed []string
		fix    string
		rows   int
	}{
		{name: "fsx ok", zones: ab, fs: fsCheck("fsx", w.fsx["ok"], "us-east-1a"), rows: 4},
		{name: "fsx ingress from a CIDR", zones: ab, fs: fsCheck("fsx", w.fsx["cidr"], "us-east-1a"), rows: 4},
		{name: "fsx required zone", zones: ab, fs: fsCheck("fsx", w.fsx["ok"], "us-east-1a", "us-east-1a"), rows: 4},
		{name: "fsx missing", zones: ab, fs: fsCheck("fsx", "fs-0000000000000dead", ""), rows: 1,
			failed: []string{"file system"}, fix: "aws fsx describe-file-systems --region us-east-1"},
		{name: "fsx not available", zones: ab, fs: fsCheck("fsx", w.fsx["creating"], ""), rows: 1,
			failed: []string{"file system"}, fix: "wait until it is available"},
		{name: "fsx wrong zone in the data block", zones: ab, fs: fsCheck("fsx", w.fsx["ok"], "us-east-1b"), rows: 4,
			failed: []string{"file system zone"}, fix: `zone = "us-east-1a"`},
		{name: "fsx outside the block's zones", zones: []string{"us-east-1b"}, fs: fsCheck("fsx", w.fsx["ok"], ""), rows: 4,
			failed: []string{"file system zone"}, fix: "add a subnet in us-east-1a"},
		{name: "fsx in another VPC", zones: ab, fs: fsCheck("fsx", w.fsx["far"], "us-east-1a"), rows: 4,
			failed: []string{"file system VPC"}, fix: "subnets of " + w.elsewhere.VPC},
		{name: "fsx without the Lustre ports", zones: ab, fs: fsCheck("fsx", w.fsx["closed"], "us-east-1a"), rows: 4,
			failed: []string{"file system ingress"}, fix: "--port 988-988 --source-group " + w.nodes.SecurityGroup},
		{name: "fsx with 988 but not 1018-1023", zones: ab, fs: fsCheck("fsx", w.fsx["half"], "us-east-1a"), rows: 4,
			failed: []string{"file system ingress"}, fix: "allow TCP 1018-1023"},
		{name: "efs ok", zones: ab, fs: fsCheck("efs", w.efs["ok"], ""), rows: 4},
		{name: "efs one zone ok", zones: ab, fs: fsCheck("efs", w.efs["onezone"], "us-east-1b"), rows: 4},
		{name: "efs one zone in the wrong zone", zones: ab, fs: fsCheck("efs", w.efs["onezone"], "us-east-1a"), rows: 4,
			failed: []string{"file system zone"}, fix: `zone = "us-east-1b"`},
		{name: "efs missing", zones: ab, fs: fsCheck("efs", "fs-00000dead", ""), rows: 1,
			failed: []string{"file system"}, fix: "aws efs describe-file-systems"},
		{name: "efs without mount targets", zones: ab, fs: fsCheck("efs", w.efs["none"], ""), rows: 1,
			failed: []string{"file system"}, fix: "create-mount-target"},
		{name: "efs without a mount target in a zone of the block", zones: ab, fs: fsCheck("efs", w.efs["one-a"], ""), rows: 4,
			failed: []string{"file system zone"}, fix: "create-mount-target"},
		{name: "efs without NFS", zones: ab, fs: fsCheck("efs", w.efs["closed"], ""), rows: 4,
			failed: []string{"file system ingress"}, fix: "--port 2049-2049"},
		{name: "data in another region", zones: ab, fs: providers.FileSystemCheck{Source: "efs://fs-1", Scheme: "efs", Host: "fs-1", Region: "eu-west-1"}, rows: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := aws.New(testOptions()).Check(ctxT(t), config(t, "fs", w.block(tc.zones...)),
				providers.CheckOptions{TargetNodes: 1, FileSystems: []providers.FileSystemCheck{tc.fs}})
			if err != nil {
				t.Fatal(err)
			}
			rows := fsRows(rs)
			if len(rows) != tc.rows {
				t.Fatalf("%d file-system rows, want %d: %+v", len(rows), tc.rows, rows)
			}
			var failed []string
			var fixes []string
			for _, r := range rows {
				switch r.Status {
				case providers.CheckFailed:
					failed = append(failed, r.Check)
					fixes = append(fixes, r.Fix)
				case providers.CheckOK:
				default:
					if tc.name != "data in another region" {
						t.Errorf("row %+v is %s", r, r.Status)
					}
				}
			}
			if !slices.Equal(failed, tc.failed) {
				t.Fatalf("failed rows %q, want %q: %+v", failed, tc.failed, rows)
			}
			if tc.fix != "" && !strings.Contains(fixes[0], tc.fix) {
				t.Errorf("fix %q does not say %q", fixes[0], tc.fix)
			}
		})
	}
	t.Run("quick skips them", func(t *testing.T) {
		rs, err := aws.New(testOptions()).Check(ctxT(t), config(t, "fs", w.block(ab...)),
			providers.CheckOptions{Quick: true, FileSystems: []providers.FileSystemCheck{fsCheck("fsx", "fs-0000000000000dead", "")}})
		if err != nil {
			t.Fatal(err)
		}
		if rows := fsRows(rs); len(rows) != 0 {
			t.Errorf("quick check has file-system rows: %+v", rows)
		}
	})
}
