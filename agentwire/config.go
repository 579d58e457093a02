package agentwire

// AgentConfig is the agent's configuration file (agent.json) as the
// bootstrap writes it into a VM's user-data and the agent reads it: one
// declaration for both sides, so a field added to one reaches the other.
type AgentConfig struct {
	Fleet  string `json:"fleet"`
	NodeID string `json:"node_id"`
	// DaemonURL is where the control daemon's API is; empty means the agent
	// runs standalone (metadata watching and drain only).
	DaemonURL string `json:"daemon_url,omitempty"`
	// DaemonURLs are the other servers of a fleetd cluster: when the
	// server in use stops answering, the agent goes on with the next (any
	// server forwards to the leader). Its workers keep running meanwhile.
	DaemonURLs []string `json:"daemon_urls,omitempty"`
	// Token is the per-node bearer token; required with DaemonURL. Never logged.
	Token string `json:"token,omitempty"`
	// CAFingerprint pins the daemon's CA: "sha256:" + 64 hex digits (colons allowed).
	CAFingerprint string         `json:"ca_fingerprint,omitempty"`
	Metadata      MetadataConfig `json:"metadata"`
	// WorkDir and LogDir are absolute VM paths, re-rooted under -root.
	WorkDir string `json:"work_dir,omitempty"`
	LogDir  string `json:"log_dir,omitempty"`
}

// MetadataConfig says which metadata service carries interruption notices.
type MetadataConfig struct {
	Kind string `json:"kind"`          // aws-imds, gce or none
	URL  string `json:"url,omitempty"` // default: the cloud's well-known address
}
