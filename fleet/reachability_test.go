package fleet

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/providers"
	awsprov "github.com/fleetd/fleetd/providers/aws"
	"github.com/fleetd/fleetd/providers/providertest"
)

func TestReachUnreachableURL(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want string // prefix of the reason; "" when reachable
	}{
		{"http://127.0.0.1:7777", "a loopback"},
		{"http://127.0.10.3:7777", "a loopback"},
		{"https://[::1]:7777", "a loopback"},
		{"http://[::ffff:127.0.0.1]:7777", "a loopback"},
		{"http://localhost:7777", "a loopback"},
		{"http://LOCALHOST.:7777", "a loopback"},
		{"http://fleetd.localhost:7777", "a loopback"},
		{"http://0.0.0.0:7777", "an unspecified"},
		{"http://[::]:7777", "an unspecified"},
		{"http://:7777", "an empty host"},
		{"http://169.254.10.1:7777", "a link-local"},
		{"http://[fe80::1%25eth0]:7777", "a link-local"},
		{"http://224.0.0.1:7777", "a multicast"},
		{"10.0.1.5:7777", "not an absolute URL"},
		{"", "not an absolute URL"},
		{"http://10.0.1.5:7777", ""},
		{"https://192.168.1.20:7777", ""},
		{"https://[2001:db8::5]:7777", ""},
		{"https://fleetd.internal:7777", ""},
		{"https://fleetd.example.com", ""},
		{"http://localhost.example.com:7777", ""},
	} {
		got := UnreachableURL(tc.url)
		if (tc.want == "") != (got == "") || !strings.HasPrefix(got, tc.want) {
			t.Errorf("UnreachableURL(%q) = %q, want %q…", tc.url, got, tc.want)
		}
	}
}

func TestReachEmulatedProvider(t *testing.T) {
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	for _, tc := range []struct {
		name, config string
		env          map[string]string
		want         bool
	}{
		{"aws", `{}`, nil, false},
		{"aws", `{"endpoint":"https://ec2.us-east-1.amazonaws.com"}`, nil, false},
		{"aws", `{"endpoint":"http://127.0.0.1:5000"}`, nil, true},
		{"aws", `{}`, map[string]string{"AWS_ENDPOINT_URL": "http://127.0.0.1:5000"}, true},
		{"aws", `{}`, map[string]string{"AWS_ENDPOINT_URL_EC2": "http://localhost:5000"}, true},
		{"aws", `{}`, map[string]string{"AWS_ENDPOINT_URL": "https://proxy.corp:443"}, false},
		{"gcp", `{"endpoint":"http://127.0.0.1:8085/compute/v1/"}`, nil, true},
		{"gcp", `{}`, map[string]string{"AWS_ENDPOINT_URL": "http://127.0.0.1:5000"}, false},
		{"oci", `{}`, nil, false},
	} {
		env = tc.env
		if got := emulatedProvider(spec.Provider{Name: tc.name, Config: []byte(tc.config)}, getenv); got != tc.want {
			t.Errorf("%s %s env %v: emulated %v, want %v", tc.name, tc.config, tc.env, got, tc.want)
		}
	}
}

func TestReachAdvertiseURLConfig(t *testing.T) {
	cfg, _, diags := ParseConfig("d.hcl", []byte(`advertise_url = "https://10.0.1.5:7777/"`+"\n"))
	if diags.HasErrors() || cfg.AdvertiseURL != "https://10.0.1.5:7777" {
		t.Errorf("advertise_url with a trailing slash: %q %v, want it trimmed", cfg.AdvertiseURL, diags)
	}
	for _, bad := range []string{"10.0.1.5:7777", "ftp://10.0.1.5", "https://"} {
		_, _, diags := ParseConfig("d.hcl", []byte(`advertise_url = "`+bad+`"`+"\n"))
		if !diags.HasErrors() || !strings.Contains(diags.Error(), "advertise_url") {
			t.Errorf("advertise_url %q: %v, want an error naming advertise_url", bad, diags)
		}
	}
}

const awsReachSpec = `
fleet "cloud" {
  min_nodes = 1
  max_nodes = 1
  node { gpus = 1 }
  provider "aws" {
    regions        = ["us-east-1"]
    instance_types = ["g5.xlarge"]
    image          = "ami-0123456789abcdef0"
    subnets        = { "us-east-1a" = "subnet-0aaa1111" }
  }
  training { command = ["python3", "train.py"] }
}
`

