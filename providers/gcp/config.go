package gcp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"path"
	"regexp"
	"strings"

	"github.com/fleetd/fleetd/providers"
)

// Defaults of the provider block.
const (
	DefaultDiskSizeGB = 200
	DefaultDiskType   = "pd-balanced"
	DefaultNetwork    = "global/networks/default"
	DefaultScope      = "https://www.googleapis.com/auth/cloud-platform"
)

// config is a decoded `provider "gcp"` block.
type config struct {
	Project      string          `json:"project"`
	Zones        []string        `json:"zones"`
	MachineTypes []string        `json:"machine_types"`
	Accelerators json.RawMessage `json:"accelerators"`
	Image        string          `json:"image"`
	DiskSizeGB   *float64        `json:"disk_size_gb"`
	DiskType     string          `json:"disk_type"`
	Network      string          `json:"network"`
	Subnetwork   string          `json:"subnetwork"`
	// GPUSubnetworks are the subnetworks of an a3 type's GPU NICs, in
	// order (each in its own VPC network, as GPUDirect requires).
	GPUSubnetworks []string         `json:"gpu_subnetworks"`
	ExternalIP     *bool            `json:"external_ip"`
	ServiceAccount string           `json:"service_account"`
	Scopes         []string         `json:"scopes"`
	Prices         json.RawMessage  `json:"prices"`
	Endpoint       string           `json:"endpoint"`
	fleet          string           // providers.Config.Fleet
	accel          *accelerator     // parsed Accelerators
	prices         map[string]price // parsed Prices

	// ResourceManagerEndpoint is where `fleetd check` tests permissions.
	ResourceManagerEndpoint string `json:"resource_manager_endpoint"`
	// BillingEndpoint is where prices are read (the Cloud Billing
	// Catalog API); "" is the public endpoint.
	BillingEndpoint string `json:"billing_endpoint"`
	// FilestoreEndpoint is where `fleetd check` lists Filestore
	// instances (filestore:// data); "" follows endpoint when it is
	// plain http, else the public endpoint.
	FilestoreEndpoint string `json:"filestore_endpoint"`
}

// accelerator is the GPU attached to N1 machine types.
type accelerator struct {
	Type  string `json:"type"`
	Count int    `json:"count"`
}

// price is an override of the bundled table, per hour; nil keeps the table's.
type price struct {
	Spot     *float64 `json:"spot"`
	OnDemand *float64 `json:"on_demand"`
}

var (
	zoneRE    = regexp.MustCompile(`^[a-z]+-[a-z]+[0-9]+-[a-z]$`)
	projectRE = regexp.MustCompile(`^(?:[a-z][a-z0-9.-]*[a-z0-9]:)?[a-z][-a-z0-9]{4,28}[a-z0-9]$`)
	typeRE    = regexp.MustCompile(`^[a-z][-a-z0-9]{0,62}$`)
	nameRE    = regexp.MustCompile(`^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$`)
)

