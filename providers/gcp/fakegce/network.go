package fakegce

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

// The fast-network parts of Compute Engine: compact placement resource
// policies (regions/{region}/resourcePolicies insert/get/delete, their
// region operations) and instances that name them (resourcePolicies) and
// carry several network interfaces (nicType GVNIC, MRDMA), as the
// discovery document describes them.

// ResourcePolicy is a compute#resourcePolicy with a group placement policy.
type ResourcePolicy struct {
	Kind                 string                `json:"kind"`
	ID                   Uint64                `json:"id"`
	CreationTimestamp    string                `json:"creationTimestamp"`
	Name                 string                `json:"name"`
	Description          string                `json:"description,omitempty"`
	Region               string                `json:"region"`
	SelfLink             string                `json:"selfLink"`
	Status               string                `json:"status"`
	GroupPlacementPolicy *GroupPlacementPolicy `json:"groupPlacementPolicy,omitempty"`
}

// GroupPlacementPolicy is ResourcePolicyGroupPlacementPolicy.
type GroupPlacementPolicy struct {
	Collocation             string `json:"collocation,omitempty"`
	VMCount                 int    `json:"vmCount,omitempty"`
	AvailabilityDomainCount int    `json:"availabilityDomainCount,omitempty"`
	MaxDistance             int    `json:"maxDistance,omitempty"`
}

func (s *Server) registerNetwork(mux *http.ServeMux, p string) {
	mux.HandleFunc("POST "+p+"regions/{region}/resourcePolicies", readFirst(1<<20, s.regional(s.insertPolicy)))
	mux.HandleFunc("GET "+p+"regions/{region}/resourcePolicies/{name}", s.regional(s.getPolicy))
	mux.HandleFunc("DELETE "+p+"regions/{region}/resourcePolicies/{name}", s.regional(s.deletePolicy))
	mux.HandleFunc("GET "+p+"regions/{region}/operations/{op}", s.regional(s.getRegionOp))
	mux.HandleFunc("GET "+p+"regions/{region}/subnetworks/{name}", s.regional(s.getSubnetwork))
	mux.HandleFunc("POST "+p+"regions/{region}/operations/{op}/wait", s.regional(s.getRegionOp))
}

// Policies returns every resource policy, by region/name.
func (s *Server) Policies() map[string]ResourcePolicy {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]ResourcePolicy{}
	for k, v := range s.policies {
		out[k] = *v
	}
	return out
}

// Subnetwork is a compute#subnetwork.
type Subnetwork struct {
	Kind              string `json:"kind"`
	ID                Uint64 `json:"id"`
	CreationTimestamp string `json:"creationTimestamp"`
	Name              string `json:"name"`
	Network           string `json:"network"`
	IPCidrRange       string `json:"ipCidrRange"`
	Region            string `json:"region"`
	SelfLink          string `json:"selfLink"`
}

// AddSubnetwork creates subnetwork name in region, in its own VPC network
// (as GPUDirect NICs need).
func (s *Server) AddSubnetwork(region, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.subnets == nil {
		s.subnets = map[string]*Subnetwork{}
	}
	n := len(s.subnets)
	s.subnets[region+"/"+name] = &Subnetwork{Kind: "compute#subnetwork", ID: Uint64(s.newID()), CreationTimestamp: stamp(time.Now()), Name: name,
		Network: APIBase + "projects/" + s.project + "/global/networks/" + name + "-net", IPCidrRange: fmt.Sprintf("10.%d.0.0/16", 200+n),
		Region: s.regionLink(region), SelfLink: s.regionLink(region) + "/subnetworks/" + name}
}

func (s *Server) getSubnetwork(w http.ResponseWriter, r *http.Request, region string) {
	getRegional(s, w, r, region, s.subnets, "subnetworks", "name")
}

// regional serves h under s.mu once the request's project and region
// resolve.
func (s *Server) regional(h func(w http.ResponseWriter, r *http.Request, region string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if region, ok := s.regionOK(w, r); ok {
			h(w, r, region)
		}
	}
}

