package providers

import "context"

// CheckStatus is the outcome of one preflight check.
type CheckStatus string

const (
	// CheckOK: the check passed.
	CheckOK CheckStatus = "ok"
	// CheckFailed: something the fleet needs is missing or denied; a
	// launch would fail. Fix says what to do.
	CheckFailed CheckStatus = "failed"
	// CheckUnavailable: the check could not be made (the API is not
	// served by this endpoint, or not enabled); fleetd works without it,
	// possibly degraded, and Detail says how.
	CheckUnavailable CheckStatus = "unavailable"
)

// CheckResult is one row of a preflight report (`fleetd check`).
type CheckResult struct {
	// Check names what was checked, e.g. "credentials", "permission
	// ec2:RunInstances", "image", "subnet", "quota spot G and VT vCPUs".
	Check string `json:"check"`
	// Scope is where: a region, a zone, a queue; "" for the whole block.
	Scope  string      `json:"scope,omitempty"`
	Status CheckStatus `json:"status"`
	// Detail is what was found ("ami-0abc (ubuntu-22.04) exists",
	// "UnauthorizedOperation").
	Detail string `json:"detail,omitempty"`
	// Fix tells the user what to do when Status is not ok.
	Fix string `json:"fix,omitempty"`
}

// CheckOptions tunes a preflight run.
type CheckOptions struct {
	// Quick asks only for the cheap checks (a few read-only calls, no
	// per-zone or quota sweeps), as `fleetd apply` runs before launching.
	Quick bool `json:"quick,omitempty"`
	// TargetNodes is the fleet's size, for quota checks (vCPUs needed =
	// nodes × vCPUs of the largest configured type); 0 means 1.
	TargetNodes int `json:"target_nodes,omitempty"`
	// Network: the fleet asks for the fast network (node.network "auto"
	// or "fast"), so check what it needs: fabric support per type,
	// security-group rules, placement-group permissions, the addressing
	// it implies.
	Network bool `json:"network,omitempty"`
	// FileSystems are the fleet's file-system datasets of this provider's
	// cloud (training.data blocks with fsx://, efs://, filestore://
	// sources): check that each exists, lies where the job may run and
	// that the nodes may reach it. Quick runs skip them.
	FileSystems []FileSystemCheck `json:"file_systems,omitempty"`
}

// FileSystemCheck is one file system the fleet mounts, as its data block
// says (providers stay free of the spec's types).
type FileSystemCheck struct {
	// Source is the data block's source URL, e.g. "fsx://fs-0123…",
	// "filestore://10.0.0.2/share"; the rows name it.
	Source string `json:"source"`
	// Scheme is the source's scheme ("fsx", "efs", "filestore"); Host the
	// file system id or the instance's IP address; Path the share or
	// export ("" when the scheme has none).
	Scheme string `json:"scheme"`
	Host   string `json:"host"`
	Path   string `json:"path,omitempty"`
	// Region and Zone are where the data block says it lives.
	Region string `json:"region,omitempty"`
	Zone   string `json:"zone,omitempty"`
	// Zones, when set, are the only zones the fleet lets the job use
	// (zone_policy = "required" pins it to Zone); the provider narrows it
	// further to its block's configured zones. Empty: any zone the block
	// uses.
	Zones []string `json:"zones,omitempty"`
}

// Checker is implemented by providers that can verify, without launching
// anything, that an account is ready for a provider block: credentials,
// permissions, images, networks, quotas. Check returns one result per
// check; an error means the report itself could not be produced (the
// block is invalid), not that a check failed.
type Checker interface {
	Check(ctx context.Context, cfg Config, opts CheckOptions) ([]CheckResult, error)
}

// CheckPassed reports whether no result failed (unavailable is not a
// failure).
func CheckPassed(rs []CheckResult) bool {
	for _, r := range rs {
		if r.Status == CheckFailed {
			return false
		}
	}
	return true
}
