package gcp

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/proto"

	"github.com/fleetd/fleetd/providers"
)

// The fast network on GCE (docs/providers/gcp.md, "GPUDirect and compact
// placement"): an a3 type gets the extra GPU NICs Google documents for
// it, each in its own subnetwork from gpu_subnetworks, and joins a
// compact placement policy per fleet incarnation and zone. The policy is
// best-effort collocation (no maxDistance): a spot fleet that insisted
// on a distance would wait for capacity that a best-effort one gets.

// gpuNICLayout is what an a3 type takes on its fast path.
type gpuNICLayout struct {
	fabric string
	// gvnic extra gVNIC interfaces after nic0; mrdma RDMA interfaces.
	gvnic, mrdma int
	// gbps is the GPU NICs' total bandwidth.
	gbps float64
}

// gpuNICs are Google's layouts: a3-highgpu-8g 4 GPU NICs at 200 Gbps
// (GPUDirect-TCPX), a3-megagpu-8g 8 at 200 Gbps (GPUDirect-TCPXO),
// a3-ultragpu-8g a second gVNIC plus 8 MRDMA NICs at 400 Gbps (RDMA).
var gpuNICs = map[string]gpuNICLayout{
	"a3-highgpu-8g":  {fabric: providers.FabricTCPX, gvnic: 4, gbps: 800},
	"a3-megagpu-8g":  {fabric: providers.FabricTCPXO, gvnic: 8, gbps: 1600},
	"a3-ultragpu-8g": {fabric: providers.FabricRDMA, gvnic: 1, mrdma: 8, gbps: 3200},
}

// subnets is how many gpu_subnetworks the layout needs.
func (l gpuNICLayout) subnets() int { return l.gvnic + l.mrdma }

// interfaces is how many fabric interfaces the layout has.
func (l gpuNICLayout) interfaces() int {
	if l.mrdma > 0 {
		return l.mrdma
	}
	return l.gvnic
}

// networkOf is the fast path of machine type mt under c: none unless
// gpu_subnetworks has the subnetworks its GPU NICs need.
func networkOf(c *config, mt string) providers.NetworkInfo {
	l, ok := gpuNICs[mt]
	if !ok || len(c.GPUSubnetworks) < l.subnets() {
		return providers.NetworkInfo{}
	}
	return providers.NetworkInfo{Fabric: l.fabric, Interfaces: l.interfaces(), BandwidthGbps: l.gbps}
}

// policyName is the request's compact placement policy in zone:
// NetworkRequest.GroupIn, shortened with a hash of the base when it
// would pass GCE's 63-character name limit (long fleet names).
func policyName(nr providers.NetworkRequest, zone string) string {
	name := nr.GroupIn(zone)
	if len(name) <= 63 {
		return name
	}
	keep := 63 - len(zone) - 1 - 9
	return strings.TrimRight(nr.Group[:keep], "-") + "-" + shortHash(nr.Group, 8) + "-" + zone
}

// gpuSubnetwork is gpu_subnetworks[i] in region (a bare name is the
// region's subnetwork of that name, as for subnetwork).
func (c *config) gpuSubnetwork(i int, region string) string {
	s := c.GPUSubnetworks[i]
	if strings.Contains(s, "/") {
		return s
	}
	return "regions/" + region + "/subnetworks/" + s
}

// applyNetwork adds the GPU NICs and the compact placement policy to an
// insert body.
func applyNetwork(c *config, res *computepb.Instance, req providers.LaunchRequest) error {
	off, nr := req.Offering, req.Network
	region := regionOf(off.Zone)
	if nr.Group != "" {
		res.ResourcePolicies = []string{"projects/" + c.Project + "/regions/" + region + "/resourcePolicies/" + policyName(nr, off.Zone)}
	}
	if !nr.Fabric {
		return nil
	}
	l, ok := gpuNICs[off.InstanceType]
	if !ok || len(c.GPUSubnetworks) < l.subnets() {
		return providers.Errorf(providers.KindInvalidConfig, "gcp: %s has no GPU NIC layout fleetd knows with the %d gpu_subnetworks set", off.InstanceType, len(c.GPUSubnetworks))
	}
	// a3 takes gVNIC on every interface.
	res.NetworkInterfaces[0].NicType = proto.String(computepb.NetworkInterface_GVNIC.String())
	for i := range l.subnets() {
		nic := &computepb.NetworkInterface{Subnetwork: proto.String(c.gpuSubnetwork(i, region)), NicType: proto.String(computepb.NetworkInterface_GVNIC.String())}
		if i >= l.gvnic {
			nic.NicType = proto.String(computepb.NetworkInterface_MRDMA.String())
		}
		res.NetworkInterfaces = append(res.NetworkInterfaces, nic)
	}
	return nil
}