func (s *Server) regionOK(w http.ResponseWriter, r *http.Request) (string, bool) {
	if !s.checkProject(w, r) {
		return "", false
	}
	region := r.PathValue("region")
	for _, z := range s.zoneOrder {
		if regionOf(z) == region {
			return region, true
		}
	}
	writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/regions/%s' was not found", s.project, region))
	return "", false
}

func (s *Server) regionLink(region string) string {
	return APIBase + "projects/" + s.project + "/regions/" + region
}

func (s *Server) insertPolicy(w http.ResponseWriter, r *http.Request, region string) {
	var rp ResourcePolicy
	if !decodeBody(w, r, &rp) {
		return
	}
	switch {
	case !nameRE.MatchString(rp.Name):
		writeError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("Invalid value for field 'resource.name': '%s'. Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'", rp.Name))
		return
	case rp.GroupPlacementPolicy == nil:
		writeError(w, http.StatusBadRequest, "invalid", "Invalid value for field 'resource': a resource policy needs exactly one policy (this fake serves groupPlacementPolicy).")
		return
	case !slices.Contains([]string{"COLLOCATED", "UNSPECIFIED_COLLOCATION"}, rp.GroupPlacementPolicy.Collocation):
		writeError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("Invalid value for field 'resource.groupPlacementPolicy.collocation': '%s'.", rp.GroupPlacementPolicy.Collocation))
		return
	}
	key := region + "/" + rp.Name
	if _, ok := s.policies[key]; ok {
		writeError(w, http.StatusConflict, "alreadyExists", fmt.Sprintf("The resource 'projects/%s/regions/%s/resourcePolicies/%s' already exists", s.project, region, rp.Name))
		return
	}
	now := stamp(time.Now())
	rp.Kind, rp.ID, rp.CreationTimestamp, rp.Status = "compute#resourcePolicy", Uint64(s.newID()), now, "READY"
	rp.Region, rp.SelfLink = s.regionLink(region), s.regionLink(region)+"/resourcePolicies/"+rp.Name
	if s.policies == nil {
		s.policies = map[string]*ResourcePolicy{}
	}
	s.policies[key] = &rp
	writeJSON(w, http.StatusOK, s.newRegionOp(region, "insert", rp.SelfLink, uint64(rp.ID)))
}

func (s *Server) newRegionOp(region, typ, target string, targetID uint64) Operation {
	now := stamp(time.Now())
	name := fmt.Sprintf("operation-%d", s.newID())
	op := Operation{Kind: "compute#operation", ID: Uint64(s.newID()), Name: name, OperationType: typ,
		TargetLink: target, TargetID: Uint64(targetID), Status: "DONE", Progress: 100, InsertTime: now, StartTime: now, EndTime: now,
		SelfLink: s.regionLink(region) + "/operations/" + name}
	if s.regionOps == nil {
		s.regionOps = map[string]*Operation{}
	}
	s.regionOps[region+"/"+name] = &op // resource policy operations finish at once
	return op
}

// regionalItem finds the resource kept in m under region/NAME, NAME
// being the path value key, answering GCE's 404 when it is missing.
func regionalItem[V any](s *Server, w http.ResponseWriter, r *http.Request, region string, m map[string]V, kind, key string) (V, bool) {
	v, ok := m[region+"/"+r.PathValue(key)]
	if !ok {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/regions/%s/%s/%s' was not found", s.project, region, kind, r.PathValue(key)))
	}
	return v, ok
}

// getRegional answers a GET of a regional resource (regionalItem).
func getRegional[V any](s *Server, w http.ResponseWriter, r *http.Request, region string, m map[string]V, kind, key string) {
	if v, ok := regionalItem(s, w, r, region, m, kind, key); ok {
		writeJSON(w, http.StatusOK, v)
	}
}

