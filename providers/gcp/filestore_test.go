package gcp_test

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/gcp/fakefilestore"
	"github.com/fleetd/fleetd/providers/gcp/fakegce"
)

// TestCheckFilestore: the file-system rows of a filestore://IP/SHARE
// dataset, against Filestore's REST API (fakefilestore): the instance
// serving that address and share, READY, in a zone the job may use, on
// the nodes' network.
func TestCheckFilestore(t *testing.T) {
	fsCheck := func(ip, share, zone string, zones ...string) providers.FileSystemCheck {
		return providers.FileSystemCheck{Source: "filestore://" + ip + "/" + share, Scheme: "filestore", Host: ip, Path: "/" + share,
			Region: "us-central1", Zone: zone, Zones: zones}
	}
	cases := []struct {
		name  string
		extra map[string]any // block attributes
		deny  string
		fs    providers.FileSystemCheck
		// failed are the checks that must fail, in order; fix a substring
		// of the first's fix, detail of some row's detail.
		failed      []string
		fix, detail string
		rows        int
	}{
		{name: "ok", fs: fsCheck("10.20.0.2", "share", "us-central1-a"), rows: 3, detail: "ingress firewall rules do not apply"},
		{name: "ok across zones", fs: fsCheck("10.20.0.2", "share", ""), rows: 3, detail: "other zones of us-central1 mount it across zones"},
		{name: "required zone", fs: fsCheck("10.20.0.2", "share", "us-central1-a", "us-central1-a"), rows: 3, detail: "in us-central1-a, where the job may run"},
		{name: "regional tier", fs: fsCheck("10.20.0.10", "vol", ""), rows: 3, detail: "regional instance in us-central1"},
		{name: "many instances over pages", fs: fsCheck("10.20.0.40", "share", ""), rows: 3},
		{name: "missing share", fs: fsCheck("10.20.0.2", "other", ""), rows: 1,
			failed: []string{"file system"}, fix: "gcloud filestore instances list --project fleetd-test"},
		{name: "missing address", fs: fsCheck("10.99.0.2", "share", ""), rows: 1, failed: []string{"file system"}},
		{name: "not ready", fs: fsCheck("10.20.0.3", "share", ""), rows: 1, failed: []string{"file system"}, fix: "wait until it is READY"},
		{name: "wrong zone in the data block", fs: fsCheck("10.20.0.2", "share", "us-central1-b"), rows: 3,
			failed: []string{"file system zone"}, fix: `zone = "us-central1-a"`},
		{name: "outside the block's zones", extra: map[string]any{"zones": []string{"us-central1-b"}}, fs: fsCheck("10.20.0.2", "share", ""), rows: 3,
			failed: []string{"file system zone"}, fix: "add us-central1-a to the block's zones"},
		{name: "in another region", fs: fsCheck("10.30.0.2", "share", ""), rows: 3,
			failed: []string{"file system zone", "file system network"}, fix: `region = "europe-west4"`},
		{name: "another network", fs: fsCheck("10.20.0.20", "share", "us-central1-a"), rows: 3,
			failed: []string{"file system network"}, fix: "set the block's network to fleetd-test/other"},
		{name: "the block's named network", extra: map[string]any{"network": "other"}, fs: fsCheck("10.20.0.20", "share", "us-central1-a"), rows: 3},
		{name: "denied", deny: "Permission 'file.instances.list' denied on 'projects/fleetd-test/locations/-'", fs: fsCheck("10.20.0.2", "share", ""), rows: 1,
			failed: []string{"file system"}, fix: "--role=roles/file.viewer"},
		{name: "api disabled", deny: "Cloud Filestore API has not been used in project 123456789012 before or it is disabled.", fs: fsCheck("10.20.0.2", "share", ""), rows: 1,
			failed: []string{"file system"}, fix: "gcloud services enable file.googleapis.com"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fsrv := fakefilestore.New("fleetd-test")
			t.Cleanup(fsrv.Close)
			fsrv.Add("us-central1-a", "data", "share", "default", "10.20.0.2", "")
			fsrv.Add("us-central1-a", "busy", "share", "default", "10.20.0.3", "CREATING")
			fsrv.Add("us-central1", "regional", "vol", "projects/fleetd-test/global/networks/default", "10.20.0.10", "")
			fsrv.Add("us-central1-a", "elsewhere", "share", "other", "10.20.0.20", "")
			fsrv.Add("europe-west4-a", "far", "share", "far", "10.30.0.2", "")
			fsrv.SetPageSize(50)
			for i := range 120 { // three pages
				fsrv.Add("us-central1-b", fmt.Sprintf("many-%03d", i), "share", "default", "10.21.0."+strconv.Itoa(i), "")
			}
			// Sorted last, on the third page.
			fsrv.Add("us-central1-b", "zzz-last", "share", "default", "10.20.0.40", "")
			if tc.deny != "" {
				fsrv.Deny(tc.deny)
			}
			extra := map[string]any{"filestore_endpoint": fsrv.URL}
			for k, v := range tc.extra {
				extra[k] = v
			}
			_, cfg := newFake(t, fakegce.Options{}, extra)
			rs, err := newProvider().Check(ctxT(t), cfg, providers.CheckOptions{TargetNodes: 1, FileSystems: []providers.FileSystemCheck{tc.fs}})
			if err != nil {
				t.Fatal(err)
			}
			var rows []providers.CheckResult
			for _, r := range rs {
				if strings.HasPrefix(r.Check, "file system") {
					rows = append(rows, r)
				}
			}
			if len(rows) != tc.rows {
				t.Fatalf("%d file-system rows, want %d: %+v", len(rows), tc.rows, rows)
			}
			var failed, fixes []string
			details := ""
			for _, r := range rows {
				details += r.Detail + "\n"
				switch r.Status {
				case providers.CheckFailed:
					failed, fixes = append(failed, r.Check), append(fixes, r.Fix)
				case providers.CheckOK:
				default:
					t.Errorf("row %+v is %s", r, r.Status)
				}
			}
			if !slices.Equal(failed, tc.failed) {
				t.Fatalf("failed rows %q, want %q: %+v", failed, tc.failed, rows)
			}
			if tc.fix != "" && !strings.Contains(fixes[0], tc.fix) {
				t.Errorf("fix %q does not say %q", fixes[0], tc.fix)
			}
			if !strings.Contains(details, tc.detail) {
				t.Errorf("no row says %q:\n%s", tc.detail, details)
			}
		})
	}
	t.Run("no filestore data, no call", func(t *testing.T) {
		fsrv := fakefilestore.New("fleetd-test")
		t.Cleanup(fsrv.Close)
		_, cfg := newFake(t, fakegce.Options{}, map[string]any{"filestore_endpoint": fsrv.URL})
		if _, err := newProvider().Check(ctxT(t), cfg, providers.CheckOptions{Quick: true,
			FileSystems: []providers.FileSystemCheck{fsCheck("10.20.0.2", "share", "")}}); err != nil {
			t.Fatal(err)
		}
		if _, err := newProvider().Check(ctxT(t), cfg, providers.CheckOptions{}); err != nil {
			t.Fatal(err)
		}
		if n := fsrv.Calls(); n != 0 {
			t.Errorf("%d Filestore calls for a quick check and one without filestore data", n)
		}
	})
}
