// Package nodestores links gocloud.dev's s3 and gcs blob drivers, so that
// ckpt.OpenBucket can open s3:// and gs:// stores with the node's own
// credentials (training.checkpoint.access = "node").
//
// It is its own package because the two drivers pull in the AWS S3 and
// Google Cloud Storage SDKs (about 30 MB of the agent): the default slim
// agent (cmd/fleetd-agent) leaves them out and reaches stores through URLs
// the daemon signs, over plain HTTP. The daemon, `fleetd agent` and the
// node-store agent build (`-tags nodestore`) import this package.
package nodestores

import (
	_ "gocloud.dev/blob/gcsblob" // gs:// URLs
	_ "gocloud.dev/blob/s3blob"  // s3:// URLs
)
