package agentwire

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// DataConfig is one training.data block as the agent needs it: mounts are
// cloud-init's (the agent only checks them), staged sources the agent
// copies to MountPath before the node joins, streamed ones it names to the
// workers (FLEETD_DATA_*).
type DataConfig struct {
	Source    string  `json:"source"`
	MountPath string  `json:"mount_path"`
	Mode      string  `json:"mode"`
	SizeGB    float64 `json:"size_gb,omitempty"`
}

// StagingReport is an agent's progress copying one staged source to its
// disk: POST /v1/agent/{fleet}/{node}/staging, about once a second while it
// copies and once at the end.
type StagingReport struct {
	Source    string `json:"source"`
	MountPath string `json:"mount_path"`
	// From is where the bytes come from: "bucket" (the source) or the
	// peer node's id.
	From string `json:"from"`
	// Bytes copied so far of Total (listed sizes); Files likewise.
	Bytes      int64 `json:"bytes"`
	Total      int64 `json:"total"`
	Files      int   `json:"files"`
	TotalFiles int   `json:"total_files"`
	// RateBps is the mean rate since the copy started, ETASeconds the
	// remaining bytes at that rate (0 when unknown or done).
	RateBps    float64 `json:"rate_bps"`
	ETASeconds float64 `json:"eta_seconds,omitempty"`
	// Done: finished (Error empty) or given up (Error says why).
	Done  bool   `json:"done,omitempty"`
	Error string `json:"error,omitempty"`
	// PeerURL, on a finished copy, is where the node serves it to peers
	// of its zone (agent/peerstage.go); "" when it does not.
	PeerURL string `json:"peer_url,omitempty"`
}

// PeerStagingRequest asks the daemon for a peer with a finished copy of a
// staged source: POST /v1/agent/{fleet}/{node}/staging/peer. 404: none.
type PeerStagingRequest struct {
	Source    string `json:"source"`
	MountPath string `json:"mount_path"`
}

// PeerStaging is the daemon's answer: the peer node, its copy's URL, the
// grant to present and why the peer beats the source.
type PeerStaging struct {
	Node   string    `json:"node"`
	URL    string    `json:"url"`
	Grant  PeerGrant `json:"grant"`
	Reason string    `json:"reason,omitempty"`
}

// PeerGrant lets Requester read a peer's staged copies until Expires
// (Unix seconds). MAC is PeerMAC keyed by the serving node's token: the
// serving agent checks it with its own token, the requester cannot forge
// one for another node or time.
type PeerGrant struct {
	Requester string `json:"requester"`
	Expires   int64  `json:"expires"`
	MAC       string `json:"mac"`
}

// PeerMAC is a grant's MAC: HMAC-SHA256 keyed by the serving node's token.
func PeerMAC(servingToken, requester string, expires int64) string {
	m := hmac.New(sha256.New, []byte(servingToken))
	fmt.Fprintf(m, "fleetd peer staging\n%s\n%d", requester, expires)
	return hex.EncodeToString(m.Sum(nil))
}