// TestApplyRefusedOnLoopbackDaemon: a daemon on 127.0.0.1 without
// advertise_url refuses plan and apply of an aws fleet (422, a message
// naming the URL and advertise_url), stores nothing and launches nothing;
// check reports it as a failed row; a mem fleet (nodes on this host) is
// applied as before.
func TestApplyRefusedOnLoopbackDaemon(t *testing.T) {
	awsTestEnv(t) // no AWS_ENDPOINT_URL: the aws provider is the real cloud
	mem := providertest.NewMemProvider()
	rec := &recordingCalls{Provider: awsprov.New(awsprov.Options{RetryMaxAttempts: 1})}
	td := launchTestDaemon(t, t.TempDir(), staticProviders{awsprov.Name: rec, providertest.MemName: mem}, mem, Options{})
	ctx := context.Background()
	req := api.ApplyRequest{Filename: "cloud.hcl", Source: awsReachSpec}

	_, planErr := td.client.Plan(ctx, req)
	_, applyErr := td.client.Apply(ctx, req)
	for what, err := range map[string]error{"plan": planErr, "apply": applyErr} {
		var he *api.HTTPError
		if !errors.As(err, &he) || he.StatusCode != http.StatusUnprocessableEntity {
			t.Fatalf("%s of an aws fleet on a loopback daemon: %v, want HTTP 422", what, err)
		}
		for _, want := range []string{`fleet "cloud"`, "aws", "cloud.hcl:6", td.URL(), "loopback", "advertise_url", "nothing was applied"} {
			if !strings.Contains(he.Body.Error, want) {
				t.Errorf("%s: message %q does not mention %q", what, he.Body.Error, want)
			}
		}
	}
	st, err := td.client.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Fleets) != 0 {
		t.Errorf("a refused apply stored %d fleet(s)", len(st.Fleets))
	}
	if n := rec.calls.Load(); n != 0 {
		t.Errorf("a refused plan/apply made %d aws provider call(s)", n)
	}
	// `fleetd check` shows the same problem as a failed row with its fix.
	var rep api.CheckReport
	if err := td.client.Do(ctx, http.MethodPost, "/v1/check", nil, api.CheckRequest{ApplyRequest: req, Quick: true}, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.OK || len(rep.Providers) != 1 || len(rep.Providers[0].Results) == 0 {
		t.Fatalf("check on a loopback daemon: %+v, want a failed row", rep)
	}
	if r := rep.Providers[0].Results[0]; r.Status != providers.CheckFailed || !strings.Contains(r.Detail, "loopback") || !strings.Contains(r.Fix, "advertise_url") {
		t.Errorf("check row %+v, want a failed daemon URL row naming advertise_url", r)
	}
	if _, err := td.client.Apply(ctx, api.ApplyRequest{Filename: "mem.hcl", Source: memSpec}); err != nil {
		t.Errorf("a mem fleet on a loopback daemon: %v, want it applied", err)
	}

	// The same daemon advertising a routable URL lets the aws fleet
	// through the check (apply would then run the preflight).
	routable := &Daemon{cfg: Config{Listen: "0.0.0.0:7777", AdvertiseURL: "https://10.0.1.5:7777"}}
	routable.check = &checker{url: routable.URL}
	file, diags := spec.Parse("cloud.hcl", []byte(awsReachSpec), spec.Options{Schema: func(name string) (providers.ConfigSchema, bool) { return awsprov.Schema, name == "aws" }})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	if err := routable.check.checkReachable(file); err != nil {
		t.Errorf("advertise_url https://10.0.1.5:7777: %v", err)
	}
	routable.cfg.AdvertiseURL = ""
	var ue *api.UnreachableError
	if err := routable.check.checkReachable(file); !errors.As(err, &ue) || !strings.Contains(ue.Reason, "unspecified") {
		t.Errorf("listen 0.0.0.0 without advertise_url: %v, want an unspecified-address refusal", err)
	}
}

// recordingCalls counts calls that reach a provider.
type recordingCalls struct {
	providers.Provider
	calls atomic.Int32
}

func (r *recordingCalls) Offerings(ctx context.Context, cfg providers.Config) ([]providers.Offering, error) {
	r.calls.Add(1)
	return r.Provider.Offerings(ctx, cfg)
}

func (r *recordingCalls) Create(ctx context.Context, cfg providers.Config, req providers.LaunchRequest) ([]providers.Instance, error) {
	r.calls.Add(1)
	return r.Provider.Create(ctx, cfg, req)
}

// TestReachAdvertisedHostInCertificate: with tls {} and advertise_url, the
// generated server certificate is valid for advertise_url's host, which
// agents dial and verify (pinning the CA), without repeating it in hosts.
func TestReachAdvertisedHostInCertificate(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Listen, cfg.DataDir, cfg.TokenFile = "127.0.0.1:0", t.TempDir(), ""
	cfg.AdvertiseURL, cfg.TLS = "https://fleetd.internal:7777", &TLSConfig{Hosts: []string{"10.0.1.5"}}
	if err := cfg.Finish(); err != nil {
		t.Fatal(err)
	}
	d, err := New(context.Background(), Options{Config: cfg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Schema: memSchema, Providers: staticProviders{}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() { cancel(); <-done }()

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(d.CA().CertPEM)
	for _, name := range []string{"fleetd.internal", "10.0.1.5", "127.0.0.1"} {
		conn, err := tls.Dial("tcp", d.listener.Addr().String(), &tls.Config{RootCAs: pool, ServerName: name})
		if err != nil {
			t.Errorf("TLS to the daemon as %s: %v", name, err)
			continue
		}
		conn.Close()
	}
}