// ensurePolicy makes sure the compact placement policy name exists in
// region: fetched first (replacements reuse it), inserted when absent.
func (p *Provider) ensurePolicy(ctx context.Context, cl *clients, c *config, region, name string, tags map[string]string) error {
	key := c.Endpoint + "|" + c.Project + "|" + region + "|" + name
	p.mu.Lock()
	known := p.policies[key]
	p.mu.Unlock()
	if known {
		return nil
	}
	_, err := cl.policies.Get(ctx, &computepb.GetResourcePolicyRequest{Project: c.Project, Region: region, ResourcePolicy: name})
	if a, ok := classifyAPI(err); ok && a.class == classNotFound {
		desc := fmt.Sprintf("fleetd compact placement of fleet %s (incarnation %s)", tags[providers.TagFleet], tags[providers.TagIncarnation])
		op, ierr := cl.policies.Insert(ctx, &computepb.InsertResourcePolicyRequest{Project: c.Project, Region: region, ResourcePolicyResource: &computepb.ResourcePolicy{
			Name: proto.String(name), Description: proto.String(desc),
			GroupPlacementPolicy: &computepb.ResourcePolicyGroupPlacementPolicy{Collocation: proto.String(computepb.ResourcePolicyGroupPlacementPolicy_COLLOCATED.String())},
		}})
		switch a, ok := classifyAPI(ierr); {
		case ierr == nil:
			err = op.Wait(ctx)
		case ok && a.class == classExists:
			err = nil // a concurrent launch created it
		default:
			err = ierr
		}
	}
	if err != nil {
		return mapErr(err, "resource policy "+name+" in "+region, "")
	}
	p.mu.Lock()
	p.policies[key] = true
	p.mu.Unlock()
	return nil
}

var _ providers.NetworkReleaser = (*Provider)(nil)

// ReleaseNetwork deletes the compact placement policies of base in every
// zone of the block. A policy still used by an instance is a transient
// error: the daemon calls again.
func (p *Provider) ReleaseNetwork(ctx context.Context, cfg providers.Config, base string) error {
	c, cl, err := p.setup(ctx, cfg)
	if err != nil {
		return err
	}
	if base == "" {
		return providers.Errorf(providers.KindInvalidConfig, "gcp: release of an unnamed network group")
	}
	nr := providers.NetworkRequest{Group: base}
	var errs []error
	for _, zone := range c.Zones {
		region, name := regionOf(zone), policyName(nr, zone)
		op, err := cl.policies.Delete(ctx, &computepb.DeleteResourcePolicyRequest{Project: c.Project, Region: region, ResourcePolicy: name})
		if err == nil {
			err = op.Wait(ctx)
		}
		a, _ := classifyAPI(err)
		switch {
		case err == nil, a.class == classNotFound:
			p.mu.Lock()
			delete(p.policies, c.Endpoint+"|"+c.Project+"|"+region+"|"+name)
			p.mu.Unlock()
		case strings.Contains(err.Error(), "already being used"), a.code == "resourceInUseByAnotherResource":
			errs = append(errs, providers.Transient(fmt.Errorf("gcp: resource policy %s in %s is still in use: %w", name, region, err)))
		default:
			errs = append(errs, mapErr(err, "delete resource policy "+name+" in "+region, ""))
		}
	}
	return errors.Join(errs...)
}

