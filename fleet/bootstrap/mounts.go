package bootstrap

import (
	"fmt"
	"path"
	"sort"
	"strings"

	"github.com/fleetd/fleetd/fleet/spec"
)

// MountsPath is the script that installs the file-system clients and mounts
// the spec's data file systems; runcmd runs it before the spec's setup.
const MountsPath = "/etc/fleetd/mounts.sh"

// Mount is one file system a node mounts at boot: an fstab entry (written
// by cloud-init's mounts module) plus the client it needs.
type Mount struct {
	// Device, MountPath, FSType and Options are the fstab fields.
	Device, MountPath, FSType, Options string
	// Client is the client the image needs: "nfs" or "lustre".
	Client string
}

// Options every data mount carries: a missing or unreachable file system
// must not hold the node's boot (the agent reports it instead), and the
// mount waits for the network.
const (
	baseOpts = "nofail,_netdev"
	// AWS's recommended NFS options for EFS (and fine for Filestore/NFS).
	nfsOpts = "nfsvers=4.1,rsize=1048576,wsize=1048576,hard,timeo=600,retrans=2,noresvport," + baseOpts
)

// MountsFor turns the spec's data blocks into the node's mounts: only file
// systems are mounted (buckets are streamed or staged by the agent,
// file:// is a directory the image already has).
func MountsFor(data []spec.Data) ([]Mount, error) {
	var out []Mount
	for _, d := range data {
		src, err := spec.ParseDataSource(d.Source)
		if err != nil {
			return nil, fmt.Errorf("data %s: %w", d.Source, err)
		}
		if !src.FileSystem() {
			continue
		}
		m := Mount{MountPath: path.Clean(d.MountPath), Client: "nfs", FSType: "nfs4", Options: nfsOpts}
		switch src.Scheme {
		case "fsx":
			// The Lustre mount name is the source's path (DescribeFileSystems
			// LustreConfiguration.MountName); scratch and PERSISTENT_1
			// file systems created before 2020 use "fsx".
			name := strings.Trim(src.Path, "/")
			if name == "" {
				name = "fsx"
			}
			m.Device = fmt.Sprintf("%s.fsx.%s.amazonaws.com@tcp:/%s", src.Host, d.Region, name)
			m.FSType, m.Client = "lustre", "lustre"
			m.Options = "noatime,flock," + baseOpts
		case "efs":
			m.Device = fmt.Sprintf("%s.efs.%s.amazonaws.com:/%s", src.Host, d.Region, strings.TrimPrefix(src.Path, "/"))
		case "filestore":
			// spec.ParseDataSource made the host the instance's IP.
			m.Device = src.Host + ":" + src.Path
			m.FSType = "nfs"
			m.Options = "hard,timeo=600,retrans=2," + baseOpts
		case "nfs":
			m.Device = src.Host + ":" + src.Path
		default:
			return nil, fmt.Errorf("data %s: no mount for scheme %s", d.Source, src.Scheme)
		}
		if strings.ContainsAny(m.Device+m.MountPath, " \t\n'\"\\$`;|&<>(){}*?") {
			// Both end up on a shell line in mounts.sh.
			return nil, fmt.Errorf("data %s: source or mount_path contains characters not allowed in a mount", d.Source)
		}
		out = append(out, m)
	}
	return out, nil
}

// imageFamily is one family of boot images, by /etc/os-release: how it
// installs packages and what its file-system clients are called.
type imageFamily struct {
	// Match is the `case` pattern on "$ID-$VERSION_ID" (os-release).
	Match string
	// Install installs the packages named after it.
	Install string
	// Packages per client; empty means the image ships the client or it
	// is not offered for this family.
	Packages map[string]string
}

// imageFamilies: NFS clients are in every distribution; the Lustre client
// for FSx comes from Amazon's repositories (Amazon Linux has it, the AWS
// FSx client repository serves Ubuntu and RHEL, and AWS Deep Learning AMIs
// ship it installed). Order matters: the first match wins.
var imageFamilies = []imageFamily{
	{Match: "ubuntu-*", Install: "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q",
		Packages: map[string]string{"nfs": "nfs-common", "lustre": `lustre-client-modules-$(uname -r) lustre-client-utils`}},
	{Match: "debian-*", Install: "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q",
		Packages: map[string]string{"nfs": "nfs-common"}},
	{Match: "amzn-2", Install: "yum install -y -q",
		Packages: map[string]string{"nfs": "nfs-utils", "lustre": "lustre-client"}},
	{Match: "amzn-*", Install: "dnf install -y -q",
		Packages: map[string]string{"nfs": "nfs-utils", "lustre": "lustre-client"}},
	{Match: "rhel-*|rocky-*|almalinux-*|centos-*", Install: "dnf install -y -q",
		Packages: map[string]string{"nfs": "nfs-utils", "lustre": "kmod-lustre-client lustre-client"}},
	{Match: "cos-*", Install: "", Packages: map[string]string{}}, // Container-Optimized OS: NFS built in, no package manager
}

// clientHelper is the mount helper whose presence means the client is
// installed already (AMIs and custom images often have it).
var clientHelper = map[string]string{"nfs": "mount.nfs4", "lustre": "mount.lustre"}

// mountsScript installs the clients the mounts need, for the image family
// the node booted, then mounts each file system (the fstab entries are
// cloud-init's). A family without a package for a needed client fails
// with a message naming the client, so the node's log says what to add.
func mountsScript(ms []Mount) string {
	need := map[string]bool{}
	for _, m := range ms {
		need[m.Client] = true
	}
	clients := make([]string, 0, len(need))
	for c := range need {
		clients = append(clients, c)
	}
	sort.Strings(clients)

	var b strings.Builder
	b.WriteString("#!/bin/sh\n# Data file systems from the fleet spec: install their clients for this image, then mount.\nset -eu\n")
	b.WriteString(". /etc/os-release\n")
	for _, c := range clients {
		fmt.Fprintf(&b, "if ! command -v %s >/dev/null && ! [ -x /sbin/%s ]; then\n  case \"$ID-${VERSION_ID:-}\" in\n", clientHelper[c], clientHelper[c])
		for _, f := range imageFamilies {
			pkgs := f.Packages[c]
			switch {
			case pkgs != "" && f.Install != "":
				fmt.Fprintf(&b, "  %s) %s %s ;;\n", f.Match, f.Install, pkgs)
			default:
				fmt.Fprintf(&b, "  %s) echo \"fleetd: no %s client package for $ID ${VERSION_ID:-}; use an image that has %s\" >&2; exit 1 ;;\n", f.Match, c, clientHelper[c])
			}
		}
		fmt.Fprintf(&b, "  *) echo \"fleetd: unknown image family $ID ${VERSION_ID:-}: install the %s client (%s) in setup or the image\" >&2; exit 1 ;;\n  esac\nfi\n", c, clientHelper[c])
	}
	for _, m := range ms {
		// Retries: a file system's DNS name can lag the VPC's first minute.
		fmt.Fprintf(&b, "mkdir -p %s\nfor i in 1 2 3 4 5 6; do mountpoint -q %s && break; mount %s && break; sleep 10; done\nmountpoint -q %s\n",
			m.MountPath, m.MountPath, m.MountPath, m.MountPath)
	}
	return b.String()
}

// fstab is the cloud-init `mounts` module's list: one fstab line per mount.
func fstab(ms []Mount) [][]string {
	out := make([][]string, 0, len(ms))
	for _, m := range ms {
		out = append(out, []string{m.Device, m.MountPath, m.FSType, m.Options, "0", "0"})
	}
	return out
}