// decodeConfig decodes and checks a provider block; every problem is an
// invalid-config error naming the attribute.
func decodeConfig(cfg providers.Config) (*config, error) {
	c := &config{fleet: cfg.Fleet}
	if err := cfg.DecodeStrict(c); err != nil {
		return nil, providers.InvalidConfig(fmt.Errorf("gcp provider block: %w", err))
	}
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if !projectRE.MatchString(c.Project) {
		bad("project %q is not a GCP project id", c.Project)
	}
	if len(c.Zones) == 0 {
		bad("zones: at least one zone is required")
	}
	seen := map[string]bool{}
	for _, z := range c.Zones {
		if !zoneRE.MatchString(z) {
			bad("zones: %q is not a zone name like \"us-central1-a\"", z)
		}
		if seen[z] {
			bad("zones: %q listed twice", z)
		}
		seen[z] = true
	}
	if len(c.MachineTypes) == 0 {
		bad("machine_types: at least one machine type is required")
	}
	for _, t := range c.MachineTypes {
		if !typeRE.MatchString(t) {
			bad("machine_types: %q is not a machine type name", t)
		}
	}
	if strings.TrimSpace(c.Image) == "" {
		bad("image is required")
	}
	if c.DiskSizeGB != nil && (*c.DiskSizeGB < 10 || *c.DiskSizeGB > 65536 || *c.DiskSizeGB != float64(int64(*c.DiskSizeGB))) {
		bad("disk_size_gb: %v is not a whole number of GB between 10 and 65536", *c.DiskSizeGB)
	}
	if c.DiskType != "" && !typeRE.MatchString(c.DiskType) {
		bad("disk_type: %q is not a disk type name like \"pd-balanced\"", c.DiskType)
	}
	for _, e := range []struct{ name, url string }{{"endpoint", c.Endpoint}, {"resource_manager_endpoint", c.ResourceManagerEndpoint}, {"billing_endpoint", c.BillingEndpoint}, {"filestore_endpoint", c.FilestoreEndpoint}} {
		if e.url == "" {
			continue
		}
		u, err := url.Parse(e.url)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("%s: %q is not an http(s) URL", e.name, e.url)
		}
	}
	if len(c.Accelerators) > 0 && string(c.Accelerators) != "null" {
		a, err := decodeAccelerator(c.Accelerators)
		if err != nil {
			bad("accelerators: %v", err)
		}
		c.accel = a
	}
	if len(c.Prices) > 0 && string(c.Prices) != "null" {
		dec := json.NewDecoder(bytes.NewReader(c.Prices))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c.prices); err != nil {
			bad("prices: want { \"machine-type\" = { spot = N, on_demand = N } }: %v", err)
		}
		for k, p := range c.prices {
			for _, v := range []*float64{p.Spot, p.OnDemand} {
				if v != nil && !(*v > 0) {
					bad("prices: %q: prices must be > 0", k)
				}
			}
		}
	}
	if len(errs) > 0 {
		return nil, providers.InvalidConfig(errors.Join(errs...))
	}
	return c, nil
}

// decodeAccelerator accepts one object or a list holding one object (HCL
// users write either).
func decodeAccelerator(raw json.RawMessage) (*accelerator, error) {
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err == nil {
		if len(list) != 1 {
			return nil, fmt.Errorf("give one accelerator, not %d", len(list))
		}
		raw = list[0]
	}
	var a accelerator
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		return nil, fmt.Errorf("want { type = \"nvidia-tesla-t4\", count = 1 }: %w", err)
	}
	if !typeRE.MatchString(a.Type) {
		return nil, fmt.Errorf("type %q is not an accelerator type name", a.Type)
	}
	if a.Count < 1 || a.Count > 16 {
		return nil, fmt.Errorf("count %d is not between 1 and 16", a.Count)
	}
	return &a, nil
}

func (c *config) diskSizeGB() int64 {
	if c.DiskSizeGB == nil {
		return DefaultDiskSizeGB
	}
	return int64(*c.DiskSizeGB)
}

func (c *config) diskType(zone string) string {
	t := c.DiskType
	if t == "" {
		t = DefaultDiskType
	}
	return "zones/" + zone + "/diskTypes/" + t
}

// network returns the network URL: a bare name means the project's
// network of that name.
func (c *config) network() string {
	switch {
	case c.Network == "":
		return DefaultNetwork
	case strings.Contains(c.Network, "/"):
		return c.Network
	}
	return "global/networks/" + c.Network
}

// networkName is the name of the VPC network the nodes land in ("default"
// when unset): the last part of network(), as gcloud and Filestore name
// it.
func (c *config) networkName() string {
	return path.Base(c.network())
}

// subnetwork returns the subnetwork of region: a bare name is the
// region's subnetwork of that name, so one block serves several regions.
func (c *config) subnetwork(region string) string {
	switch {
	case c.Subnetwork == "":
		return ""
	case strings.Contains(c.Subnetwork, "/"):
		return c.Subnetwork
	}
	return "regions/" + region + "/subnetworks/" + c.Subnetwork
}

func (c *config) externalIP() bool { return c.ExternalIP == nil || *c.ExternalIP }

func (c *config) scopes() []string {
	if len(c.Scopes) == 0 {
		return []string{DefaultScope}
	}
	return c.Scopes
}

// regionOf returns the region of a zone ("us-central1-a" → "us-central1").
func regionOf(zone string) string {
	if i := strings.LastIndexByte(zone, '-'); i > 0 {
		return zone[:i]
	}
	return zone
}
