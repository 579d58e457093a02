package main

import (
	"strings"
	"testing"

	"github.com/fleetd/fleetd/fleet/api"
)

func TestPrintStaging(t *testing.T) {
	nodes := []api.NodeInfo{
		{ID: "bert-1", Staging: []api.StagingReport{{Source: "s3://corpus/tokens", MountPath: "/data", From: "bucket", Bytes: 1_200_000_000, Total: 2_000_000_000, RateBps: 150e6, ETASeconds: 5.4}}},
		{ID: "bert-2", Staging: []api.StagingReport{{Source: "s3://corpus/tokens", MountPath: "/data", From: "bert-1", Bytes: 2e9, Total: 2e9, RateBps: 900e6, Done: true}}},
		{ID: "bert-3", Staging: []api.StagingReport{{Source: "s3://corpus/tokens", MountPath: "/data", From: "bucket", Done: true, Error: "staging s3://corpus/tokens to /data: denied"}}},
		{ID: "bert-4"},
	}
	var b strings.Builder
	printStaging(&b, nodes)
	want := `
Data staging (copied to the node's disk before it joins):
  NODE    PATH   SOURCE              FROM    COPIED                   RATE        ETA
  bert-1  /data  s3://corpus/tokens  bucket  1.2 GB of 2.0 GB (60%)   150.0 MB/s  5s
  bert-2  /data  s3://corpus/tokens  bert-1  2.0 GB of 2.0 GB (100%)  900.0 MB/s  done
  bert-3  /data  s3://corpus/tokens  bucket  0.000 GB of 0.000 GB     0.0 MB/s    failed: staging s3://corpus/tokens to /data: denied
`
	if b.String() != want {
		t.Fatalf("got:\n%s\nwant:\n%s", b.String(), want)
	}
	b.Reset()
	printStaging(&b, []api.NodeInfo{{ID: "x"}})
	if b.Len() != 0 {
		t.Fatalf("printed without staging: %q", b.String())
	}
}
