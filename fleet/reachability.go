package fleet

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"sort"
	"strings"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/providers"
)

// hostProviders run their nodes on the daemon's own host (or nowhere), so
// a loopback daemon URL reaches the daemon from them: local's nodes are
// agent processes on this machine, sim's live in virtual time, and mem
// (providers/providertest) keeps its instances as records in memory.
var hostProviders = map[string]bool{"local": true, "sim": true, "mem": true}

// UnreachableURL reports why nodes on other machines cannot reach the
// daemon at rawURL: "a loopback address", "an unspecified address",
// "a link-local address", …; "" when nothing is wrong with it. A name
// other than localhost is taken as routable (DNS is the operator's).
func UnreachableURL(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return "not an absolute URL"
	}
	host := strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
	switch {
	case host == "":
		return "an empty host (the unspecified address)"
	case host == "localhost" || strings.HasSuffix(host, ".localhost"):
		return "a loopback address"
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return ""
	}
	ip = ip.Unmap()
	switch {
	case ip.IsLoopback():
		return "a loopback address"
	case ip.IsUnspecified():
		return "an unspecified address (a listen-all address, not one to connect to)"
	case ip.IsLinkLocalUnicast():
		return "a link-local address (on a cloud VM, 169.254.0.0/16 is its own metadata service)"
	case ip.IsMulticast():
		return "a multicast address"
	}
	return ""
}

// AdvertiseURLHelp is how to fix an unreachable daemon URL.
const AdvertiseURLHelp = `set advertise_url in the daemon config (or fleetd serve -advertise-url) to a URL the nodes can reach, ` +
	`e.g. advertise_url = "https://10.0.1.5:7777", and listen on an address that serves it (listen = "0.0.0.0:7777", with tls {})`

// unreachableFrom reports the daemon URL a provider block's nodes would be
// handed and, when they cannot reach it, why ("" when they can): a
// provider other than the host ones (aws, gcp, an external plugin) while
// the URL is loopback, unspecified or link-local. A provider block whose
// API endpoint is itself on loopback talks to an emulator on this machine
// (moto, LocalStack, the in-repo fakes): its "VMs" dial nothing, so it
// passes.
func (d *checker) unreachableFrom(pb spec.Provider) (nodeURL, why string) {
	nodeURL = d.url()
	if hostProviders[pb.Name] {
		return nodeURL, ""
	}
	if why = UnreachableURL(nodeURL); why == "" || emulatedProvider(pb, os.Getenv) {
		return nodeURL, ""
	}
	return nodeURL, why
}

// checkReachable refuses (Plan, Apply) the first fleet of file whose nodes
// could not reach the daemon: they would boot, never join, and be
// replaced in a loop at the cloud's prices.
func (d *checker) checkReachable(file *spec.File) error {
	for _, fl := range file.Fleets {
		var ue *api.UnreachableError
		for _, pb := range fl.Providers {
			nodeURL, why := d.unreachableFrom(pb)
			if why == "" {
				continue
			}
			if ue == nil {
				ue = &api.UnreachableError{Fleet: fl.Name, URL: nodeURL, Reason: why, Fix: AdvertiseURLHelp}
				if pb.DeclRange.Filename != "" {
					ue.At = fmt.Sprintf("%s:%d", pb.DeclRange.Filename, pb.DeclRange.Start.Line)
				}
			}
			ue.Providers = append(ue.Providers, pb.Name)
		}
		if ue != nil {
			sort.Strings(ue.Providers)
			return ue
		}
	}
	return nil
}

// reachabilityCheck is the `fleetd check` row of a provider block whose
// nodes could not reach the daemon (what checkReachable refuses the apply
// for); bad is false when there is nothing to report.
func (d *checker) reachabilityCheck(pb spec.Provider) (r providers.CheckResult, bad bool) {
	nodeURL, why := d.unreachableFrom(pb)
	if why == "" {
		return r, false
	}
	return providers.CheckResult{Check: "daemon URL reachable from nodes", Status: providers.CheckFailed,
		Detail: nodeURL + " is " + why, Fix: AdvertiseURLHelp}, true
}

// emulatedProvider reports whether a provider block's cloud API is an
// emulator on this machine: its endpoint attribute, or for aws the SDK's
// AWS_ENDPOINT_URL(_EC2) in the daemon's environment (which the built-in
// plugin inherits), is a loopback URL.
func emulatedProvider(pb spec.Provider, getenv func(string) string) bool {
	var blk struct {
		Endpoint string `json:"endpoint"`
	}
	_ = json.Unmarshal(pb.Config, &blk)
	endpoint := blk.Endpoint
	if endpoint == "" && pb.Name == "aws" {
		if endpoint = getenv("AWS_ENDPOINT_URL_EC2"); endpoint == "" {
			endpoint = getenv("AWS_ENDPOINT_URL")
		}
	}
	return endpoint != "" && strings.HasPrefix(UnreachableURL(endpoint), "a loopback")
}

// certHosts are the names the generated server certificate is issued for:
// the listen host, tls.hosts and advertise_url's host, which agents
// verify the certificate against.
func (c *Config) certHosts(listenHost string) []string {
	hosts := append([]string{listenHost}, c.TLS.Hosts...)
	if u, err := url.Parse(c.AdvertiseURL); err == nil && u.Hostname() != "" {
		hosts = append(hosts, u.Hostname())
	}
	return hosts
}
