package gcp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"

	"github.com/fleetd/fleetd/providers"
	file "google.golang.org/api/file/v1"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/option"
)

// FilestoreEndpoint is the public Cloud Filestore API endpoint.
const FilestoreEndpoint = "https://file.googleapis.com/"

// The Filestore rows of `fleetd check` (CheckOptions.FileSystems): for
// each filestore://IP/SHARE dataset, the instance serving that address
// and share in the block's project, its state, its location against the
// zones the job may use, and its network against the nodes'.

// filestoreBase is the Filestore endpoint (apiBase).
func (k *checker) filestoreBase() string { return k.apiBase(k.c.FilestoreEndpoint, FilestoreEndpoint) }

// filestoreRows adds the rows of every Filestore dataset.
func (k *checker) filestoreRows(ctx context.Context) {
	var want []providers.FileSystemCheck
	for _, fs := range k.fileSystems {
		if fs.Scheme == "filestore" {
			want = append(want, fs)
		}
	}
	if len(want) == 0 {
		return
	}
	instances, err := k.listFilestore(ctx)
	for _, fs := range want {
		if err != nil {
			k.add(k.filestoreErrRow(fs.Source, err))
			continue
		}
		k.filestoreRowsOf(fs, instances)
	}
}

func (k *checker) listFilestore(ctx context.Context) ([]*file.Instance, error) {
	base := strings.TrimSuffix(k.filestoreBase(), "/") + "/"
	hc, err := k.httpClient(ctx, base)
	if err != nil {
		return nil, fmt.Errorf("filestore client: %w", err)
	}
	svc, err := file.NewService(ctx, option.WithEndpoint(base), option.WithHTTPClient(hc))
	if err != nil {
		return nil, fmt.Errorf("filestore client: %w", err)
	}
	var out []*file.Instance
	err = svc.Projects.Locations.Instances.List("projects/"+k.c.Project+"/locations/-").Pages(ctx, func(r *file.ListInstancesResponse) error {
		out = append(out, r.Instances...)
		return nil
	})
	return out, err
}

func (k *checker) filestoreErrRow(source string, err error) providers.CheckResult {
	r := providers.CheckResult{Check: "file system", Scope: source, Status: providers.CheckUnavailable}
	var ge *googleapi.Error
	switch {
	case !errors.As(err, &ge):
		r.Detail, r.Fix = "no answer from the Filestore API: "+err.Error(), "check network access to "+k.filestoreBase()+" and retry"
	case ge.Code == http.StatusForbidden && apiDisabled(ge.Message, reasons(ge)):
		r.Status, r.Detail = providers.CheckFailed, "the Filestore API is not enabled: "+ge.Message
		r.Fix = "gcloud services enable file.googleapis.com --project " + k.c.Project
	case ge.Code == http.StatusForbidden:
		r.Status, r.Detail = providers.CheckFailed, "file.instances.list denied: "+ge.Message
		r.Fix = k.grantFix("roles/file.viewer")
	default:
		r.Detail = fmt.Sprintf("the Filestore API answered %d: %s", ge.Code, ge.Message)
	}
	return r
}

var filestoreNameRE = regexp.MustCompile(`^projects/[^/]+/locations/([^/]+)/instances/([^/]+)$`)

// filestoreRowsOf adds the rows of one dataset, given every instance of
// the project.
func (k *checker) filestoreRowsOf(fs providers.FileSystemCheck, instances []*file.Instance) {
	share := strings.Trim(fs.Path, "/")
	var in *file.Instance
	var net *file.NetworkConfig
	for _, cand := range instances {
		if !slices.ContainsFunc(cand.FileShares, func(s *file.FileShareConfig) bool { return s.Name == share }) {
			continue
		}
		for _, n := range cand.Networks {
			if slices.Contains(n.IpAddresses, fs.Host) {
				in, net = cand, n
			}
		}
	}
	src := fs.Source
	if in == nil {
		k.add(providers.CheckResult{Check: "file system", Scope: src, Status: providers.CheckFailed,
			Detail: fmt.Sprintf("no Filestore instance of project %s serves share %q at %s", k.c.Project, share, fs.Host),
			Fix:    fmt.Sprintf("check the data block's source against `gcloud filestore instances list --project %s` (networks' IP address and the file share's name)", k.c.Project)})
		return
	}
	loc, id := "", in.Name
	if m := filestoreNameRE.FindStringSubmatch(in.Name); m != nil {
		loc, id = m[1], m[2]
	}
	if in.State != "READY" {
		k.add(providers.CheckResult{Check: "file system", Scope: src, Status: providers.CheckFailed,
			Detail: fmt.Sprintf("Filestore instance %s is %s, not READY", id, in.State), Fix: "wait until it is READY (or pick another instance); nodes cannot mount it now"})
		return
	}
	k.add(providers.CheckResult{Check: "file system", Scope: src, Status: providers.CheckOK,
		Detail: fmt.Sprintf("Filestore instance %s (%s, %s) is READY", id, in.Tier, loc)})
	k.add(k.filestoreZoneRow(fs, loc))
	k.add(k.filestoreNetworkRow(fs, net))
}

