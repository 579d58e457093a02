package fakegce

// This file serves what a preflight (`fleetd check`) reads besides machine
// types: projects.get, zones.get, regions.get with quotas,
// acceleratorTypes.get, images.get and images.getFromFamily from Compute
// Engine v1, plus testIamPermissions from Cloud Resource Manager v1 (on a
// project) and IAM v1 (on a service account), which the real API serves
// from other hosts; the fake answers them on its own URL.

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"sort"
	"strings"
)

// ProjectNumber is the project number the fake reports (Project.id).
const ProjectNumber = 123456789012

// Quota is one quota of a region or of the project (compute#quota).
// Limit and usage are JSON numbers, not strings.
type Quota struct {
	Metric string  `json:"metric"`
	Limit  float64 `json:"limit"`
	Usage  float64 `json:"usage"`
	Owner  string  `json:"owner,omitempty"`
}

// Project is the compute view of a project (compute#project); quotas are
// the global ones (GPUS_ALL_REGIONS, CPUS_ALL_REGIONS, ...).
type Project struct {
	Kind                   string    `json:"kind"`
	ID                     Uint64    `json:"id"`
	CreationTimestamp      string    `json:"creationTimestamp"`
	Name                   string    `json:"name"`
	CommonInstanceMetadata *Metadata `json:"commonInstanceMetadata,omitempty"`
	Quotas                 []Quota   `json:"quotas"`
	SelfLink               string    `json:"selfLink"`
	DefaultServiceAccount  string    `json:"defaultServiceAccount"`
	XpnProjectStatus       string    `json:"xpnProjectStatus"`
	DefaultNetworkTier     string    `json:"defaultNetworkTier"`
	VMDNSSetting           string    `json:"vmDnsSetting"`
}

// Region is compute#region. Zones are full URLs.
type Region struct {
	Kind              string   `json:"kind"`
	ID                Uint64   `json:"id"`
	CreationTimestamp string   `json:"creationTimestamp"`
	Name              string   `json:"name"`
	Description       string   `json:"description"`
	Status            string   `json:"status"`
	Zones             []string `json:"zones"`
	Quotas            []Quota  `json:"quotas"`
	SelfLink          string   `json:"selfLink"`
	SupportsPzs       bool     `json:"supportsPzs"`
}

// ZoneInfo is compute#zone (named so as not to clash with the Zone
// option). Region is a full URL.
type ZoneInfo struct {
	Kind                  string             `json:"kind"`
	ID                    Uint64             `json:"id"`
	CreationTimestamp     string             `json:"creationTimestamp"`
	Name                  string             `json:"name"`
	Description           string             `json:"description"`
	Status                string             `json:"status"`
	Region                string             `json:"region"`
	SelfLink              string             `json:"selfLink"`
	AvailableCPUPlatforms []string           `json:"availableCpuPlatforms"`
	SupportsPzs           bool               `json:"supportsPzs"`
	Deprecated            *DeprecationStatus `json:"deprecated,omitempty"`
}

// DeprecationStatus is the deprecated block of images, zones and types.
type DeprecationStatus struct {
	State       string `json:"state"`
	Replacement string `json:"replacement,omitempty"`
}

// Image is compute#image.
type Image struct {
	Kind              string             `json:"kind"`
	ID                Uint64             `json:"id"`
	CreationTimestamp string             `json:"creationTimestamp"`
	Name              string             `json:"name"`
	Description       string             `json:"description,omitempty"`
	SourceType        string             `json:"sourceType"`
	Status            string             `json:"status"`
	ArchiveSizeBytes  Int64              `json:"archiveSizeBytes"`
	DiskSizeGb        Int64              `json:"diskSizeGb"`
	Family            string             `json:"family,omitempty"`
	SelfLink          string             `json:"selfLink"`
	LabelFingerprint  string             `json:"labelFingerprint"`
	GuestOsFeatures   []GuestOsFeature   `json:"guestOsFeatures,omitempty"`
	StorageLocations  []string           `json:"storageLocations,omitempty"`
	Architecture      string             `json:"architecture"`
	Deprecated        *DeprecationStatus `json:"deprecated,omitempty"`
}

// GuestOsFeature is one entry of Image.guestOsFeatures.
type GuestOsFeature struct {
	Type string `json:"type"`
}

// ImageSpec describes an image the fake serves.
type ImageSpec struct {
	Name       string
	Family     string
	DiskSizeGb int64
	// Deprecated is "", DEPRECATED, OBSOLETE or DELETED.
	Deprecated string
}

