package spec

import (
	"reflect"
	"strings"
	"testing"
)

func TestCheckpointBlock(t *testing.T) {
	cmd := `command = ["python3", "train.py"]` + "\n"
	cases := []struct {
		name     string
		training string
		want     *Checkpoint
		uri      string
	}{
		{"absent", cmd, nil, ""},
		{"defaults", cmd + `checkpoint { dir = "/mnt/ckpt" }`, &Checkpoint{Dir: "/mnt/ckpt", Keep: 3}, ""},
		{"s3 signed by default", cmd + `checkpoint {
  dir = "ckpt"
  store = "s3://bucket/runs/bert"
  keep = 5
  size_gb = 200
}`, &Checkpoint{Dir: "ckpt", Store: "s3://bucket/runs/bert", Keep: 5, Access: "signed", SizeGB: 200}, ""},
		{"gs node access", cmd + `checkpoint {
  dir = "/mnt/ckpt"
  store = "gs://b/p"
  access = "node"
}`, &Checkpoint{Dir: "/mnt/ckpt", Store: "gs://b/p", Keep: 3, Access: "node"}, ""},
		{"file is node access", cmd + `checkpoint {
  dir = "/mnt/ckpt"
  store = "file:///srv/ckpt"
}`, &Checkpoint{Dir: "/mnt/ckpt", Store: "file:///srv/ckpt", Keep: 3, Access: "node"}, ""},
		{"s3 endpoint parameters", cmd + `checkpoint {
  dir = "/c"
  store = "s3://b?endpoint=http://127.0.0.1:5000&region=us-east-1&use_path_style=true"
}`, &Checkpoint{Dir: "/c", Store: "s3://b?endpoint=http://127.0.0.1:5000&region=us-east-1&use_path_style=true", Keep: 3, Access: "signed"}, ""},
		{"checkpoint_uri s3 becomes the store", cmd + `checkpoint_uri = "s3://b/old"
checkpoint { dir = "/mnt/ckpt" }`, &Checkpoint{Dir: "/mnt/ckpt", Store: "s3://b/old", Keep: 3, Access: "signed"}, "s3://b/old"},
		{"checkpoint_uri path becomes the dir", cmd + `checkpoint_uri = "file:///mnt/ckpt"
checkpoint { store = "gs://b/p" }`, &Checkpoint{Dir: "/mnt/ckpt", Store: "gs://b/p", Keep: 3, Access: "signed"}, "file:///mnt/ckpt"},
		{"checkpoint_uri alone keeps its meaning", cmd + `checkpoint_uri = "s3://b/old"`, nil, "s3://b/old"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fl := mustParse(t, parts{training: c.training}.src(), testOptions()).Fleets[0]
			if !reflect.DeepEqual(fl.Training.Checkpoint, c.want) {
				t.Errorf("checkpoint = %+v, want %+v", fl.Training.Checkpoint, c.want)
			}
			if fl.Training.CheckpointURI != c.uri {
				t.Errorf("checkpoint_uri = %q, want %q", fl.Training.CheckpointURI, c.uri)
			}
		})
	}
}

