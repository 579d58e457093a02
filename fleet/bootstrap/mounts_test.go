package bootstrap

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetd/fleetd/fleet/spec"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

// mountData is one of each mounted source, and a bucket that is not mounted.
var mountData = []spec.Data{
	{Source: "fsx://fs-0123456789abcdef0/abcdefgh", MountPath: "/fsx", Mode: spec.DataMount, Region: "us-east-1"},
	{Source: "efs://fs-0abc", MountPath: "/efs/", Mode: spec.DataMount, Region: "us-west-2"},
	{Source: "filestore://10.20.0.2/share1", MountPath: "/filestore", Mode: spec.DataMount, Region: "us-central1"},
	{Source: "nfs://nas.internal/export/data", MountPath: "/nfs", Mode: spec.DataMount},
	{Source: "s3://corpus/tokens", MountPath: "/data/corpus", Mode: spec.DataStage, Region: "us-east-1"},
}

func TestMountsFor(t *testing.T) {
	ms, err := MountsFor(mountData)
	if err != nil {
		t.Fatal(err)
	}
	want := []Mount{
		{Device: "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com@tcp:/abcdefgh", MountPath: "/fsx", FSType: "lustre", Options: "noatime,flock,nofail,_netdev", Client: "lustre"},
		{Device: "fs-0abc.efs.us-west-2.amazonaws.com:/", MountPath: "/efs", FSType: "nfs4", Options: nfsOpts, Client: "nfs"},
		{Device: "10.20.0.2:/share1", MountPath: "/filestore", FSType: "nfs", Options: "hard,timeo=600,retrans=2,nofail,_netdev", Client: "nfs"},
		{Device: "nas.internal:/export/data", MountPath: "/nfs", FSType: "nfs4", Options: nfsOpts, Client: "nfs"},
	}
	if len(ms) != len(want) {
		t.Fatalf("got %d mounts, want %d: %+v", len(ms), len(want), ms)
	}
	for i := range want {
		if ms[i] != want[i] {
			t.Errorf("mount %d = %+v\nwant %+v", i, ms[i], want[i])
		}
	}
	// An fsx source without a mount name gets the old default "fsx".
	ms, err = MountsFor([]spec.Data{{Source: "fsx://fs-1", MountPath: "/fsx", Region: "eu-west-1"}})
	if err != nil || ms[0].Device != "fs-1.fsx.eu-west-1.amazonaws.com@tcp:/fsx" {
		t.Fatalf("default mount name: %+v, %v", ms, err)
	}
	// Shell metacharacters never reach mounts.sh.
	if _, err := MountsFor([]spec.Data{{Source: "nfs://h/x;reboot", MountPath: "/n"}}); err == nil {
		t.Fatal("want an error for a shell metacharacter in the source")
	}
	if _, err := MountsFor([]spec.Data{{Source: "filestore://inst/share", MountPath: "/n"}}); err == nil {
		t.Fatal("want an error for a Filestore source without an IP")
	}
}

// TestMountsGolden renders the user-data of a node with mounts: fstab
// entries for cloud-init's mounts module and the script that installs the
// clients per image family.
func TestMountsGolden(t *testing.T) {
	variants := map[string][]spec.Data{
		"mounts-all": mountData,
		"mounts-nfs": {{Source: "efs://fs-0abc", MountPath: "/efs", Region: "us-west-2"}},
	}
	for name, data := range variants {
		t.Run(name, func(t *testing.T) {
			in := sample()
			in.Agent.Token = "fleetd_node_" + strings.Repeat("1", 48)
			var err error
			if in.Mounts, err = MountsFor(data); err != nil {
				t.Fatal(err)
			}
			doc, err := Render(in)
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", name+".yaml")
			if *update {
				if err := os.WriteFile(golden, []byte(doc), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if doc != string(want) {
				t.Errorf("user-data differs from %s (go test -update):\n%s", golden, doc)
			}
			if len(doc) > 16<<10 {
				t.Errorf("user-data is %d bytes, over EC2's 16 KiB", len(doc))
			}
		})
	}
}

// TestMountsScriptFamilies runs the rendered mounts script's package step
// for each image family with a fake os-release and package managers that
// record their arguments: the packages named must be the family's.
func TestMountsScriptFamilies(t *testing.T) {
	ms, err := MountsFor(mountData[:2]) // lustre + nfs
	if err != nil {
		t.Fatal(err)
	}
	script := mountsScript(ms)
	// Run only the install part: cut before the first mkdir, and read
	// os-release from the test's file.
	install, _, _ := strings.Cut(script, "mkdir -p")
	cases := []struct {
		osRelease string
		want      []string // recorded manager calls
		fails     bool
	}{
		{"ID=ubuntu\nVERSION_ID=22.04\n", []string{"apt-get update -q", "apt-get install -y -q lustre-client-modules-6.1.0-test lustre-client-utils", "apt-get update -q", "apt-get install -y -q nfs-common"}, false},
		{"ID=amzn\nVERSION_ID=2\n", []string{"yum install -y -q lustre-client", "yum install -y -q nfs-utils"}, false},
		{"ID=amzn\nVERSION_ID=2023\n", []string{"dnf install -y -q lustre-client", "dnf install -y -q nfs-utils"}, false},
		{"ID=rocky\nVERSION_ID=9.3\n", []string{"dnf install -y -q kmod-lustre-client lustre-client", "dnf install -y -q nfs-utils"}, false},
		{"ID=debian\nVERSION_ID=12\n", nil, true}, // no Lustre client for Debian
		{"ID=arch\n", nil, true},
	}
	for _, c := range cases {
		t.Run(strings.Fields(strings.ReplaceAll(c.osRelease, "\n", " "))[0], func(t *testing.T) {
			dir := t.TempDir()
			bin := filepath.Join(dir, "bin")
			os.Mkdir(bin, 0o755)
			log := filepath.Join(dir, "calls")
			for _, tool := range []string{"apt-get", "yum", "dnf"} {
				os.WriteFile(filepath.Join(bin, tool), []byte("#!/bin/sh\necho \""+tool+" $*\" >> "+log+"\n"), 0o755)
			}
			os.WriteFile(filepath.Join(bin, "uname"), []byte("#!/bin/sh\necho 6.1.0-test\n"), 0o755)
			osr := filepath.Join(dir, "os-release")
			os.WriteFile(osr, []byte(c.osRelease), 0o644)
			s := strings.Replace(install, ". /etc/os-release", ". "+osr, 1)
			// The test host may have the helpers; hide them.
			s = strings.NewReplacer("command -v mount.nfs4", "command -v fleetd-none-nfs", "command -v mount.lustre", "command -v fleetd-none-lustre",
				"[ -x /sbin/mount.nfs4 ]", "false", "[ -x /sbin/mount.lustre ]", "false").Replace(s)
			cmd := exec.Command("/bin/sh", "-c", s)
			cmd.Env = []string{"PATH=" + bin + ":/usr/bin:/bin"}
			out, err := cmd.CombinedOutput()
			if c.fails {
				if err == nil || !strings.Contains(string(out), "fleetd:") {
					t.Fatalf("want a failure naming the missing client, got %v\n%s", err, out)
				}
				return
			}
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			got, _ := os.ReadFile(log)
			if strings.TrimSpace(string(got)) != strings.Join(c.want, "\n") {
				t.Fatalf("calls:\n%s\nwant:\n%s", got, strings.Join(c.want, "\n"))
			}
		})
	}
}
