package main

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/efs"

	"github.com/fleetd/fleetd/providers/aws/fakefsx"
)

// TestCheckFileSystemsAgainstMoto: `fleetd check` (the real daemon, POST
// /v1/check, its aws provider) verifies a fleet's file-system datasets:
// an EFS in moto whose mount targets admit the nodes on NFS, and an FSx
// for Lustre (in fakefsx: moto's FSx has no lifecycle, VPC or network
// interfaces) whose network interface's group admits them, pass; an EFS
// whose group allows only SSH, and an FSx id that does not exist, get ✗
// rows with their fixes under the provider block, and exit 1.
func TestCheckFileSystemsAgainstMoto(t *testing.T) {
	ctx, w := eastMotoWorld(t)
	n := w.nets["us-east-1"]
	c := w.moto.EC2("us-east-1")
	group := func(name string, port int32) string {
		sg, err := c.CreateSecurityGroup(ctx, &ec2.CreateSecurityGroupInput{GroupName: awssdk.String(name), Description: awssdk.String(name), VpcId: awssdk.String(n.VPC)})
		if err != nil {
			t.Fatal(err)
		}
		perm := ec2types.IpPermission{IpProtocol: awssdk.String("tcp"), FromPort: awssdk.Int32(port), ToPort: awssdk.Int32(port),
			UserIdGroupPairs: []ec2types.UserIdGroupPair{{GroupId: awssdk.String(n.SecurityGroup)}}}
		if port == 988 {
			perm.ToPort = awssdk.Int32(1023) // 988 and 1018-1023 in one rule
		}
		if _, err := c.AuthorizeSecurityGroupIngress(ctx, &ec2.AuthorizeSecurityGroupIngressInput{GroupId: sg.GroupId, IpPermissions: []ec2types.IpPermission{perm}}); err != nil {
			t.Fatal(err)
		}
		return awssdk.ToString(sg.GroupId)
	}
	nfs, ssh, lustre := group("nfs", 2049), group("ssh", 22), group("lustre", 988)
	ec := efs.NewFromConfig(w.moto.Config("us-east-1"))
	newEFS := func(token, sg string) string {
		fs, err := ec.CreateFileSystem(ctx, &efs.CreateFileSystemInput{CreationToken: awssdk.String(token)})
		if err != nil {
			t.Fatal(err)
		}
		for _, z := range []string{"us-east-1a", "us-east-1b"} {
			if _, err := ec.CreateMountTarget(ctx, &efs.CreateMountTargetInput{FileSystemId: fs.FileSystemId, SubnetId: awssdk.String(n.Subnets[z]), SecurityGroups: []string{sg}}); err != nil {
				t.Fatal(err)
			}
		}
		return awssdk.ToString(fs.FileSystemId)
	}
	efsOK, efsClosed := newEFS("open", nfs), newEFS("closed", ssh)
	eni, err := c.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: awssdk.String(n.Subnets["us-east-1a"]), Groups: []string{lustre}})
	if err != nil {
		t.Fatal(err)
	}
	fake := fakefsx.New()
	fsxSrv := httptest.NewServer(fake)
	t.Cleanup(fsxSrv.Close)
	const fsxOK, fsxMissing = "fs-0aaaaaaaaaaaaaaa1", "fs-0000000000000dead"
	fake.Add("us-east-1", fakefsx.FileSystem{FileSystemID: fsxOK, FileSystemType: "LUSTRE", Lifecycle: "AVAILABLE", VpcID: n.VPC,
		SubnetIDs: []string{n.Subnets["us-east-1a"]}, NetworkInterfaceIDs: []string{awssdk.ToString(eni.NetworkInterface.NetworkInterfaceId)}})

	data := func(source, mount, zone string) string {
		z := ""
		if zone != "" {
			z = fmt.Sprintf("zone = %q", zone)
		}
		return fmt.Sprintf("  data {\n    source = %q\n    mount_path = %q\n    size_gb = 100\n    region = \"us-east-1\"\n    %s\n  }\n", source, mount, z)
	}
	path := writeTemp(t, "fs.hcl", fmt.Sprintf(`
fleet "fs" {
  min_nodes = 1
  max_nodes = 2
  node { gpus = 1 }
%s
  training {
    command = ["python3", "train.py"]
%s%s%s%s  }
}
`, w.eastProvider(fmt.Sprintf("fsx_endpoint = %q", fsxSrv.URL)),
		data("fsx://"+fsxOK, "/fsx", "us-east-1a"), data("fsx://"+fsxMissing, "/fsx2", "us-east-1a"),
		data("efs://"+efsOK, "/efs", ""), data("efs://"+efsClosed, "/efs2", "")))
	bin := fleetdBinary(t)
	d := startDaemon(t, bin, t.TempDir(), freeAddr(t))
	out, errOut, code := d.cli(t, bin, "check", path)
	t.Logf("fleetd check (exit %d):\n%s", code, out)
	if code != 1 {
		t.Errorf("exit %d, want 1\n%s", code, errOut)
	}
	// row: mark, check, scope; each wanted in the provider block's table.
	rows := []struct{ mark, check, scope, text string }{
		{"✓", "file system", "fsx://" + fsxOK, "FSx for Lustre " + fsxOK + " is available"},
		{"✓", "file system zone", "fsx://" + fsxOK, "nodes in us-east-1b mount it across zones"},
		{"✓", "file system VPC", "fsx://" + fsxOK, n.VPC + ", the nodes' VPC"},
		{"✓", "file system ingress", "fsx://" + fsxOK, "admits the nodes on TCP 988 and TCP 1018-1023"},
		{"✗", "file system", "fsx://" + fsxMissing, fsxMissing + " not found in us-east-1"},
		{"✓", "file system", "efs://" + efsOK, "EFS " + efsOK + " is available"},
		{"✓", "file system zone", "efs://" + efsOK, "EFS in us-east-1a, us-east-1b, where the job may run"},
		{"✓", "file system ingress", "efs://" + efsOK, nfs + " admits the nodes on TCP 2049"},
		{"✗", "file system ingress", "efs://" + efsClosed, "does not admit the nodes on TCP 2049"},
	}
	header := strings.Index(out, `fleet "fs", provider "aws"`)
	for _, r := range rows {
		found := false
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) > 2 && f[0] == r.mark && strings.HasPrefix(strings.Join(f[1:], " "), r.check+" "+r.scope+" ") && strings.Contains(line, r.text) {
				found = header >= 0 && strings.Index(out, line) > header
			}
		}
		if !found {
			t.Errorf("no %s row %q %q saying %q under the aws block", r.mark, r.check, r.scope, r.text)
		}
	}
	for _, fix := range []string{
		"fix: check the id and region of the data block (`aws fsx describe-file-systems --region us-east-1` lists them)",
		"fix: allow TCP 2049 from the nodes' security group " + n.SecurityGroup + ": `aws ec2 authorize-security-group-ingress --group-id " + ssh,
	} {
		if !strings.Contains(out, fix) {
			t.Errorf("no %q in the output", fix)
		}
	}
	if !strings.Contains(out, "2 check(s) failed") {
		t.Errorf("summary does not say 2 failed")
	}
}
