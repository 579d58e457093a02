package gcp

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/fleetd/fleetd/providers"
	"google.golang.org/protobuf/proto"
)

// Offerings lists, for every zone of the block, each configured machine
// type the zone has, as a spot and an on-demand offering. GPUs come from
// the machine type's built-in accelerators (A2, A3, G2) or, for N1 types,
// from the block's accelerators when the zone has that accelerator type.
// Prices come from the block's prices override, the Cloud Billing Catalog
// (billing.go) or the bundled table, in that order, each offering naming
// its source and date.
func (p *Provider) Offerings(ctx context.Context, cfg providers.Config) ([]providers.Offering, error) {
	c, cl, err := p.setup(ctx, cfg)
	if err != nil {
		return nil, err
	}
	prices, err := p.catalog(ctx, c)
	if err != nil {
		return nil, err
	}
	var (
		out   []providers.Offering
		found = map[string]bool{}
	)
	for _, zone := range c.Zones {
		mts, err := p.machineTypes(ctx, cl, c, zone)
		if err != nil {
			return nil, err
		}
		var maxCards int
		if c.accel != nil {
			if maxCards, err = p.acceleratorMax(ctx, cl, c, zone); err != nil {
				return nil, err
			}
		}
		for _, name := range c.MachineTypes {
			mt, ok := mts[name]
			if !ok {
				continue
			}
			found[name] = true
			offs, err := offeringsFor(c, prices, zone, mt, maxCards)
			if err != nil {
				return nil, err
			}
			out = append(out, offs...)
		}
	}
	var missing []string
	for _, name := range c.MachineTypes {
		if !found[name] {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return nil, providers.Errorf(providers.KindInvalidConfig, "gcp: machine type(s) %s exist in none of the zones %v", strings.Join(missing, ", "), c.Zones)
	}
	return out, nil
}

// offeringsFor builds the spot and on-demand offerings of one machine type
// in one zone; maxCards is the zone's limit for the block's accelerator
// type (0: the zone does not have it).
func offeringsFor(c *config, prices catalogView, zone string, mt *computepb.MachineType, maxCards int) ([]providers.Offering, error) {
	region := regionOf(zone)
	base := providers.Offering{
		Provider: Name, Region: region, Zone: zone, InstanceType: mt.GetName(),
		VCPUs: int(mt.GetGuestCpus()), MemoryGiB: float64(mt.GetMemoryMb()) / 1024, Available: -1,
		Arch: machineArch(mt), Network: networkOf(c, mt.GetName()), VPC: c.networkName(),
	}
	for _, a := range mt.GetAccelerators() {
		base.GPUs += int(a.GetGuestAcceleratorCount())
		base.GPUType = GPUModel(a.GetGuestAcceleratorType())
	}
	attach := base.GPUs == 0 && c.accel != nil && attachable(mt.GetName())
	if attach {
		if maxCards == 0 {
			return nil, nil // this zone does not have the accelerator
		}
		if c.accel.Count > maxCards {
			return nil, providers.Errorf(providers.KindInvalidConfig, "gcp: accelerators: %d × %s exceeds the %d per instance %s allows", c.accel.Count, c.accel.Type, maxCards, zone)
		}
		base.GPUs, base.GPUType = c.accel.Count, GPUModel(c.accel.Type)
	}
	out := make([]providers.Offering, 0, 2)
	for _, ct := range []providers.CapacityType{providers.Spot, providers.OnDemand} {
		spot := ct == providers.Spot
		q, err := partQuote(c, prices, mt, "", region, spot)
		if err != nil {
			return nil, providers.InvalidConfig(fmt.Errorf("gcp: %w", err))
		}
		if attach {
			g, err := partQuote(c, prices, nil, c.accel.Type, region, spot)
			if err != nil {
				return nil, providers.InvalidConfig(fmt.Errorf("gcp: %w", err))
			}
			q = q.plus(g, float64(c.accel.Count))
		}
		o := base
		o.CapacityType, o.PricePerHour, o.PriceSource, o.PriceAsOf = ct, q.usd, q.source, q.asOf
		out = append(out, o)
	}
	return out, nil
}

// machineArch is the CPU architecture of a machine type as Go names it:
// GCE's architecture field (X86_64, ARM64) when the API gives it, else the
// series: Tau T2A, Axion C4A and A4X (Grace) are Arm, the others x86-64.
func machineArch(mt *computepb.MachineType) string {
	switch mt.GetArchitecture() {
	case "ARM64":
		return "arm64"
	case "X86_64":
		return "amd64"
	}
	for _, p := range []string{"t2a-", "c4a-", "a4x-"} {
		if strings.HasPrefix(mt.GetName(), p) {
			return "arm64"
		}
	}
	return "amd64"
}

// attachable reports whether GPUs can be attached to a machine type (only
// the N1 series takes attached GPUs).
func attachable(machineType string) bool { return strings.HasPrefix(machineType, "n1-") }

// machineTypes lists the block's machine types in zone by name.
func (p *Provider) machineTypes(ctx context.Context, cl *clients, c *config, zone string) (map[string]*computepb.MachineType, error) {
	it := cl.mts.List(ctx, &computepb.ListMachineTypesRequest{
		Project: c.Project, Zone: zone, Filter: proto.String(nameFilter(c.MachineTypes)),
		MaxResults: proto.Uint32(uint32(p.opts.PageSize)),
	})
	out := map[string]*computepb.MachineType{}
	for mt, err := range it.All() {
		if err != nil {
			return nil, zoneErr(err, "list machine types", c, zone)
		}
		out[mt.GetName()] = mt
	}
	return out, nil
}

// acceleratorMax returns maximumCardsPerInstance of the block's
// accelerator type in zone, or 0 when the zone does not have it.
func (p *Provider) acceleratorMax(ctx context.Context, cl *clients, c *config, zone string) (int, error) {
	it := cl.accels.List(ctx, &computepb.ListAcceleratorTypesRequest{
		Project: c.Project, Zone: zone, Filter: proto.String(nameFilter([]string{c.accel.Type})),
		MaxResults: proto.Uint32(uint32(p.opts.PageSize)),
	})
	for at, err := range it.All() {
		if err != nil {
			return 0, zoneErr(err, "list accelerator types", c, zone)
		}
		if at.GetName() == c.accel.Type {
			return int(at.GetMaximumCardsPerInstance()), nil
		}
	}
	return 0, nil
}

// zoneErr maps a list error; a 404 means the project or zone is wrong.
func zoneErr(err error, what string, c *config, zone string) error {
	err = mapErr(err, what+" in "+zone, "")
	if providers.IsNotFound(err) {
		return providers.InvalidConfig(fmt.Errorf("gcp: project %q or zone %q not found: %w", c.Project, zone, err))
	}
	return err
}

// nameFilter matches resources by name: (name = "a") OR (name = "b").
func nameFilter(names []string) string {
	names = slices.Clone(names)
	slices.Sort(names)
	names = slices.Compact(names)
	terms := make([]string, len(names))
	for i, n := range names {
		terms[i] = "(name = " + strconv.Quote(n) + ")"
	}
	return strings.Join(terms, " OR ")
}