func (s *Server) getRegionOp(w http.ResponseWriter, r *http.Request, region string) {
	getRegional(s, w, r, region, s.regionOps, "operations", "op")
}

func (s *Server) getPolicy(w http.ResponseWriter, r *http.Request, region string) {
	getRegional(s, w, r, region, s.policies, "resourcePolicies", "name")
}

func (s *Server) deletePolicy(w http.ResponseWriter, r *http.Request, region string) {
	rp, ok := regionalItem(s, w, r, region, s.policies, "resourcePolicies", "name")
	if !ok {
		return
	}
	name := r.PathValue("name")
	for _, zn := range s.zoneOrder {
		for _, in := range s.zones[zn].instances {
			if slices.Contains(in.ResourcePolicies, rp.SelfLink) && in.Status != "TERMINATED" {
				writeError(w, http.StatusBadRequest, "resourceInUseByAnotherResource",
					fmt.Sprintf("The resource_policy resource '%s' is already being used by '%s'", rp.SelfLink, in.SelfLink))
				return
			}
		}
	}
	delete(s.policies, region+"/"+name)
	writeJSON(w, http.StatusOK, s.newRegionOp(region, "delete", rp.SelfLink, uint64(rp.ID)))
}

// gpuNICs are the extra NICs an a3 type takes on its fast path, as
// Google documents them: a3-highgpu-8g 4 GPU gVNICs (GPUDirect-TCPX),
// a3-megagpu-8g 8 (GPUDirect-TCPXO), a3-ultragpu-8g a second gVNIC and 8
// MRDMA NICs.
var gpuNICs = map[string]struct{ gvnic, mrdma int }{
	"a3-highgpu-8g":  {4, 0},
	"a3-megagpu-8g":  {8, 0},
	"a3-ultragpu-8g": {1, 8},
}

// validateNetwork checks an inserted instance's interfaces and resource
// policies; "" when they are fine.
func (s *Server) validateNetwork(z *zoneState, in *Instance) string {
	region := regionOf(z.name)
	for i, p := range in.ResourcePolicies {
		name := lastSegment(p)
		if !strings.Contains(p, "regions/"+region+"/resourcePolicies/") || s.policies[region+"/"+name] == nil {
			return fmt.Sprintf("Invalid value for field 'resource.resourcePolicies[%d]': '%s'. The resource policy does not exist in region '%s'.", i, p, region)
		}
	}
	nics := len(in.NetworkInterfaces)
	if nics <= 1 {
		return ""
	}
	mt := lastSegment(in.MachineType)
	want, ok := gpuNICs[mt]
	if !ok {
		if nics > 8 {
			return fmt.Sprintf("Invalid value for field 'resource.networkInterfaces': machine type %s supports at most 8 network interfaces.", mt)
		}
		return ""
	}
	gv, rdma := 0, 0
	subnets := map[string]bool{}
	for i, ni := range in.NetworkInterfaces {
		switch ni.NicType {
		case "GVNIC":
			gv++
		case "MRDMA":
			rdma++
		default:
			return fmt.Sprintf("Invalid value for field 'resource.networkInterfaces[%d].nicType': '%s'. %s requires gVNIC or MRDMA network interfaces.", i, ni.NicType, mt)
		}
		where := ni.Subnetwork
		if where == "" {
			where = ni.Network // nic0 may name only its network
		}
		if where == "" {
			where = "global/networks/default"
		}
		if subnets[where] {
			return fmt.Sprintf("Invalid value for field 'resource.networkInterfaces[%d]': '%s'. Two interfaces of an instance cannot share a network.", i, where)
		}
		subnets[where] = true
	}
	if gv != 1+want.gvnic || rdma != want.mrdma {
		return fmt.Sprintf("Invalid value for field 'resource.networkInterfaces': %s takes %d gVNIC and %d MRDMA interfaces with GPUDirect, got %d and %d.", mt, 1+want.gvnic, want.mrdma, gv, rdma)
	}
	return ""
}
