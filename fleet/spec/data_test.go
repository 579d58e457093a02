package spec

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestDataBlocks(t *testing.T) {
	cmd := `command = ["python3", "train.py"]` + "\n"
	cases := []struct {
		name     string
		training string
		want     []Data
	}{
		{"absent", cmd, nil},
		{"bucket streams by default", cmd + `data {
  source = "s3://corpus/tokens"
  mount_path = "/data/corpus"
  size_gb = 2000
  region = "us-east-1"
}`, []Data{{Source: "s3://corpus/tokens", MountPath: "/data/corpus", Mode: DataStream, SizeGB: 2000, Region: "us-east-1"}}},
		{"staged bucket with a partial epoch", cmd + `data {
  source = "gs://laion/shards"
  mount_path = "/data/laion"
  mode = "stage"
  size_gb = 500
  read_per_epoch_gb = 250
  epoch_time = "3h"
  region = "us-central1"
}`, []Data{{Source: "gs://laion/shards", MountPath: "/data/laion", Mode: DataStage, SizeGB: 500, ReadPerEpochGB: 250, EpochTime: 3 * time.Hour, Region: "us-central1"}}},
		{"file system mounts, zone preferred", cmd + `data {
  source = "fsx://fs-0123456789abcdef0"
  mount_path = "/fsx"
  size_gb = 1200
  region = "us-east-1"
  zone = "us-east-1a"
}`, []Data{{Source: "fsx://fs-0123456789abcdef0", MountPath: "/fsx", Mode: DataMount, SizeGB: 1200, Region: "us-east-1", Zone: "us-east-1a", ZonePolicy: ZonePrefer}}},
		{"two blocks, zone required, nfs anywhere", cmd + `data {
  source = "filestore://10.20.0.2/share"
  mount_path = "/filestore"
  size_gb = 100
  region = "us-central1"
  zone = "us-central1-a"
  zone_policy = "required"
}
data {
  source = "nfs://10.0.0.5/export/data"
  mount_path = "/nfs"
  size_gb = 10
}`, []Data{
			{Source: "filestore://10.20.0.2/share", MountPath: "/filestore", Mode: DataMount, SizeGB: 100, Region: "us-central1", Zone: "us-central1-a", ZonePolicy: ZoneRequired},
			{Source: "nfs://10.0.0.5/export/data", MountPath: "/nfs", Mode: DataMount, SizeGB: 10, ZonePolicy: ZonePrefer},
		}},
		{"file systems pinned to their networks", cmd + `data {
  source = "fsx://fs-0123456789abcdef0"
  mount_path = "/fsx"
  size_gb = 1200
  region = "us-east-1"
  network = "vpc-0a1b2c3d"
}
data {
  source = "filestore://10.20.0.2/share"
  mount_path = "/filestore"
  size_gb = 100
  region = "us-central1"
  network = "training-net"
}
data {
  source = "nfs://10.0.0.5/export/data"
  mount_path = "/nfs"
  size_gb = 10
  network = "vpc-0123456789abcdef0"
}`, []Data{
			{Source: "fsx://fs-0123456789abcdef0", MountPath: "/fsx", Mode: DataMount, SizeGB: 1200, Region: "us-east-1", ZonePolicy: ZonePrefer, Network: "vpc-0a1b2c3d"},
			{Source: "filestore://10.20.0.2/share", MountPath: "/filestore", Mode: DataMount, SizeGB: 100, Region: "us-central1", ZonePolicy: ZonePrefer, Network: "training-net"},
			{Source: "nfs://10.0.0.5/export/data", MountPath: "/nfs", Mode: DataMount, SizeGB: 10, ZonePolicy: ZonePrefer, Network: "vpc-0123456789abcdef0"},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fl := mustParse(t, parts{training: c.training}.src(), testOptions()).Fleets[0]
			if !reflect.DeepEqual(fl.Training.Data, c.want) {
				t.Errorf("data = %+v, want %+v", fl.Training.Data, c.want)
			}
		})
	}
}

func TestParseDataSource(t *testing.T) {
	cases := []struct {
		in      string
		want    DataSource
		cloud   string
		fs      bool
		wantErr string
	}{
		{in: "s3://b/p/q", want: DataSource{Scheme: "s3", Host: "b", Path: "/p/q"}, cloud: "aws"},
		{in: "gs://b", want: DataSource{Scheme: "gs", Host: "b"}, cloud: "gcp"},
		{in: "efs://fs-1", want: DataSource{Scheme: "efs", Host: "fs-1"}, cloud: "aws", fs: true},
		{in: "filestore://10.20.0.2/share", want: DataSource{Scheme: "filestore", Host: "10.20.0.2", Path: "/share"}, cloud: "gcp", fs: true},
		{in: "nfs://h/x", want: DataSource{Scheme: "nfs", Host: "h", Path: "/x"}, fs: true},
		{in: "file:///data", want: DataSource{Scheme: "file", Path: "/data"}},
		{in: "file://data", wantErr: "three slashes"},
		{in: "nfs://h", wantErr: "names no export"},
		{in: "filestore://inst/share", wantErr: "mounted by the instance's IP address"},
		{in: "fsx://", wantErr: "names no file system id"},
		{in: "lustre://x", wantErr: `unknown scheme "lustre" (known: s3://, gs://`},
		{in: "/data", wantErr: "is not a URL"},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			got, err := ParseDataSource(c.in)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil || got != c.want || got.Cloud() != c.cloud || got.FileSystem() != c.fs {
				t.Fatalf("= %+v (cloud %q, fs %v), %v; want %+v", got, got.Cloud(), got.FileSystem(), err, c.want)
			}
		})
	}
}

// training.peer_port reaches the decoded spec; unset, it is 0 (each node
// picks a free port).
func TestPeerPort(t *testing.T) {
	for _, c := range []struct {
		training string
		want     int
	}{
		{`command = ["x"]`, 0},
		{"command = [\"x\"]\npeer_port = 7790", 7790},
	} {
		fl := mustParse(t, parts{training: c.training}.src(), testOptions()).Fleets[0]
		if fl.Training.PeerPort != c.want {
			t.Errorf("%q: peer_port %d, want %d", c.training, fl.Training.PeerPort, c.want)
		}
	}
}