// networkRows are the fast network's preflight rows: per machine type
// its GPU NIC layout against gpu_subnetworks, and the placement policy
// fleetd creates.
func (k *checker) networkRows(ctx context.Context) {
	any := false
	for _, mt := range k.c.MachineTypes {
		l, ok := gpuNICs[mt]
		switch {
		case !ok:
			k.add(providers.CheckResult{Check: "GPU NICs " + mt, Status: providers.CheckOK, Detail: "no GPUDirect layout: standard network only (node.network = \"fast\" excludes it)"})
		case len(k.c.GPUSubnetworks) < l.subnets():
			k.add(providers.CheckResult{Check: "GPU NICs " + mt, Status: providers.CheckFailed,
				Detail: fmt.Sprintf("%s takes %d GPU NICs (%s) and gpu_subnetworks has %d: it launches on the standard network", mt, l.subnets(), l.fabric, len(k.c.GPUSubnetworks)),
				Fix:    fmt.Sprintf("create %d VPC networks with one subnetwork each in the fleet's regions (MTU 8244) and list them in gpu_subnetworks", l.subnets())})
		default:
			any = true
			k.add(providers.CheckResult{Check: "GPU NICs " + mt, Status: providers.CheckOK,
				Detail: fmt.Sprintf("%s ×%d over %s (%g Gbps)", l.fabric, l.interfaces(), strings.Join(k.c.GPUSubnetworks[:l.subnets()], ", "), l.gbps)})
		}
	}
	if any {
		k.gpuSubnetRows(ctx)
		k.add(providers.CheckResult{Check: "compact placement", Status: providers.CheckOK,
			Detail: "a COLLOCATED resource policy per fleet incarnation and zone, best-effort (no maxDistance): launches are not refused for distance"})
	}
}

// gpuSubnetRows checks that every gpu_subnetworks entry exists in every
// region of the block and that no two share a VPC network (GPUDirect
// NICs must each be in their own).
func (k *checker) gpuSubnetRows(ctx context.Context) {
	regions := map[string]bool{}
	for _, z := range k.c.Zones {
		regions[regionOf(z)] = true
	}
	for _, region := range slices.Sorted(maps.Keys(regions)) {
		nets := map[string]string{}
		for i := range k.c.GPUSubnetworks {
			ref := k.c.gpuSubnetwork(i, region)
			parts := strings.Split(ref, "/")
			name, project := parts[len(parts)-1], k.c.Project
			if m := projectPathRE.FindStringSubmatch(ref); m != nil {
				project = m[1]
			}
			sn, err := k.cl.subnets.Get(ctx, &computepb.GetSubnetworkRequest{Project: project, Region: region, Subnetwork: name})
			a, _ := classifyAPI(err)
			switch {
			case err != nil && a.class == classNotFound:
				k.add(providers.CheckResult{Check: "GPU subnetwork " + name, Scope: region, Status: providers.CheckFailed,
					Detail: ref + " does not exist", Fix: "create it in its own VPC network (one per GPU NIC) in " + region + ", or fix gpu_subnetworks"})
			case err != nil:
				k.add(providers.CheckResult{Check: "GPU subnetwork " + name, Scope: region, Status: providers.CheckUnavailable, Detail: strings.SplitN(err.Error(), "\n", 2)[0]})
			case nets[sn.GetNetwork()] != "":
				k.add(providers.CheckResult{Check: "GPU subnetwork " + name, Scope: region, Status: providers.CheckFailed,
					Detail: fmt.Sprintf("in the same VPC network as %s (%s): an instance's NICs must each be in their own", nets[sn.GetNetwork()], lastSegment(sn.GetNetwork())),
					Fix:    "give each GPU NIC's subnetwork its own VPC network"})
			default:
				nets[sn.GetNetwork()] = name
				k.add(providers.CheckResult{Check: "GPU subnetwork " + name, Scope: region, Status: providers.CheckOK,
					Detail: fmt.Sprintf("%s in network %s", sn.GetIpCidrRange(), lastSegment(sn.GetNetwork()))})
			}
		}
	}
}
