package gcp_test

import (
	"encoding/json"
	"flag"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/gcp"
	"github.com/fleetd/fleetd/providers/gcp/fakegce"
	"github.com/fleetd/fleetd/providers/providertest"
)

var showReports = flag.Bool("show-reports", false, "print each check report")

// row is what a test expects of one result: its status, and words its
// detail and fix must contain.
type row struct {
	check, scope string
	status       providers.CheckStatus
	detail, fix  string
}

const saEmail = "nodes@fleetd-test.iam.gserviceaccount.com"

func TestCheck(t *testing.T) {
	cases := []struct {
		name  string
		extra map[string]any
		opts  providers.CheckOptions
		setup func(f *fakegce.Server)
		// want lists rows that must be in the report; every other row must
		// be ok unless otherOK is false.
		want    []row
		notWant []string // checks that must be absent
		// calls are fake methods that must (true) or must not (false) be called.
		calls map[string]bool
		zones []fakegce.Zone // the fake's zones, when not the default
	}{
		{
			name: "all good",
			opts: providers.CheckOptions{TargetNodes: 4},
			want: []row{
				{check: "credentials", status: providers.CheckOK, detail: "plain http"},
				{check: "project", status: providers.CheckOK, detail: "fleetd-test (number 123456789012)"},
				{check: "image", status: providers.CheckOK, detail: "pytorch-latest-gpu-v20260801 (READY, family pytorch-latest-gpu"},
				{check: "zone", scope: "us-central1-b", status: providers.CheckOK, detail: "is UP"},
				{check: "machine type a2-highgpu-1g", scope: "us-central1-a", status: providers.CheckOK, detail: "1 × nvidia-tesla-a100 built in"},
				{check: "machine type n1-standard-8", scope: "us-central1-b", status: providers.CheckOK, detail: "1 × nvidia-tesla-t4 attached"},
				{check: "accelerator nvidia-tesla-t4", scope: "us-central1-a", status: providers.CheckOK, detail: "up to 4 per VM"},
				{check: "quota GPUS_ALL_REGIONS", status: providers.CheckOK, detail: "need 4"},
				{check: "quota NVIDIA_A100_GPUS", scope: "us-central1", status: providers.CheckOK, detail: "limit 16, used 0, 16 free; 4 nodes × 1 (a2-highgpu-1g) need 4"},
				{check: "quota spot NVIDIA_A100_GPUS", scope: "us-central1", status: providers.CheckOK, detail: "count against PREEMPTIBLE_NVIDIA_A100_GPUS"},
				{check: "quota spot NVIDIA_T4_GPUS", scope: "us-central1", status: providers.CheckOK, detail: "PREEMPTIBLE_NVIDIA_T4_GPUS is 0 or absent, so Spot VMs count against NVIDIA_T4_GPUS"},
				{check: "quota A2_CPUS", scope: "us-central1", status: providers.CheckOK, detail: "need 48"},
				{check: "quota spot CPUS", scope: "us-central1", status: providers.CheckOK, detail: "count against CPUS"},
				{check: "permissions", status: providers.CheckOK, detail: "all 14 permissions"},
			},
			calls: map[string]bool{"regions.get": true, "zones.get": true, "acceleratorTypes.get": true, "projects.testIamPermissions": true},
		},
		{
			name:  "image family missing",
			extra: map[string]any{"image": "projects/deeplearning-platform-release/global/images/family/no-such-family"},
			want: []row{{check: "image", status: providers.CheckFailed,
				detail: "image family no-such-family has no usable image in project deeplearning-platform-release",
				fix:    "gcloud compute images list --project deeplearning-platform-release"}},
		},
		{
			name:  "image deleted",
			extra: map[string]any{"image": "projects/debian-cloud/global/images/debian-12-bookworm-v20260801"},
			setup: func(f *fakegce.Server) { f.RemoveImage("debian-cloud", "debian-12-bookworm-v20260801") },
			want: []row{{check: "image", status: providers.CheckFailed,
				detail: "image debian-12-bookworm-v20260801 not found in project debian-cloud", fix: "set image to an existing image"}},
		},
		{
			name:  "deprecated image is usable",
			extra: map[string]any{"image": "projects/debian-cloud/global/images/debian-12-bookworm-v20260701"},
			want:  []row{{check: "image", status: providers.CheckOK, detail: "deprecated, still usable"}},
		},
		{
			name:  "image larger than the boot disk",
			extra: map[string]any{"image": "global/images/big", "disk_size_gb": 100},
			setup: func(f *fakegce.Server) { f.AddImage("fleetd-test", fakegce.ImageSpec{Name: "big", DiskSizeGb: 150}) },
			want:  []row{{check: "image", status: providers.CheckFailed, detail: "larger than the 100 GB boot disk", fix: "set disk_size_gb to at least 150"}},
		},
		{
			name:  "zone missing",
			extra: map[string]any{"zones": []string{"us-central1-a", "us-central1-z"}},
			want: []row{{check: "zone", scope: "us-central1-z", status: providers.CheckFailed,
				detail: "zone us-central1-z does not exist", fix: "remove us-central1-z from zones"}},
		},
		{
			name:  "zone down",
			setup: func(f *fakegce.Server) { f.SetZoneStatus("us-central1-b", "DOWN") },
			want:  []row{{check: "zone", scope: "us-central1-b", status: providers.CheckFailed, detail: "is DOWN", fix: "until it is UP"}},
		},
		{
			name:  "machine type in no zone",
			extra: map[string]any{"machine_types": []string{"g2-standard-8", "a3-ultragpu-8g"}},
			want: []row{
				{check: "machine type a3-ultragpu-8g", scope: "us-central1-a", status: providers.CheckFailed, detail: "nor in any other zone", fix: "remove a3-ultragpu-8g from machine_types"},
				{check: "machine type a3-ultragpu-8g", scope: "us-central1-b", status: providers.CheckFailed},
			},
		},
		{
			name:  "machine type in one zone only",
			zones: []fakegce.Zone{{Name: "us-central1-a"}, {Name: "us-central1-b", MachineTypes: withoutA2()}},
			extra: map[string]any{"machine_types": []string{"g2-standard-8", "a2-highgpu-1g"}},
			want: []row{
				{check: "machine type a2-highgpu-1g", scope: "us-central1-b", status: providers.CheckOK, detail: "not offered in us-central1-b; fleetd uses it in us-central1-a"},
			},
		},
		{
			name:  "accelerator count above the zone limit",
			extra: map[string]any{"accelerators": map[string]any{"type": "nvidia-tesla-t4", "count": 8}},
			want:  []row{{check: "accelerator nvidia-tesla-t4", scope: "us-central1-a", status: providers.CheckFailed, fix: "at most 4"}},
		},
		{
			name:  "accelerator in no zone",
			extra: map[string]any{"accelerators": map[string]any{"type": "nvidia-tesla-k80", "count": 1}},
			want:  []row{{check: "accelerator nvidia-tesla-k80", scope: "us-central1-b", status: providers.CheckFailed, detail: "no N1 type gets GPUs"}},
		},
		{
			name:  "low GPU quota",
			opts:  providers.CheckOptions{TargetNodes: 4},
			setup: func(f *fakegce.Server) { f.SetQuota("us-central1", "NVIDIA_A100_GPUS", 4, 2) },
			want: []row{{check: "quota NVIDIA_A100_GPUS", scope: "us-central1", status: providers.CheckFailed,
				detail: "limit 4, used 2, 2 free; 4 nodes × 1 (a2-highgpu-1g) need 4",
				fix:    "request quota NVIDIA_A100_GPUS in us-central1 at https://console.cloud.google.com/iam-admin/quotas?project=fleetd-test"}},
		},
		{
			name:  "no preemptible quota puts spot on the standard one",
			opts:  providers.CheckOptions{TargetNodes: 10},
			setup: func(f *fakegce.Server) { f.SetQuota("us-central1", "PREEMPTIBLE_NVIDIA_L4_GPUS", 0, 0) },
			extra: map[string]any{"machine_types": []string{"g2-standard-24"}, "accelerators": nil},
			want: []row{
				{check: "quota NVIDIA_L4_GPUS", scope: "us-central1", status: providers.CheckFailed, detail: "need 20"},
				{check: "quota spot NVIDIA_L4_GPUS", scope: "us-central1", status: providers.CheckFailed,
					detail: "PREEMPTIBLE_NVIDIA_L4_GPUS is 0 or absent, so Spot VMs count against NVIDIA_L4_GPUS", fix: "request quota NVIDIA_L4_GPUS in us-central1"},
				{check: "quota GPUS_ALL_REGIONS", status: providers.CheckOK},
			},
		},
		{
			name:  "low preemptible quota",
			opts:  providers.CheckOptions{TargetNodes: 3},
			setup: func(f *fakegce.Server) { f.SetQuota("us-central1", "PREEMPTIBLE_NVIDIA_A100_GPUS", 2, 0) },
			want: []row{{check: "quota spot NVIDIA_A100_GPUS", scope: "us-central1", status: providers.CheckFailed,
				detail: "Spot VMs count against PREEMPTIBLE_NVIDIA_A100_GPUS", fix: "request quota PREEMPTIBLE_NVIDIA_A100_GPUS in us-central1"}},
		},
		{
			name:  "low global GPU quota",
			opts:  providers.CheckOptions{TargetNodes: 8},
			setup: func(f *fakegce.Server) { f.SetQuota("", "GPUS_ALL_REGIONS", 4, 0) },
			want:  []row{{check: "quota GPUS_ALL_REGIONS", status: providers.CheckFailed, fix: "request quota GPUS_ALL_REGIONS globally"}},
		},
		{
			name:  "GPU quota the region does not report",
			extra: map[string]any{"machine_types": []string{"a3-megagpu-8g"}, "accelerators": nil},
			want: []row{
				{check: "quota NVIDIA_H100_MEGA_GPUS", scope: "us-central1", status: providers.CheckUnavailable, fix: "console.cloud.google.com"},
				{check: "quota spot NVIDIA_H100_MEGA_GPUS", scope: "us-central1", status: providers.CheckUnavailable},
			},
		},
		{
			name: "denied permission",
			setup: func(f *fakegce.Server) {
				f.SetDeniedPermissions("compute.instances.create", "compute.zoneOperations.list")
			},
			want: []row{
				{check: "permission compute.instances.create", status: providers.CheckFailed, detail: "not granted on project fleetd-test (needed to launch nodes)",
					fix: "grant roles/compute.instanceAdmin.v1 to the account fleetd runs as: gcloud projects add-iam-policy-binding fleetd-test --member=MEMBER --role=roles/compute.instanceAdmin.v1"},
				{check: "permission compute.zoneOperations.list", status: providers.CheckFailed, fix: "roles/compute.instanceAdmin.v1"},
			},
			notWant: []string{"permissions"},
		},
		{
			name:  "actAs granted on the service account only",
			extra: map[string]any{"service_account": saEmail},
			setup: func(f *fakegce.Server) { f.SetDeniedPermissions("iam.serviceAccounts.actAs") },
			want:  []row{{check: "permissions", status: providers.CheckOK, detail: "all 16 permissions fleetd uses are granted on project fleetd-test; iam.serviceAccounts.actAs granted on " + saEmail}},
			calls: map[string]bool{"serviceAccounts.testIamPermissions": true},
		},
		{
			name:  "actAs granted nowhere",
			extra: map[string]any{"service_account": saEmail},
			setup: func(f *fakegce.Server) {
				f.SetDeniedPermissions("iam.serviceAccounts.actAs")
				f.SetDeniedServiceAccountPermissions(saEmail, "iam.serviceAccounts.actAs")
			},
			want: []row{{check: "permission iam.serviceAccounts.actAs", status: providers.CheckFailed, detail: "granted neither on project fleetd-test nor on " + saEmail,
				fix: "grant roles/iam.serviceAccountUser on " + saEmail}},
		},
		{
			name:  "Resource Manager disabled",
			setup: func(f *fakegce.Server) { f.SetResourceManagerDisabled(true) },
			want: []row{{check: "permissions", status: providers.CheckUnavailable, detail: "Cloud Resource Manager API is not enabled",
				fix: "gcloud services enable cloudresourcemanager.googleapis.com --project fleetd-test"}},
		},
		{
			name:  "unknown project skips the project's checks",
			extra: map[string]any{"project": "no-such-project"},
			want: []row{
				{check: "project", status: providers.CheckFailed, detail: `project "no-such-project" not found`, fix: "gcloud projects list"},
				{check: "image", status: providers.CheckOK},
			},
			notWant: []string{"zone", "machine type g2-standard-8", "permissions"},
		},
		{
			name: "quick mode skips the sweeps",
			opts: providers.CheckOptions{Quick: true, TargetNodes: 1000},
			setup: func(f *fakegce.Server) {
				f.SetQuota("us-central1", "NVIDIA_A100_GPUS", 0, 0)
				f.SetDeniedPermissions("compute.instances.create")
				f.SetZoneStatus("us-central1-a", "DOWN")
			},
			want: []row{
				{check: "credentials", status: providers.CheckOK},
				{check: "project", status: providers.CheckOK},
				{check: "image", status: providers.CheckOK},
				{check: "machine type g2-standard-8", scope: "us-central1-a", status: providers.CheckOK},
			},
			notWant: []string{"zone", "accelerator nvidia-tesla-t4", "quota NVIDIA_A100_GPUS", "permissions", "permission compute.instances.create"},
			calls: map[string]bool{
				"projects.get": true, "images.getFromFamily": true,
				"zones.get": false, "regions.get": false, "acceleratorTypes.get": false, "projects.testIamPermissions": false,
			},
		},
		{
			name:  "quick mode reports a missing zone once",
			opts:  providers.CheckOptions{Quick: true},
			extra: map[string]any{"zones": []string{"us-central1-a", "us-central1-z"}},
			want:  []row{{check: "zone", scope: "us-central1-z", status: providers.CheckFailed, detail: "does not exist"}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, cfg := newFake(t, fakegce.Options{Zones: tc.zones}, tc.extra)
			if tc.setup != nil {
				tc.setup(f)
			}
			rs, err := newProvider().Check(ctxT(t), cfg, tc.opts)
			if err != nil {
				t.Fatalf("Check: %v", err)
			}
			if *showReports {
				t.Logf("report:\n%s", formatReport(rs))
			}
			checkReport(t, rs)
			matched := map[int]bool{}
			for _, w := range tc.want {
				i := slices.IndexFunc(rs, func(r providers.CheckResult) bool { return r.Check == w.check && r.Scope == w.scope })
				if i < 0 {
					t.Errorf("no row %q %q in\n%s", w.check, w.scope, formatReport(rs))
					continue
				}
				matched[i] = true
				r := rs[i]
				if r.Status != w.status || !strings.Contains(r.Detail, w.detail) || !strings.Contains(r.Fix, w.fix) {
					t.Errorf("row %q %q = %s / %q / fix %q\nwant %s, detail with %q, fix with %q", w.check, w.scope, r.Status, r.Detail, r.Fix, w.status, w.detail, w.fix)
				}
			}
			for i, r := range rs {
				if !matched[i] && r.Status != providers.CheckOK && !expectedFailure(tc.want, r) {
					t.Errorf("unexpected %s row %q %q: %s (fix %q)", r.Status, r.Check, r.Scope, r.Detail, r.Fix)
				}
				if slices.Contains(tc.notWant, r.Check) {
					t.Errorf("row %q %q should not be in the report", r.Check, r.Scope)
				}
			}
			calls := f.CheckRequests()
			for m, want := range tc.calls {
				if got := calls[m] > 0; got != want {
					t.Errorf("fake method %s called %d times, want called=%v", m, calls[m], want)
				}
			}
		})
	}
}

