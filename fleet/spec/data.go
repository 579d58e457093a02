package spec

import (
	"fmt"
	"net"
	"net/url"
	"path"
	"regexp"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
)

// Data is one training.data block: a dataset the workers read, where it
// lives and how the nodes reach it. Placement uses it to keep the job
// where its file system can be mounted and to price reading a bucket
// from elsewhere (docs/spec.md, "Data"; docs/placement.md, "Data").
type Data struct {
	// Source is the dataset's URL: s3://bucket/prefix, gs://bucket/prefix,
	// file:///path, or a file system: fsx://fs-id, efs://fs-id,
	// filestore://IP/share, nfs://host/path.
	Source string `json:"source"`
	// MountPath is where the workers find the data on the node.
	MountPath string `json:"mount_path"`
	// Mode is DataMount, DataStream or DataStage.
	Mode string `json:"mode"`
	// SizeGB is the dataset's size; ReadPerEpochGB what one epoch reads
	// over the whole job (default SizeGB).
	SizeGB         float64 `json:"size_gb"`
	ReadPerEpochGB float64 `json:"read_per_epoch_gb"`
	// EpochTime is how long one epoch takes: with ReadPerEpochGB it turns
	// a per-epoch read into a per-hour one. 0 when unset (placement then
	// assumes DefaultEpochTime and says so).
	EpochTime time.Duration `json:"epoch_time,omitempty"`
	// Region and Zone say where the data lives: a file system's network,
	// a bucket's region.
	Region string `json:"region,omitempty"`
	Zone   string `json:"zone,omitempty"`
	// ZonePolicy is ZonePrefer (other zones of the region pay cross-zone
	// transfer) or ZoneRequired (other zones are excluded); file systems
	// only.
	ZonePolicy string `json:"zone_policy,omitempty"`
	// Network is the VPC a file system lives in: an AWS VPC id
	// ("vpc-…") or a GCP VPC network name. Only nodes in that network
	// reach it, so placement excludes offerings known to land in
	// another; "" leaves the network unchecked.
	Network string `json:"network,omitempty"`
}

// Data modes.
const (
	// DataMount mounts a file system (or uses a node directory in place).
	DataMount = "mount"
	// DataStream: the workers read the bucket directly, every epoch.
	DataStream = "stream"
	// DataStage copies the dataset to the node's disk before the workers
	// start.
	DataStage = "stage"
)

// Zone policies of a file system.
const (
	ZonePrefer   = "prefer"
	ZoneRequired = "required"
)

// DefaultEpochTime is the epoch length assumed when a data block gives no
// epoch_time.
const DefaultEpochTime = time.Hour

// dataSchemes is what each source scheme is: its cloud ("" for any) and
// whether it is a file system (mounted) or a bucket (streamed or staged).
var dataSchemes = map[string]struct {
	cloud      string
	fileSystem bool
}{
	"s3":        {"aws", false},
	"gs":        {"gcp", false},
	"file":      {"", false},
	"fsx":       {"aws", true},
	"efs":       {"aws", true},
	"filestore": {"gcp", true},
	"nfs":       {"", true},
}

var dataSchemeNames = []string{"s3", "gs", "file", "fsx", "efs", "filestore", "nfs"}

// DataSource is a parsed data source.
type DataSource struct {
	Scheme string
	// Host is the bucket, file system id, Filestore instance or NFS
	// server; Path the prefix, share or export.
	Host, Path string
}

// ParseDataSource parses and checks a data source URL.
func ParseDataSource(s string) (DataSource, error) {
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" {
		return DataSource{}, fmt.Errorf("source %q is not a URL: write SCHEME://..., one of %s", s, schemeList())
	}
	if _, ok := dataSchemes[u.Scheme]; !ok {
		msg := fmt.Sprintf("source %q has an unknown scheme %q", s, u.Scheme)
		if sug := suggest(u.Scheme, dataSchemeNames); sug != "" {
			return DataSource{}, fmt.Errorf("%s; did you mean %q?", msg, sug)
		}
		return DataSource{}, fmt.Errorf("%s (known: %s)", msg, schemeList())
	}
	d := DataSource{Scheme: u.Scheme, Host: u.Host, Path: u.Path}
	switch {
	case u.Scheme == "file":
		if u.Host != "" || !path.IsAbs(u.Path) || path.Clean(u.Path) == "/" {
			return DataSource{}, fmt.Errorf("source %q: a file URL names an absolute directory other than /, e.g. file:///data/imagenet (three slashes)", s)
		}
	case u.Host == "":
		return DataSource{}, fmt.Errorf("source %q names no %s: write %s://%s", s, hostWord(u.Scheme), u.Scheme, hostExample(u.Scheme))
	case u.Scheme == "nfs" && !path.IsAbs(u.Path):
		return DataSource{}, fmt.Errorf("source %q names no export: write nfs://HOST/EXPORT", s)
	case u.Scheme == "filestore" && (net.ParseIP(u.Host) == nil || len(u.Path) < 2):
		// The node mounts IP:/SHARE; an instance name resolves nowhere.
		return DataSource{}, fmt.Errorf("source %q: a Filestore share is mounted by the instance's IP address: write filestore://IP/SHARE (gcloud filestore instances describe INSTANCE shows it under networks)", s)
	}
	return d, nil
}