// DefaultImages are the public images the fake serves, by project.
var DefaultImages = map[string][]ImageSpec{
	"deeplearning-platform-release": {
		{Name: "pytorch-latest-gpu-v20260801", Family: "pytorch-latest-gpu", DiskSizeGb: 50},
	},
	"debian-cloud": {
		{Name: "debian-12-bookworm-v20260701", Family: "debian-12", DiskSizeGb: 10, Deprecated: "DEPRECATED"},
		{Name: "debian-12-bookworm-v20260801", Family: "debian-12", DiskSizeGb: 10},
	},
}

// DefaultRegionQuotas are the limits of every region the fake serves.
// PREEMPTIBLE_CPUS and PREEMPTIBLE_NVIDIA_T4_GPUS are 0, so Spot VMs of
// those count against CPUS and NVIDIA_T4_GPUS, as in a fresh project.
var DefaultRegionQuotas = []Quota{
	{Metric: "CPUS", Limit: 2400},
	{Metric: "DISKS_TOTAL_GB", Limit: 102400},
	{Metric: "STATIC_ADDRESSES", Limit: 175},
	{Metric: "IN_USE_ADDRESSES", Limit: 575},
	{Metric: "SSD_TOTAL_GB", Limit: 81920},
	{Metric: "INSTANCES", Limit: 6000},
	{Metric: "PREEMPTIBLE_CPUS", Limit: 0},
	{Metric: "A2_CPUS", Limit: 1200},
	{Metric: "N2_CPUS", Limit: 2400},
	{Metric: "NVIDIA_A100_GPUS", Limit: 16},
	{Metric: "PREEMPTIBLE_NVIDIA_A100_GPUS", Limit: 16},
	{Metric: "NVIDIA_A100_80GB_GPUS", Limit: 16},
	{Metric: "PREEMPTIBLE_NVIDIA_A100_80GB_GPUS", Limit: 16},
	{Metric: "PREEMPTIBLE_NVIDIA_H100_GPUS", Limit: 16},
	{Metric: "NVIDIA_L4_GPUS", Limit: 16},
	{Metric: "PREEMPTIBLE_NVIDIA_L4_GPUS", Limit: 16},
	{Metric: "NVIDIA_T4_GPUS", Limit: 8},
	{Metric: "PREEMPTIBLE_NVIDIA_T4_GPUS", Limit: 0},
	{Metric: "NVIDIA_V100_GPUS", Limit: 8},
	{Metric: "PREEMPTIBLE_NVIDIA_V100_GPUS", Limit: 8},
	{Metric: "NVIDIA_P100_GPUS", Limit: 4},
	{Metric: "PREEMPTIBLE_NVIDIA_P100_GPUS", Limit: 4},
	{Metric: "RESOURCE_POLICIES", Limit: 50},
}

// DefaultProjectQuotas are the project's global limits.
var DefaultProjectQuotas = []Quota{
	{Metric: "SNAPSHOTS", Limit: 5000},
	{Metric: "NETWORKS", Limit: 15},
	{Metric: "FIREWALLS", Limit: 200},
	{Metric: "IMAGES", Limit: 2000},
	{Metric: "ROUTES", Limit: 250},
	{Metric: "INSTANCE_TEMPLATES", Limit: 1000},
	{Metric: "SUBNETWORKS", Limit: 275},
	{Metric: "CPUS_ALL_REGIONS", Limit: 4800},
	{Metric: "GPUS_ALL_REGIONS", Limit: 64},
}

// gpuMetrics maps accelerator types to the quota metric their GPUs use.
var gpuMetrics = map[string]string{
	"nvidia-tesla-a100":     "NVIDIA_A100_GPUS",
	"nvidia-a100-80gb":      "NVIDIA_A100_80GB_GPUS",
	"nvidia-h100-80gb":      "NVIDIA_H100_GPUS",
	"nvidia-h100-mega-80gb": "NVIDIA_H100_MEGA_GPUS",
	"nvidia-l4":             "NVIDIA_L4_GPUS",
	"nvidia-tesla-t4":       "NVIDIA_T4_GPUS",
	"nvidia-tesla-v100":     "NVIDIA_V100_GPUS",
	"nvidia-tesla-p100":     "NVIDIA_P100_GPUS",
}

// cpuMetrics maps machine series to their vCPU quota metric.
var cpuMetrics = map[string]string{"n1": "CPUS", "a2": "A2_CPUS", "n2": "N2_CPUS"}