func withoutA2() []fakegce.MachineTypeSpec {
	var out []fakegce.MachineTypeSpec
	for _, m := range fakegce.DefaultMachineTypes {
		if !strings.HasPrefix(m.Name, "a2-") {
			out = append(out, m)
		}
	}
	return out
}

// expectedFailure lets rows of a check the case expects to fail in one
// scope fail in its other scopes too (a missing type fails in every zone).
func expectedFailure(want []row, r providers.CheckResult) bool {
	return slices.ContainsFunc(want, func(w row) bool { return w.check == r.Check && w.status == r.Status })
}

// checkReport holds for every report: a fix on every row that is not ok
// and none on ok rows, no duplicate rows, zones and regions in block order.
func checkReport(t *testing.T, rs []providers.CheckResult) {
	t.Helper()
	seen := map[string]bool{}
	for _, r := range rs {
		key := r.Check + "@" + r.Scope
		if seen[key] {
			t.Errorf("row %q %q twice", r.Check, r.Scope)
		}
		seen[key] = true
		if (r.Status == providers.CheckOK) != (r.Fix == "") {
			t.Errorf("row %q %q: status %s with fix %q", r.Check, r.Scope, r.Status, r.Fix)
		}
		if r.Detail == "" {
			t.Errorf("row %q %q has no detail", r.Check, r.Scope)
		}
	}
}