func schemeList() string {
	return strings.Join(dataSchemeNames, "://, ") + "://"
}

func hostWord(scheme string) string {
	switch scheme {
	case "s3", "gs":
		return "bucket"
	case "nfs":
		return "server"
	case "filestore":
		return "instance IP"
	}
	return "file system id"
}

func hostExample(scheme string) string {
	switch scheme {
	case "s3", "gs":
		return "BUCKET/PREFIX"
	case "nfs":
		return "HOST/EXPORT"
	case "filestore":
		return "IP/SHARE"
	}
	return "fs-0123456789abcdef0"
}

// Cloud is the cloud the source lives in: "aws", "gcp", or "" (a node
// directory, or an NFS server anywhere).
func (d DataSource) Cloud() string { return dataSchemes[d.Scheme].cloud }

// FileSystem: the source is mounted, not streamed or staged.
func (d DataSource) FileSystem() bool { return dataSchemes[d.Scheme].fileSystem }

// Bucket: the source is an object store.
func (d DataSource) Bucket() bool { return d.Scheme == "s3" || d.Scheme == "gs" }

// ReadPerEpoch is what one epoch reads, in GB.
func (d Data) ReadPerEpoch() float64 {
	if d.ReadPerEpochGB > 0 {
		return d.ReadPerEpochGB
	}
	return d.SizeGB
}

var dataSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "source", Required: true},
		{Name: "mount_path", Required: true},
		{Name: "mode"},
		{Name: "size_gb"},
		{Name: "read_per_epoch_gb"},
		{Name: "epoch_time"},
		{Name: "region"},
		{Name: "zone"},
		{Name: "zone_policy"},
		{Name: "network"},
	},
}

// decodeData reads the training.data blocks; t.Checkpoint is decoded
// already (a mount path must not collide with its dir).
func (p *parser) decodeData(blocks hcl.Blocks, t *Training) {
	seen := map[string]hcl.Range{}
	for _, b := range blocks {
		if b.Type != "data" {
			continue
		}
		if d, ok := decodeDataBlock(p, b, t, seen); ok {
			t.Data = append(t.Data, d)
		}
	}
}