func TestCheckpointErrors(t *testing.T) {
	cmd := `command = ["python3", "train.py"]` + "\n"
	cases := []struct {
		block   string
		summary string
		subject string
	}{
		{`checkpoint { keep = 2 }`, "Missing checkpoint dir", "checkpoint"},
		{`checkpoint { dir = "" }`, "Empty checkpoint dir", `""`},
		{`checkpoint { dir = "s3://b/p" }`, "Invalid checkpoint dir", `"s3://b/p"`},
		{`checkpoint {
  dir = "/c"
  store = "azblob://x"
}`, "Invalid checkpoint store", `"azblob://x"`},
		{`checkpoint {
  dir = "/c"
  store = "s3:///p"
}`, "Invalid checkpoint store", `"s3:///p"`},
		{`checkpoint {
  dir = "/c"
  store = "file://srv/ckpt"
}`, "Invalid checkpoint store", `"file://srv/ckpt"`},
		{`checkpoint {
  dir = "/c"
  store = "s3://b/p?endpont=x"
}`, "Invalid checkpoint store", `"s3://b/p?endpont=x"`},
		{`checkpoint {
  dir = "/c"
  keep = 0
}`, "Invalid keep", "0"},
		{`checkpoint {
  dir = "/c"
  store = "file:///srv/c"
  access = "signed"
}`, "Signed URLs for a file store", `"signed"`},
		{`checkpoint {
  dir = "/c"
  store = "s3://b"
  access = "role"
}`, "Unsupported access", `"role"`},
		{`checkpoint {
  dir = "/c"
  size_gb = -1
}`, "Invalid size_gb", "-1"},
		{`checkpoint { dir = "/c" }
checkpoint { dir = "/d" }`, "Duplicate checkpoint block", "checkpoint"},
	}
	for _, c := range cases {
		t.Run(c.summary, func(t *testing.T) {
			src := parts{training: cmd + c.block}.src()
			_, diags := parseString(t, src, testOptions())
			found := false
			for _, d := range diags {
				if d.Summary == c.summary {
					found = true
					if got := subjectText(src, d); !strings.Contains(got, c.subject) {
						t.Errorf("%s: subject %q, want it to contain %q", c.summary, got, c.subject)
					}
				}
			}
			if !found {
				t.Errorf("no %q among %v", c.summary, diags)
			}
		})
	}
}

func TestCheckpointAccessWarning(t *testing.T) {
	src := parts{training: `command = ["python3", "train.py"]
checkpoint {
  dir = "/c"
  access = "node"
}`}.src()
	_, diags := parseString(t, src, testOptions())
	if diags.HasErrors() || len(diags) != 1 || diags[0].Summary != "access has no effect" {
		t.Fatalf("diags = %v, want one warning", diags)
	}
}

func TestParseStoreURL(t *testing.T) {
	cases := []struct {
		in                     string
		scheme, bucket, prefix string
		opener, cloud          string
	}{
		{"s3://b", "s3", "b", "", "s3://b", "aws"},
		{"s3://b/runs/bert/", "s3", "b", "runs/bert", "s3://b", "aws"},
		{"gs://b/p", "gs", "b", "p", "gs://b", "gcp"},
		{"file:///srv/ckpt/", "file", "/srv/ckpt", "", "file:///srv/ckpt", ""},
		{"s3://b/p?region=eu-west-1", "s3", "b", "p", "s3://b?region=eu-west-1", "aws"},
	}
	for _, c := range cases {
		st, err := ParseStoreURL(c.in)
		if err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		if st.Scheme != c.scheme || st.Bucket != c.bucket || st.Prefix != c.prefix || st.OpenerURL() != c.opener || st.Cloud() != c.cloud {
			t.Errorf("%s: got %+v opener %s cloud %s", c.in, st, st.OpenerURL(), st.Cloud())
		}
	}
	for _, bad := range []string{"s3://b/a//b", "s3://b/../x", "file:///", "http://x/y", "gs://"} {
		if _, err := ParseStoreURL(bad); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

func TestEgressOverrides(t *testing.T) {
	fl := mustParse(t, parts{placement: `egress_per_gb = {
  "aws->gcp" = 0.05
  "aws:us-east-1->gcp:us-east4" = 0.01
  "*->*" = 0
}`}.src(), testOptions()).Fleets[0]
	want := map[string]float64{"aws->gcp": 0.05, "aws:us-east-1->gcp:us-east4": 0.01, "*->*": 0}
	if !reflect.DeepEqual(fl.Placement.EgressPerGB, want) {
		t.Fatalf("egress %v", fl.Placement.EgressPerGB)
	}
	src := parts{placement: `egress_per_gb = {
  "aws=>gcp" = 0.05
  "aws->gcp" = -1
}`}.src()
	_, diags := parseString(t, src, testOptions())
	if len(diags) != 2 || diags[0].Summary != "Invalid egress price" && diags[1].Summary != "Invalid egress price" {
		t.Fatalf("diags %v", diags)
	}
	for _, d := range diags {
		if got := subjectText(src, d); got != `"aws=>gcp"` && got != `"aws->gcp"` {
			t.Errorf("%s points at %q, want the key", d.Summary, got)
		}
	}
}