// checkState is the part of the world only the preflight reads.
type checkState struct {
	projectQuotas map[string]*Quota
	regionQuotas  map[string]map[string]*Quota // region → metric
	zoneStatus    map[string]string
	images        map[string][]*Image // project → images in creation order
	denied        map[string]bool     // project-level permissions not granted
	saDenied      map[string]map[string]bool
	rmDisabled    bool
	requests      map[string]int
}

// registerCheck adds the preflight routes and seeds their state; New
// calls it once the zones exist.
func (s *Server) registerCheck(mux *http.ServeMux) {
	s.check = checkState{
		projectQuotas: map[string]*Quota{}, regionQuotas: map[string]map[string]*Quota{},
		zoneStatus: map[string]string{}, images: map[string][]*Image{},
		denied: map[string]bool{}, saDenied: map[string]map[string]bool{}, requests: map[string]int{},
	}
	for _, q := range DefaultProjectQuotas {
		q := q
		s.check.projectQuotas[q.Metric] = &q
	}
	for _, zn := range s.zoneOrder {
		r := regionOf(zn)
		if _, ok := s.check.regionQuotas[r]; ok {
			continue
		}
		qs := map[string]*Quota{}
		for _, q := range DefaultRegionQuotas {
			q := q
			qs[q.Metric] = &q
		}
		s.check.regionQuotas[r] = qs
	}
	for _, project := range slices.Sorted(maps.Keys(DefaultImages)) {
		for _, im := range DefaultImages[project] {
			s.addImage(project, im)
		}
	}

	p := "/compute/v1/projects/{project}"
	mux.HandleFunc("GET "+p, s.counted("projects.get", s.getProject))
	mux.HandleFunc("GET "+p+"/zones/{zone}", s.counted("zones.get", s.getZone))
	mux.HandleFunc("GET "+p+"/regions/{region}", s.counted("regions.get", s.getRegion))
	mux.HandleFunc("GET "+p+"/zones/{zone}/acceleratorTypes/{name}", s.counted("acceleratorTypes.get", s.getAcceleratorType))
	mux.HandleFunc("GET "+p+"/global/images/{image}", s.counted("images.get", s.getImage))
	mux.HandleFunc("GET "+p+"/global/images/family/{family}", s.counted("images.getFromFamily", s.getImageFromFamily))
	// Cloud Resource Manager v1 and IAM v1: the resource and the custom
	// verb share one path segment ("p:testIamPermissions").
	mux.HandleFunc("POST /v1/projects/{resource}", s.countedIAM("projects.testIamPermissions", s.testProjectPermissions))
	mux.HandleFunc("POST /v1/projects/{project}/serviceAccounts/{resource}", s.countedIAM("serviceAccounts.testIamPermissions", s.testServiceAccountPermissions))
}

// --- knobs -------------------------------------------------------------

// SetQuota sets a quota's limit and its usage by things other than the
// fake's own instances (which are counted on top). region "" is the
// project's global quotas.
func (s *Server) SetQuota(region, metric string, limit, usage float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	qs := s.check.projectQuotas
	if region != "" {
		if s.check.regionQuotas[region] == nil {
			s.check.regionQuotas[region] = map[string]*Quota{}
		}
		qs = s.check.regionQuotas[region]
	}
	qs[metric] = &Quota{Metric: metric, Limit: limit, Usage: usage}
}

// RemoveQuota drops a metric from a region's (or, with "", the project's)
// quota list, as for a metric the region does not report.
func (s *Server) RemoveQuota(region, metric string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if region == "" {
		delete(s.check.projectQuotas, metric)
		return
	}
	delete(s.check.regionQuotas[region], metric)
}

// SetZoneStatus sets a zone's status (UP or DOWN).
func (s *Server) SetZoneStatus(zone, status string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.check.zoneStatus[zone] = status
}

// AddImage adds an image to a project (any project: images are often
// public ones of another project).
func (s *Server) AddImage(project string, im ImageSpec) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.addImage(project, im)
}

// RemoveImage deletes an image; a family left empty is gone too.
func (s *Server) RemoveImage(project, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.check.images[project] = slices.DeleteFunc(s.check.images[project], func(im *Image) bool { return im.Name == name })
}

// SetDeniedPermissions makes project-level testIamPermissions leave these
// permissions out of its answer (replacing any earlier set).
func (s *Server) SetDeniedPermissions(perms ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.check.denied = map[string]bool{}
	for _, p := range perms {
		s.check.denied[p] = true
	}
}

