package local

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"time"

	"github.com/fleetd/fleetd/providers"
)

// Defaults of a `provider "local"` block.
const (
	DefaultInstanceType  = "local.gpu1"
	DefaultAddressPrefix = "127.0.10."
	DefaultNoticeLead    = 120 * time.Second
	Region               = "local"
)

// DefaultZones are the zones of a block that names none.
var DefaultZones = []string{"local-a", "local-b"}

// InstanceType is one simulated machine shape.
type InstanceType struct {
	GPUs          int     `json:"gpus"`
	GPUType       string  `json:"gpu_type"`
	VCPUs         int     `json:"vcpus"`
	MemoryGiB     float64 `json:"memory_gib"`
	SpotPrice     float64 `json:"spot_price"`
	OnDemandPrice float64 `json:"on_demand_price"`
}

var defaultInstanceTypes = map[string]InstanceType{
	DefaultInstanceType: {GPUs: 1, GPUType: "sim", VCPUs: 2, MemoryGiB: 4, SpotPrice: 0.30, OnDemandPrice: 1.00},
}

// settings is a decoded and validated provider block.
type settings struct {
	Zones         []string
	InstanceTypes map[string]InstanceType
	Capacity      map[string]int // spot capacity per zone; absent = unlimited
	NoticeLead    time.Duration
	StateDir      string // "" = the provider's default
	AddressPrefix string
}

type blockJSON struct {
	Zones         []string                `json:"zones"`
	InstanceTypes map[string]InstanceType `json:"instance_types"`
	Capacity      map[string]int          `json:"capacity"`
	NoticeLead    string                  `json:"notice_lead"`
	StateDir      string                  `json:"state_dir"`
	AddressPrefix string                  `json:"address_prefix"`
}

// decodeSettings decodes a provider block. Every problem is reported, as
// an InvalidConfig error.
func decodeSettings(cfg providers.Config) (settings, error) {
	var b blockJSON
	if err := cfg.DecodeStrict(&b); err != nil {
		return settings{}, providers.InvalidConfig(fmt.Errorf("provider \"local\": %w", err))
	}
	s := settings{
		Zones:         b.Zones,
		InstanceTypes: b.InstanceTypes,
		Capacity:      b.Capacity,
		StateDir:      b.StateDir,
		AddressPrefix: b.AddressPrefix,
		NoticeLead:    DefaultNoticeLead,
	}
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if len(s.Zones) == 0 {
		s.Zones = append([]string(nil), DefaultZones...)
	}
	seen := map[string]bool{}
	for _, z := range s.Zones {
		if z == "" || strings.ContainsAny(z, "/ \t\n") {
			bad("zone %q: want a non-empty name without slashes or spaces", z)
		}
		if seen[z] {
			bad("zone %q listed twice", z)
		}
		seen[z] = true
	}
	if len(s.InstanceTypes) == 0 {
		s.InstanceTypes = defaultInstanceTypes
	} else {
		types := map[string]InstanceType{}
		for name, it := range s.InstanceTypes {
			if name == "" || strings.ContainsAny(name, "/ \t\n") {
				bad("instance type %q: want a non-empty name without slashes or spaces", name)
			}
			if it.GPUType == "" {
				it.GPUType = "sim"
			}
			if it.VCPUs == 0 {
				it.VCPUs = max(2, 2*it.GPUs)
			}
			if it.MemoryGiB == 0 {
				it.MemoryGiB = float64(max(4, 4*it.GPUs))
			}
			if it.GPUs < 0 || it.VCPUs < 0 || it.MemoryGiB < 0 {
				bad("instance type %q: gpus, vcpus and memory_gib must not be negative", name)
			}
			if it.SpotPrice <= 0 || it.OnDemandPrice <= 0 {
				bad("instance type %q: spot_price and on_demand_price are required and must be positive", name)
			}
			types[name] = it
		}
		s.InstanceTypes = types
	}
	for z, n := range s.Capacity {
		if !seen[z] {
			bad("capacity for zone %q, which is not in zones %v", z, s.Zones)
		}
		if n < 0 {
			bad("capacity for zone %q is negative", z)
		}
	}
	if b.NoticeLead != "" {
		d, err := time.ParseDuration(b.NoticeLead)
		if err != nil || d < 0 {
			bad("notice_lead %q: want a non-negative duration like \"120s\"", b.NoticeLead)
		}
		s.NoticeLead = d
	}
	if s.AddressPrefix == "" {
		s.AddressPrefix = DefaultAddressPrefix
	}
	if err := checkPrefix(s.AddressPrefix); err != nil {
		bad("address_prefix: %v", err)
	}
	if err := errors.Join(errs...); err != nil {
		return settings{}, providers.InvalidConfig(fmt.Errorf("provider \"local\": %w", err))
	}
	return s, nil
}

// checkPrefix accepts "127.A.B." — three loopback octets and a dot — so
// every node address is prefix+N with N in 1..254.
func checkPrefix(p string) error {
	if !strings.HasSuffix(p, ".") || strings.Count(p, ".") != 3 {
		return fmt.Errorf("%q: want three octets and a trailing dot, like %q", p, DefaultAddressPrefix)
	}
	a, err := netip.ParseAddr(p + "1")
	if err != nil || !a.Is4() || !a.IsLoopback() {
		return fmt.Errorf("%q: not a prefix inside 127.0.0.0/8", p)
	}
	return nil
}

// offerings lists every (zone, type, capacity type) of the block, sorted.
// liveSpot counts running spot instances per zone, for Available.
func (s settings) offerings(liveSpot map[string]int) []providers.Offering {
	names := make([]string, 0, len(s.InstanceTypes))
	for n := range s.InstanceTypes {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []providers.Offering
	for _, z := range s.Zones {
		for _, n := range names {
			it := s.InstanceTypes[n]
			base := providers.Offering{Provider: Name, Region: Region, Zone: z, InstanceType: n,
				GPUs: it.GPUs, GPUType: it.GPUType, VCPUs: it.VCPUs, MemoryGiB: it.MemoryGiB, Available: -1}
			spot := base
			spot.CapacityType, spot.PricePerHour = providers.Spot, it.SpotPrice
			if c, ok := s.Capacity[z]; ok {
				spot.Available = max(0, c-liveSpot[z])
			}
			od := base
			od.CapacityType, od.PricePerHour = providers.OnDemand, it.OnDemandPrice
			out = append(out, spot, od)
		}
	}
	return out
}

// offering returns the block's offering matching o's key (prices and
// shape come from the block, not from the caller).
func (s settings) offering(o providers.Offering) (providers.Offering, bool) {
	for _, x := range s.offerings(nil) {
		if x.Key() == o.Key() {
			return x, true
		}
	}
	return providers.Offering{}, false
}