// decodeDataBlock reads one data block (a function, not a method: the
// parser stays within 40 methods).
func decodeDataBlock(p *parser, b *hcl.Block, t *Training, seen map[string]hcl.Range) (Data, bool) {
	content, diags := b.Body.Content(dataSchema)
	p.diags = append(p.diags, diags...)
	if diags.HasErrors() {
		return Data{}, false
	}
	a := content.Attributes
	var d Data
	ok := true

	srcA := a["source"]
	var src DataSource
	srcOK := false
	if p.stringAttr(srcA, &d.Source) {
		var err error
		if src, err = ParseDataSource(d.Source); err != nil {
			p.attrError(srcA, "Invalid data source", sentence(err.Error()))
			ok = false
		} else {
			srcOK = true
		}
	} else {
		ok = false
	}

	if ma := a["mount_path"]; p.stringAttr(ma, &d.MountPath) {
		switch mp := path.Clean(d.MountPath); {
		case !path.IsAbs(d.MountPath):
			p.attrError(ma, "Invalid mount_path", fmt.Sprintf("mount_path is an absolute directory on the node, e.g. \"/data\", got %q.", d.MountPath))
		case mp == "/":
			p.attrError(ma, "Invalid mount_path", `mount_path must not be "/".`)
		case t.Checkpoint != nil && overlaps(mp, t.Checkpoint.Dir):
			p.attrError(ma, "Data mount collides with the checkpoint dir",
				fmt.Sprintf("mount_path %q and checkpoint dir %q overlap: the agent restores and prunes checkpoints there. Use separate directories.", d.MountPath, t.Checkpoint.Dir))
		default:
			if prev, dup := seen[mp]; dup {
				p.attrError(ma, "Duplicate mount_path", fmt.Sprintf("Another data block (line %d) already uses mount_path %q.", prev.Start.Line, mp))
			} else {
				seen[mp] = ma.Range
			}
		}
	}

	modeA := a["mode"]
	if modeA != nil {
		p.enumAttr(modeA, []string{DataMount, DataStream, DataStage}, &d.Mode)
	}
	if srcOK {
		switch {
		case d.Mode == "" && src.Bucket():
			d.Mode = DataStream
		case d.Mode == "":
			d.Mode = DataMount
		case src.FileSystem() && d.Mode != DataMount:
			p.attrError(modeA, "File systems are mounted",
				fmt.Sprintf("%s:// is a file system the nodes mount: mode must be %q, got %q.", src.Scheme, DataMount, d.Mode))
		case src.Bucket() && d.Mode == DataMount:
			p.attrError(modeA, "Buckets are not mounted",
				fmt.Sprintf("%s:// is a bucket: mode %q (the workers read it directly) or %q (copied to the node's disk before the workers start), not %q.", src.Scheme, DataStream, DataStage, DataMount))
		case src.Scheme == "file" && d.Mode == DataStream:
			p.attrError(modeA, "Node directories are not streamed",
				fmt.Sprintf("file:// is a directory on the node: mode %q (used in place) or %q (copied to mount_path).", DataMount, DataStage))
		}
	}

	sizeA := a["size_gb"]
	if sizeA == nil {
		p.errorAt(b.DefRange, "Missing data size",
			fmt.Sprintf("A data block needs size_gb, the dataset's size: placement prices reading %s from where the job runs with it.", d.Source))
	} else if p.floatAttr(sizeA, &d.SizeGB) && d.SizeGB <= 0 {
		p.attrError(sizeA, "Invalid size_gb", fmt.Sprintf("size_gb must be greater than 0, got %g.", d.SizeGB))
		d.SizeGB = 0
	}
	if ra := a["read_per_epoch_gb"]; p.floatAttr(ra, &d.ReadPerEpochGB) && d.ReadPerEpochGB < 0 {
		p.attrError(ra, "Invalid read_per_epoch_gb", fmt.Sprintf("read_per_epoch_gb must be 0 or more (0: the whole dataset), got %g.", d.ReadPerEpochGB))
		d.ReadPerEpochGB = 0
	}
	p.durationAttr(a["epoch_time"], &d.EpochTime, false)

	p.stringAttr(a["region"], &d.Region)
	zoneA := a["zone"]
	p.stringAttr(zoneA, &d.Zone)
	zpA := a["zone_policy"]
	if zpA != nil {
		p.enumAttr(zpA, []string{ZonePrefer, ZoneRequired}, &d.ZonePolicy)
	}
	if srcOK {
		switch {
		case src.FileSystem() && src.Cloud() != "" && d.Region == "":
			p.errorAt(b.DefRange, "Missing file system region",
				fmt.Sprintf("%s is a file system in one region of %s: set region (and zone for a zonal one) so placement keeps the job where it can be mounted.", d.Source, src.Cloud()))
		case !src.FileSystem() && zpA != nil:
			p.attrError(zpA, "zone_policy is for file systems", fmt.Sprintf("%s is not a file system: any zone reads it alike.", d.Source))
		}
		if src.FileSystem() && d.ZonePolicy == ZoneRequired && d.Zone == "" {
			p.attrError(zpA, "Required zone not given", `zone_policy = "required" keeps the job in the file system's zone: set zone too.`)
		}
		if d.ZonePolicy == "" && src.FileSystem() {
			d.ZonePolicy = ZonePrefer
		}
		if src.Bucket() && d.Region == "" {
			p.errorAt(b.DefRange, "Missing bucket region",
				fmt.Sprintf("Set region to where %s lives (e.g. region = \"us-east-1\"): placement prices reading it from each region and cloud.", d.Source))
		}
		if zoneA != nil && !src.FileSystem() {
			p.attrWarning(zoneA, "zone has no effect", fmt.Sprintf("%s is not a zonal file system: only its region counts.", d.Source))
		}
	}
	if netA := a["network"]; p.stringAttr(netA, &d.Network) && srcOK {
		if !src.FileSystem() {
			p.attrError(netA, "network is for file systems", fmt.Sprintf("%s is not a file system: any network reads it alike.", d.Source))
		} else if msg := networkProblem(src, d.Network); msg != "" {
			p.attrError(netA, "Invalid data network", msg)
		}
	}
	return d, ok
}

var (
	awsVPCID   = regexp.MustCompile(`^vpc-[0-9a-f]{8}([0-9a-f]{9})?$`)
	gcpNetName = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)
)

// networkProblem says why network cannot be the VPC of file system src,
// or "".
func networkProblem(src DataSource, network string) string {
	switch {
	case src.Cloud() == "aws" && !awsVPCID.MatchString(network):
		return fmt.Sprintf("%s:// lives in an AWS VPC: network is its VPC id, e.g. \"vpc-0123456789abcdef0\", got %q (aws ec2 describe-vpcs lists them).", src.Scheme, network)
	case src.Cloud() == "gcp" && !gcpNetName.MatchString(network):
		return fmt.Sprintf("%s:// lives in a GCP VPC network: network is its name, e.g. \"default\", got %q (gcloud compute networks list shows them).", src.Scheme, network)
	case src.Cloud() == "" && !awsVPCID.MatchString(network) && !gcpNetName.MatchString(network):
		return fmt.Sprintf("network is an AWS VPC id (\"vpc-…\") or a GCP VPC network name, got %q.", network)
	}
	return ""
}

// overlaps: one of the two directories is the other or contains it.
func overlaps(a, b string) bool {
	if b == "" || !path.IsAbs(b) {
		return false
	}
	a, b = path.Clean(a), path.Clean(b)
	return a == b || strings.HasPrefix(a, b+"/") || strings.HasPrefix(b, a+"/")
}

// sentence ends msg with a full stop unless it asks a question.
func sentence(msg string) string {
	if strings.HasSuffix(msg, "?") || strings.HasSuffix(msg, ".") {
		return msg
	}
	return msg + "."
}