func TestCheckIsDeterministic(t *testing.T) {
	f, cfg := newFake(t, fakegce.Options{Zones: []fakegce.Zone{{Name: "us-central1-a"}, {Name: "us-central1-b"}, {Name: "us-east1-c"}, {Name: "europe-west4-a"}}},
		map[string]any{"zones": []string{"us-east1-c", "us-central1-a", "europe-west4-a", "us-central1-b"}})
	f.SetDeniedPermissions("compute.instances.delete", "compute.disks.create")
	p := newProvider()
	first, err := p.Check(ctxT(t), cfg, providers.CheckOptions{TargetNodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, r := range first {
		if r.Check == "zone" || strings.HasPrefix(r.Check, "quota NVIDIA_A100") {
			order = append(order, r.Scope)
		}
	}
	if want := []string{"us-east1-c", "us-central1-a", "europe-west4-a", "us-central1-b", "us-east1", "us-central1", "europe-west4"}; !slices.Equal(order, want) {
		t.Errorf("zone and region order %v, want %v (block order)", order, want)
	}
	for range 3 {
		again, err := p.Check(ctxT(t), cfg, providers.CheckOptions{TargetNodes: 2})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(first, again) {
			t.Fatalf("reports differ:\n%s\n---\n%s", formatReport(first), formatReport(again))
		}
	}
}

// TestCheckOverGRPC runs the check in a plugin subprocess, the way the
// daemon does, and gets the same report as in-process.
func TestCheckOverGRPC(t *testing.T) {
	f, cfg := newFake(t, fakegce.Options{}, nil)
	f.SetDeniedPermissions("compute.instances.delete")
	f.SetQuota("us-central1", "NVIDIA_L4_GPUS", 1, 0)
	opts := providers.CheckOptions{TargetNodes: 2}
	want, err := newProvider().Check(ctxT(t), cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	p, err := providertest.NewPluginManager(t, []string{gcp.Name}, nil).Get(ctxT(t), gcp.Name)
	if err != nil {
		t.Fatalf("start plugin: %v", err)
	}
	ch, ok := p.(providers.Checker)
	if !ok {
		t.Fatalf("plugin provider %T is no providers.Checker", p)
	}
	got, err := ch.Check(ctxT(t), cfg, opts)
	if err != nil {
		t.Fatalf("Check over gRPC: %v", err)
	}
	if !slices.Equal(got, want) {
		t.Errorf("over gRPC:\n%s\nin-process:\n%s", formatReport(got), formatReport(want))
	}
	if providers.CheckPassed(got) {
		t.Errorf("a denied permission and a low quota passed:\n%s", formatReport(got))
	}
}

func TestCheckQuotaCountsRunningNodes(t *testing.T) {
	// The fake charges its live instances to the quotas, so a launch
	// shows in the next check.
	f, cfg := newFake(t, fakegce.Options{}, map[string]any{"machine_types": []string{"a2-highgpu-2g"}, "accelerators": nil})
	f.SetQuota("us-central1", "NVIDIA_A100_GPUS", 4, 0)
	p := newProvider()
	off := offering(t, p, cfg, "us-central1-a", "a2-highgpu-2g", providers.OnDemand)
	if _, err := p.Create(ctxT(t), cfg, launchReq(off, "q1")); err != nil {
		t.Fatal(err)
	}
	rs, err := p.Check(ctxT(t), cfg, providers.CheckOptions{TargetNodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(rs, func(r providers.CheckResult) bool { return r.Check == "quota NVIDIA_A100_GPUS" })
	if i < 0 || rs[i].Status != providers.CheckFailed || !strings.Contains(rs[i].Detail, "used 2, 2 free") {
		t.Errorf("quota row after one 2-GPU launch: %+v", rs)
	}
}

func TestCheckErrors(t *testing.T) {
	f := fakegce.New(fakegce.Options{})
	t.Cleanup(f.Close)
	cases := []struct {
		name       string
		extra      map[string]any
		closed     bool
		wantErr    bool
		wantStatus map[string]providers.CheckStatus
	}{
		{name: "invalid block", extra: map[string]any{"zones": []string{}}, wantErr: true},
		{name: "unknown attribute", extra: map[string]any{"regoin": "x"}, wantErr: true},
		{name: "bad resource manager endpoint", extra: map[string]any{"resource_manager_endpoint": "ftp://x"}, wantErr: true},
		{name: "image that is no image path", extra: map[string]any{"image": "ubuntu"},
			wantStatus: map[string]providers.CheckStatus{"image": providers.CheckFailed, "project": providers.CheckOK}},
		{name: "resource manager not served", extra: map[string]any{"resource_manager_endpoint": f.URL + "/nothing-here"},
			wantStatus: map[string]providers.CheckStatus{"permissions": providers.CheckUnavailable}},
		{name: "endpoint down", closed: true,
			wantStatus: map[string]providers.CheckStatus{"credentials": providers.CheckOK, "project": providers.CheckUnavailable, "image": providers.CheckUnavailable}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := blockFor(t, f, tc.extra)
			if tc.closed {
				g := fakegce.New(fakegce.Options{})
				cfg = blockFor(t, g, tc.extra)
				g.Close()
			}
			rs, err := newProvider().Check(ctxT(t), cfg, providers.CheckOptions{})
			if tc.wantErr {
				if !providers.IsInvalidConfig(err) {
					t.Errorf("Check: %v, want an invalid-config error", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Check: %v", err)
			}
			checkReport(t, rs)
			for check, want := range tc.wantStatus {
				i := slices.IndexFunc(rs, func(r providers.CheckResult) bool { return r.Check == check })
				if i < 0 || rs[i].Status != want {
					t.Errorf("row %q: want %s in\n%s", check, want, formatReport(rs))
				}
			}
		})
	}
}

func TestCheckWithoutCredentials(t *testing.T) {
	// An https endpoint needs credentials; a credentials file that does
	// not exist fails the lookup before anything is called.
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", filepath.Join(t.TempDir(), "missing.json"))
	raw, _ := json.Marshal(map[string]any{
		"project": "fleetd-test", "zones": []string{"us-central1-a"}, "machine_types": []string{"g2-standard-8"},
		"image": "projects/debian-cloud/global/images/family/debian-12", "endpoint": "https://compute.invalid/",
	})
	rs, err := newProvider().Check(ctxT(t), providers.Config{Raw: raw}, providers.CheckOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 || rs[0].Check != "credentials" || rs[0].Status != providers.CheckFailed || !strings.Contains(rs[0].Fix, "gcloud auth application-default login") {
		t.Errorf("report:\n%s\nwant one failed credentials row", formatReport(rs))
	}
}

func TestDescribeCredentials(t *testing.T) {
	dir := t.TempDir()
	sa := []byte(`{"type":"service_account","client_email":"fleetd@p.iam.gserviceaccount.com","private_key":"x"}`)
	user := []byte(`{"type":"authorized_user","client_id":"x","refresh_token":"y"}`)
	imp := []byte(`{"type":"impersonated_service_account","service_account_impersonation_url":"https://iamcredentials.googleapis.com/v1/projects/-/serviceAccounts/deployer@p.iam.gserviceaccount.com:generateAccessToken"}`)
	env, adc := filepath.Join(dir, "key.json"), filepath.Join(dir, "adc.json")
	cases := []struct {
		name                      string
		creds, envJSON, adcJSON   []byte
		envFile                   string
		wantSource, wantPrincipal string
		wantMetadata              bool
	}{
		{"env key file", sa, sa, user, env, "GOOGLE_APPLICATION_CREDENTIALS file " + env + " (service account key)", "serviceAccount:fleetd@p.iam.gserviceaccount.com", false},
		{"gcloud user login", user, nil, user, "", "gcloud application-default credentials file " + adc + " (user credentials)", "", false},
		{"impersonation in the gcloud file", imp, nil, imp, "", "gcloud application-default credentials file " + adc + " (service account impersonation)", "serviceAccount:deployer@p.iam.gserviceaccount.com", false},
		{"metadata server", nil, nil, nil, "", "the GCE metadata server (the VM's service account)", "", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			source, principal, metadata := gcp.DescribeCredentials(tc.creds, tc.envFile, tc.envJSON, adc, tc.adcJSON)
			if source != tc.wantSource || principal != tc.wantPrincipal || metadata != tc.wantMetadata {
				t.Errorf("got %q, %q, %v\nwant %q, %q, %v", source, principal, metadata, tc.wantSource, tc.wantPrincipal, tc.wantMetadata)
			}
		})
	}
}

func formatReport(rs []providers.CheckResult) string {
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&b, "%-11s %-36s %-15s %s\n", r.Status, r.Check, r.Scope, r.Detail)
		if r.Fix != "" {
			fmt.Fprintf(&b, "%-11s %-36s %-15s fix: %s\n", "", "", "", r.Fix)
		}
	}
	return b.String()
}