// SetDeniedServiceAccountPermissions does the same for testIamPermissions
// on one service account.
func (s *Server) SetDeniedServiceAccountPermissions(email string, perms ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := map[string]bool{}
	for _, p := range perms {
		d[p] = true
	}
	s.check.saDenied[email] = d
}

// SetResourceManagerDisabled makes testIamPermissions answer as when the
// Cloud Resource Manager API is not enabled in the project.
func (s *Server) SetResourceManagerDisabled(disabled bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.check.rmDisabled = disabled
}

// CheckRequests counts the preflight calls served, by method name
// ("projects.get", "regions.get", "zones.get", "acceleratorTypes.get",
// "images.get", "images.getFromFamily", "projects.testIamPermissions",
// "serviceAccounts.testIamPermissions").
func (s *Server) CheckRequests() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.check.requests))
	for k, v := range s.check.requests {
		out[k] = v
	}
	return out
}

func (s *Server) addImage(project string, im ImageSpec) {
	img := &Image{
		Kind: "compute#image", ID: Uint64(s.newID()), CreationTimestamp: "2026-08-01T10:00:00.000-07:00",
		Name: im.Name, Description: im.Name, SourceType: "RAW", Status: "READY",
		ArchiveSizeBytes: Int64(im.DiskSizeGb << 28), DiskSizeGb: Int64(im.DiskSizeGb), Family: im.Family,
		SelfLink:         APIBase + "projects/" + project + "/global/images/" + im.Name,
		LabelFingerprint: "42WmSpB8rSM=", Architecture: "X86_64",
		GuestOsFeatures:  []GuestOsFeature{{Type: "UEFI_COMPATIBLE"}, {Type: "VIRTIO_SCSI_MULTIQUEUE"}, {Type: "GVNIC"}},
		StorageLocations: []string{"us", "eu", "asia"},
	}
	if im.Deprecated != "" {
		img.Deprecated = &DeprecationStatus{State: im.Deprecated}
	}
	s.check.images[project] = append(s.check.images[project], img)
}

// --- handlers ------------------------------------------------------------

func (s *Server) getProject(w http.ResponseWriter, r *http.Request) {
	if !s.checkProject(w, r) {
		return
	}
	usage := s.usage("")
	writeJSON(w, http.StatusOK, Project{
		Kind: "compute#project", ID: ProjectNumber, CreationTimestamp: "2024-01-15T09:30:00.000-08:00",
		Name: s.project, CommonInstanceMetadata: &Metadata{Kind: "compute#metadata", Fingerprint: fingerprint("project", s.project)},
		Quotas: quotaList(s.check.projectQuotas, usage), SelfLink: APIBase + "projects/" + s.project,
		DefaultServiceAccount: fmt.Sprintf("%d-compute@developer.gserviceaccount.com", ProjectNumber),
		XpnProjectStatus:      "UNSPECIFIED_XPN_PROJECT_STATUS", DefaultNetworkTier: "PREMIUM", VMDNSSetting: "ZONAL_ONLY",
	})
}

func (s *Server) getZone(w http.ResponseWriter, r *http.Request) {
	z, ok := s.zone(w, r)
	if !ok {
		return
	}
	status := s.check.zoneStatus[z.name]
	if status == "" {
		status = "UP"
	}
	writeJSON(w, http.StatusOK, ZoneInfo{
		Kind: "compute#zone", ID: Uint64(2000 + zoneIndex(s.zoneOrder, z.name)), CreationTimestamp: "1969-12-31T16:00:00.000-08:00",
		Name: z.name, Description: z.name, Status: status,
		Region:                APIBase + "projects/" + s.project + "/regions/" + regionOf(z.name),
		SelfLink:              s.zoneLink(z.name),
		AvailableCPUPlatforms: []string{"Intel Cascade Lake", "Intel Ice Lake", "AMD Milan", "Intel Sapphire Rapids"},
	})
}

func (s *Server) getRegion(w http.ResponseWriter, r *http.Request) {
	if !s.checkProject(w, r) {
		return
	}
	name := r.PathValue("region")
	var zones []string
	for _, zn := range s.zoneOrder {
		if regionOf(zn) == name {
			zones = append(zones, s.zoneLink(zn))
		}
	}
	if len(zones) == 0 {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/regions/%s' was not found", s.project, name))
		return
	}
	writeJSON(w, http.StatusOK, Region{
		Kind: "compute#region", ID: Uint64(1000 + zoneIndex(s.zoneOrder, zones[0][strings.LastIndexByte(zones[0], '/')+1:])),
		CreationTimestamp: "1969-12-31T16:00:00.000-08:00", Name: name, Description: name, Status: "UP",
		Zones: zones, Quotas: quotaList(s.check.regionQuotas[name], s.usage(name)),
		SelfLink: APIBase + "projects/" + s.project + "/regions/" + name,
	})
}

