package main

import (
	"bytes"
	"encoding/json"
	"runtime/debug"
	"strings"
	"testing"
)

// TestVersionCommit: the commit linked in with -X main.commit wins; without
// it, the VCS revision from the build info; a modified tree is marked dirty;
// text and JSON both carry it.
func TestVersionCommit(t *testing.T) {
	stamped := &debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "1111111111111111111111111111111111111111"}, {Key: "vcs.modified", Value: "true"}}}
	for _, tc := range []struct {
		name, commit string
		bi           *debug.BuildInfo
		want, dirty  string
	}{
		{"ldflags", "abcdef0123456789abcdef0123456789abcdef01", nil, "abcdef0123456789abcdef0123456789abcdef01", ""},
		{"ldflags over build info", "abcdef0123456789abcdef0123456789abcdef01", stamped, "abcdef0123456789abcdef0123456789abcdef01", "true"},
		{"build info", "", stamped, "1111111111111111111111111111111111111111", "true"},
		{"clean build info", "", &debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "2222222222222222222222222222222222222222"}, {Key: "vcs.modified", Value: "false"}}}, "2222222222222222222222222222222222222222", ""},
		{"neither", "", &debug.BuildInfo{}, "unknown", ""},
	} {
		info := buildInfoFrom("v1.2.3", tc.commit, tc.bi)
		if info["commit"] != tc.want || info["dirty"] != tc.dirty || info["version"] != "v1.2.3" {
			t.Errorf("%s: %v, want commit %s dirty %q", tc.name, info, tc.want, tc.dirty)
		}
	}

	old := commit
	commit = "abcdef0123456789abcdef0123456789abcdef01"
	defer func() { commit = old }()
	var out, errb bytes.Buffer
	if code := run([]string{"version"}, &out, &errb); code != exitOK || !strings.Contains(out.String(), "commit abcdef012345") {
		t.Errorf("fleetd version: exit %d %q, want the commit's first 12 digits", code, out.String())
	}
	out.Reset()
	if code := run([]string{"version", "-json"}, &out, &errb); code != exitOK {
		t.Fatalf("fleetd version -json: exit %d %s", code, errb.String())
	}
	var info map[string]string
	if err := json.Unmarshal(out.Bytes(), &info); err != nil {
		t.Fatal(err)
	}
	if info["commit"] != commit || info["version"] != version || info["go"] == "" || info["platform"] == "" {
		t.Errorf("fleetd version -json: %v", info)
	}
}
