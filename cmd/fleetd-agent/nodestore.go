//go:build nodestore

package main

// The node-store agent: s3:// and gs:// checkpoint stores opened with the
// node's own credentials (access = "node"). Default builds leave the two
// SDKs out.
import _ "github.com/fleetd/fleetd/agent/ckpt/nodestores"

const nodeStores = true