func (s *Server) getAcceleratorType(w http.ResponseWriter, r *http.Request) {
	z, ok := s.zone(w, r)
	if !ok {
		return
	}
	if at, ok := zonalItem(s, w, r, z, "acceleratorTypes", "name", findIn((*zoneState).acceleratorType)); ok {
		writeJSON(w, http.StatusOK, at)
	}
}

func (s *Server) getImage(w http.ResponseWriter, r *http.Request) {
	project, name := r.PathValue("project"), r.PathValue("image")
	for _, im := range s.check.images[project] {
		if im.Name == name {
			writeJSON(w, http.StatusOK, im)
			return
		}
	}
	writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/global/images/%s' was not found", project, name))
}

// getImageFromFamily answers the newest image of a family that is not
// deprecated, as the real method does.
func (s *Server) getImageFromFamily(w http.ResponseWriter, r *http.Request) {
	project, family := r.PathValue("project"), r.PathValue("family")
	var found *Image
	for _, im := range s.check.images[project] {
		if im.Family == family && im.Deprecated == nil {
			found = im
		}
	}
	if found == nil {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/global/images/family/%s' was not found", project, family))
		return
	}
	writeJSON(w, http.StatusOK, found)
}

// permissionsBody is the request and the response of testIamPermissions.
type permissionsBody struct {
	Permissions []string `json:"permissions,omitempty"`
}

func (s *Server) testProjectPermissions(w http.ResponseWriter, r *http.Request, project string) {
	if s.check.rmDisabled {
		writeRPCError(w, http.StatusForbidden, "PERMISSION_DENIED", "SERVICE_DISABLED", fmt.Sprintf(
			"Cloud Resource Manager API has not been used in project %d before or it is disabled. Enable it by visiting https://console.developers.google.com/apis/api/cloudresourcemanager.googleapis.com/overview?project=%d then retry. If you enabled this API recently, wait a few minutes for the action to propagate to our systems and retry.",
			ProjectNumber, ProjectNumber))
		return
	}
	// Resource Manager answers an unknown project like a forbidden one, so
	// as not to reveal which projects exist.
	if project != s.project && project != fmt.Sprint(ProjectNumber) {
		writeRPCError(w, http.StatusForbidden, "PERMISSION_DENIED", "", "The caller does not have permission")
		return
	}
	s.answerPermissions(w, r, s.check.denied)
}

func (s *Server) testServiceAccountPermissions(w http.ResponseWriter, r *http.Request, email string) {
	s.answerPermissions(w, r, s.check.saDenied[email])
}

// counted serves a preflight method under s.mu, counting it for
// CheckRequests.
func (s *Server) counted(method string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.check.requests[method]++
		h(w, r)
	}
}

// countedIAM is counted for a testIamPermissions method, whose path
// names the resource (iamResource); a path that does not is a 404 and is
// not counted.
func (s *Server) countedIAM(method string, h func(w http.ResponseWriter, r *http.Request, resource string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		res, ok := iamResource(w, r)
		if !ok {
			return
		}
		s.counted(method, func(w http.ResponseWriter, r *http.Request) { h(w, r, res) })(w, r)
	}
}

// iamResource is the resource of a "{resource}:testIamPermissions" path (the
// resource and the verb share one segment); anything else is a 404.
func iamResource(w http.ResponseWriter, r *http.Request) (string, bool) {
	res, ok := strings.CutSuffix(r.PathValue("resource"), ":testIamPermissions")
	if !ok {
		writeRPCError(w, http.StatusNotFound, "NOT_FOUND", "", fmt.Sprintf("The requested URL %s was not found on this server.", r.URL.Path))
	}
	return res, ok
}