// filestoreZoneRow compares the instance's location (a zone, or a region
// for regional tiers) with the data block's zone and the zones the job
// may use: the block's zones in the data's region, narrowed by the
// fleet's.
func (k *checker) filestoreZoneRow(fs providers.FileSystemCheck, loc string) providers.CheckResult {
	r := providers.CheckResult{Check: "file system zone", Scope: fs.Source, Status: providers.CheckOK}
	zonal := zoneRE.MatchString(loc)
	region := loc
	if zonal {
		region = regionOf(loc)
	}
	var allowed []string
	for _, z := range k.c.Zones {
		if regionOf(z) == region && (len(fs.Zones) == 0 || slices.Contains(fs.Zones, z)) {
			allowed = append(allowed, z)
		}
	}
	switch {
	case fs.Region != "" && fs.Region != region:
		r.Status, r.Detail = providers.CheckFailed, fmt.Sprintf("the instance is in %s, but the data block says region = %q", loc, fs.Region)
		r.Fix = fmt.Sprintf("set region = %q in the data block", region)
	case zonal && fs.Zone != "" && fs.Zone != loc:
		r.Status, r.Detail = providers.CheckFailed, fmt.Sprintf("the instance is in %s, but the data block says zone = %q", loc, fs.Zone)
		r.Fix = fmt.Sprintf("set zone = %q in the data block: placement keeps the job near the data by it", loc)
	case len(allowed) == 0:
		r.Status, r.Detail = providers.CheckFailed, fmt.Sprintf("the instance is in %s, and no zone the job may use is in %s (block zones: %s)", loc, region, strings.Join(k.c.Zones, ", "))
		r.Fix = fmt.Sprintf("add a zone of %s to the block's zones", region)
	case !zonal:
		r.Detail = fmt.Sprintf("regional instance in %s: the job's zones %s reach it", loc, strings.Join(allowed, ", "))
	case !slices.Contains(allowed, loc):
		r.Status, r.Detail = providers.CheckFailed, fmt.Sprintf("the instance is in %s, outside every zone the job may use (%s)", loc, strings.Join(allowed, ", "))
		r.Fix = fmt.Sprintf("add %s to the block's zones, or use an instance in one of them", loc)
	case len(allowed) > 1:
		r.Detail = fmt.Sprintf("in %s; nodes in the block's other zones of %s mount it across zones (priced into placement)", loc, region)
	default:
		r.Detail = fmt.Sprintf("in %s, where the job may run", loc)
	}
	return r
}

// filestoreNetworkRow compares the instance's VPC network with the
// nodes'. Nodes reach Filestore over the network's peering with Google's
// service network, which the VPC's ingress firewall rules do not govern;
// fleetd reads no firewall rules, so egress denies go unchecked and the
// row says so.
func (k *checker) filestoreNetworkRow(fs providers.FileSystemCheck, n *file.NetworkConfig) providers.CheckResult {
	r := providers.CheckResult{Check: "file system network", Scope: fs.Source, Status: providers.CheckOK}
	theirs, ours := k.networkRef(n.Network), k.networkRef(k.c.network())
	if theirs != ours {
		r.Status, r.Detail = providers.CheckFailed, fmt.Sprintf("the instance is on network %s; the nodes run on %s", theirs, ours)
		r.Fix = fmt.Sprintf("set the block's network to %s (and a subnetwork of it), or use an instance on %s", theirs, ours)
		return r
	}
	r.Detail = fmt.Sprintf("on %s, the nodes' network (%s, reserved range %s). Filestore is reached over the network's peering: the VPC's ingress firewall rules do not apply to it; an egress deny rule on TCP 2049 and 111 would, and is not checked here",
		ours, n.ConnectMode, n.ReservedIpRange)
	return r
}

// networkRef is "project/name" of a network given as a name, a relative
// path or a URL (a name is the block's project's).
func (k *checker) networkRef(s string) string {
	project := k.c.Project
	if m := projectPathRE.FindStringSubmatch(s); m != nil {
		project = m[1]
	}
	return project + "/" + lastSegment(s)
}