func (s *Server) answerPermissions(w http.ResponseWriter, r *http.Request, denied map[string]bool) {
	var req permissionsBody
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		writeRPCError(w, http.StatusBadRequest, "INVALID_ARGUMENT", "", "Invalid JSON payload received. "+err.Error())
		return
	}
	var granted []string
	for _, p := range req.Permissions {
		if strings.Contains(p, "*") {
			writeRPCError(w, http.StatusBadRequest, "INVALID_ARGUMENT", "", fmt.Sprintf("Permissions ('%s') are not valid for this resource.", p))
			return
		}
		if !denied[p] {
			granted = append(granted, p)
		}
	}
	// Nothing granted is an empty object, not an empty list.
	writeJSON(w, http.StatusOK, permissionsBody{Permissions: granted})
}

// rpcError is the google.rpc.Status error body of the newer APIs
// (Resource Manager, IAM).
type rpcError struct {
	Error rpcStatus `json:"error"`
}

type rpcStatus struct {
	Code    int            `json:"code"`
	Message string         `json:"message"`
	Status  string         `json:"status"`
	Details []rpcErrorInfo `json:"details,omitempty"`
}

type rpcErrorInfo struct {
	Type     string            `json:"@type"`
	Reason   string            `json:"reason"`
	Domain   string            `json:"domain"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

func writeRPCError(w http.ResponseWriter, code int, status, reason, msg string) {
	body := rpcError{Error: rpcStatus{Code: code, Message: msg, Status: status}}
	if reason != "" {
		body.Error.Details = []rpcErrorInfo{{
			Type: "type.googleapis.com/google.rpc.ErrorInfo", Reason: reason, Domain: "googleapis.com",
			Metadata: map[string]string{"service": "cloudresourcemanager.googleapis.com", "consumer": fmt.Sprintf("projects/%d", ProjectNumber)},
		}}
	}
	writeJSON(w, code, body)
}

// --- quota accounting ------------------------------------------------------

// usage sums what the fake's live instances consume, per metric, in a
// region ("" for the project's global metrics). Spot VMs count against a
// PREEMPTIBLE_ metric when its limit is above zero, else the standard one.
func (s *Server) usage(region string) map[string]float64 {
	out := map[string]float64{}
	for _, zn := range s.zoneOrder {
		if region != "" && regionOf(zn) != region {
			continue
		}
		z := s.zones[zn]
		for _, in := range z.instances {
			if in.Status == "TERMINATED" || in.Status == "SUSPENDED" {
				continue // stopped VMs hold no CPUs or GPUs
			}
			mt := z.machineType(lastSegment(in.MachineType))
			if mt == nil {
				continue
			}
			gpus := map[string]int{}
			for _, a := range mt.Accelerators {
				gpus[a.GuestAcceleratorType] += a.GuestAcceleratorCount
			}
			for _, a := range in.GuestAccelerators {
				gpus[lastSegment(a.AcceleratorType)] += a.AcceleratorCount
			}
			spot := in.Scheduling != nil && (in.Scheduling.ProvisioningModel == "SPOT" || in.Scheduling.Preemptible)
			if region == "" {
				out["CPUS_ALL_REGIONS"] += float64(mt.GuestCpus)
				for _, n := range gpus {
					out["GPUS_ALL_REGIONS"] += float64(n)
				}
				continue
			}
			series, _, _ := strings.Cut(mt.Name, "-")
			if m := cpuMetrics[series]; m != "" {
				out[s.chargedMetric(region, m, "PREEMPTIBLE_CPUS", spot)] += float64(mt.GuestCpus)
			}
			for typ, n := range gpus {
				if m := gpuMetrics[typ]; m != "" {
					out[s.chargedMetric(region, m, "PREEMPTIBLE_"+m, spot)] += float64(n)
				}
			}
		}
	}
	if region != "" {
		for key := range s.policies {
			if strings.HasPrefix(key, region+"/") {
				out["RESOURCE_POLICIES"]++
			}
		}
	}
	return out
}

func (s *Server) chargedMetric(region, standard, preemptible string, spot bool) string {
	if q := s.check.regionQuotas[region][preemptible]; spot && q != nil && q.Limit > 0 {
		return preemptible
	}
	return standard
}

// quotaList renders quotas in a stable order with live usage added.
func quotaList(qs map[string]*Quota, live map[string]float64) []Quota {
	out := make([]Quota, 0, len(qs))
	for _, q := range qs {
		c := *q
		c.Usage += live[c.Metric]
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Metric < out[j].Metric })
	return out
}

func zoneIndex(zones []string, zone string) int { return slices.Index(zones, zone) }

// regionOf returns the region of a zone ("us-central1-a" → "us-central1").
func regionOf(zone string) string {
	if i := strings.LastIndexByte(zone, '-'); i > 0 {
		return zone[:i]
	}
	return zone
}
