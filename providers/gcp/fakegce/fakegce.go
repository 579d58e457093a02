// Package fakegce is an in-process fake of the Compute Engine REST v1 API,
// faithful to the wire shapes the real cloud.google.com/go/compute clients
// parse: instances (insert, get, delete, list, aggregatedList with filter
// and pagination), zone operations (get, wait, list with filter), machine
// types with their built-in accelerators, and accelerator types.
//
// Failures come in the two shapes the real API uses: synchronous googleapi
// error bodies ({"error":{"code","message","errors":[{"reason"}]}}) and
// asynchronous operations that end DONE with error.errors[]{code,message}.
// Knobs inject stockouts, quota and rate-limit errors, slow operations and
// preemptions. Tests point a real client at Server.URL with
// option.WithEndpoint and option.WithoutAuthentication.
package fakegce

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// APIBase is the prefix of every selfLink, as the real API writes them.
const APIBase = "https://www.googleapis.com/compute/v1/"

// OperationTypePreempted is the operationType of the system event GCE
// records when it preempts a Spot VM.
const OperationTypePreempted = "compute.instances.preempted"

// Options configures a Server. The zero value serves project "fleetd-test"
// with zones us-central1-a and us-central1-b, each offering every
// DefaultMachineTypes and DefaultAcceleratorTypes entry.
type Options struct {
	Project string
	Zones   []Zone
}

// Zone is one zone the fake serves and what it offers there; nil lists
// mean the default catalogs.
type Zone struct {
	Name             string
	MachineTypes     []MachineTypeSpec
	AcceleratorTypes []AcceleratorTypeSpec
}

// Fault makes inserts fail. Set either the asynchronous part (OpErrors:
// the insert is accepted and its operation ends DONE with these errors)
// or the synchronous part (HTTPStatus, Reason, Message: the insert call
// itself fails with a googleapi error body).
type Fault struct {
	OpErrors     []OperationErrorItem
	OpHTTPStatus int // httpErrorStatusCode of the failed operation

	HTTPStatus int
	Reason     string
	Message    string

	// MachineType limits the fault to inserts of that machine type.
	MachineType string
	// Count limits the fault to the next Count matching inserts; 0 means
	// until cleared.
	Count int
}

// StockoutFault is the asynchronous ZONE_RESOURCE_POOL_EXHAUSTED failure
// GCE reports when a zone has no capacity for the request.
func StockoutFault(project, zone string) *Fault {
	return &Fault{
		OpErrors: []OperationErrorItem{{
			Code:    "ZONE_RESOURCE_POOL_EXHAUSTED",
			Message: fmt.Sprintf("The zone 'projects/%s/zones/%s' does not have enough resources available to fulfill the request.  Try a different zone, or try again later.", project, zone),
		}},
		OpHTTPStatus: http.StatusServiceUnavailable,
	}
}

// QuotaFault is the asynchronous QUOTA_EXCEEDED failure for a quota metric
// such as GPUS_ALL_REGIONS (global) or NVIDIA_A100_GPUS (per region).
func QuotaFault(metric, region string) *Fault {
	where := "globally"
	if region != "" {
		where = "in region " + region
	}
	return &Fault{
		OpErrors: []OperationErrorItem{{
			Code:    "QUOTA_EXCEEDED",
			Message: fmt.Sprintf("Quota '%s' exceeded.  Limit: 0.0 %s.", metric, where),
		}},
		OpHTTPStatus: http.StatusForbidden,
	}
}

// RateLimitFault is the synchronous 429 GCE returns when API requests
// are throttled.
func RateLimitFault() *Fault {
	return &Fault{HTTPStatus: http.StatusTooManyRequests, Reason: "rateLimitExceeded", Message: "Rate Limit Exceeded"}
}

// Server is a running fake. All methods are safe for concurrent use.
type Server struct {
	// URL is the endpoint to give the client (option.WithEndpoint).
	URL string

	project string
	srv     *httptest.Server

	mu         sync.Mutex
	zones      map[string]*zoneState
	zoneOrder  []string
	nextID     uint64
	polls      int
	faults     map[string]*Fault // by zone; "" = every zone
	requestIDs map[string]*opRec // zone + "/" + requestId
	stats      Stats
	check      checkState // preflight world, see check.go
	// policies (region/name) and their region operations (network.go).
	policies  map[string]*ResourcePolicy
	regionOps map[string]*Operation
	subnets   map[string]*Subnetwork // region/name (AddSubnetwork)
}

// Stats counts what the fake was asked to do.
type Stats struct {
	InsertCalls      int // every instances.insert request
	InstancesCreated int // inserts that created an instance
	DedupedInserts   int // inserts answered from a known requestId
	DeleteCalls      int
	OperationPolls   int // operations get + wait
}

type zoneState struct {
	name      string
	mts       []MachineType
	accels    []AcceleratorType
	instances map[string]*Instance
	ops       []*opRec
	opsByName map[string]*opRec
	nextIP    int
}

type opRec struct {
	op        Operation
	pollsLeft int
	// finish runs (under the lock) when the operation becomes DONE.
	finish func()
}

// New starts a fake on a loopback port. Close it when done.
func New(opts Options) *Server {
	s := &Server{
		project:    opts.Project,
		zones:      map[string]*zoneState{},
		nextID:     4100000000000000000,
		faults:     map[string]*Fault{},
		requestIDs: map[string]*opRec{},
	}
	if s.project == "" {
		s.project = "fleetd-test"
	}
	zones := opts.Zones
	if len(zones) == 0 {
		zones = []Zone{{Name: "us-central1-a"}, {Name: "us-central1-b"}}
	}
	for _, z := range zones {
		s.addZone(z)
	}
	mux := http.NewServeMux()
	p := "/compute/v1/projects/{project}/"
	mux.HandleFunc("GET "+p+"zones/{zone}/machineTypes", s.zonal(s.listMachineTypes))
	mux.HandleFunc("GET "+p+"zones/{zone}/machineTypes/{name}", s.zonal(s.getMachineType))
	mux.HandleFunc("GET "+p+"zones/{zone}/acceleratorTypes", s.zonal(s.listAcceleratorTypes))
	mux.HandleFunc("POST "+p+"zones/{zone}/instances", readFirst(4<<20, s.zonal(s.insertInstance)))
	mux.HandleFunc("GET "+p+"zones/{zone}/instances", s.zonal(s.listInstances))
	mux.HandleFunc("GET "+p+"zones/{zone}/instances/{name}", s.zonal(s.getInstance))
	mux.HandleFunc("DELETE "+p+"zones/{zone}/instances/{name}", s.zonal(s.deleteInstance))
	mux.HandleFunc("GET "+p+"aggregated/instances", s.aggregatedInstances)
	mux.HandleFunc("GET "+p+"zones/{zone}/operations", s.zonal(s.listOperations))
	mux.HandleFunc("GET "+p+"zones/{zone}/operations/{op}", s.zonal(s.getOperation))
	mux.HandleFunc("POST "+p+"zones/{zone}/operations/{op}/wait", s.zonal(s.waitOperation))
	s.registerCheck(mux)
	s.registerNetwork(mux, p)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The requested URL %s was not found on this server.", r.URL.Path))
	})
	var h http.Handler = mux
	if wrapHandler != nil {
		h = wrapHandler(mux)
	}
	s.srv = httptest.NewServer(h)
	s.URL = s.srv.URL
	return s
}

// wrapHandler, set only by this package's tests, wraps every fake's
// routes so the tests see each response and can probe the routes: they
// check them all against the published API description.
var wrapHandler func(*http.ServeMux) http.Handler

// Close shuts the server down.
func (s *Server) Close() { s.srv.Close() }

// Project is the project the fake serves.
func (s *Server) Project() string { return s.project }

func (s *Server) addZone(z Zone) {
	zs := &zoneState{name: z.Name, instances: map[string]*Instance{}, opsByName: map[string]*opRec{}, nextIP: 2}
	mts := z.MachineTypes
	if mts == nil {
		mts = DefaultMachineTypes
	}
	for _, m := range mts {
		mt := MachineType{
			Kind: "compute#machineType", ID: Uint64(s.newID()), CreationTimestamp: "1969-12-31T16:00:00.000-08:00",
			Name: m.Name, Description: describe(m), GuestCpus: m.VCPUs, MemoryMb: m.MemoryMb,
			MaximumPersistentDisks: 128, MaximumPersistentDisksSizeGb: 263168, Zone: z.Name,
			SelfLink: s.zoneLink(z.Name) + "/machineTypes/" + m.Name, Architecture: architecture(m.Name),
		}
		if m.GPUs > 0 {
			mt.Accelerators = []MachineTypeAccelerator{{GuestAcceleratorType: m.GPUType, GuestAcceleratorCount: m.GPUs}}
		}
		zs.mts = append(zs.mts, mt)
	}
	acs := z.AcceleratorTypes
	if acs == nil {
		acs = DefaultAcceleratorTypes
	}
	for _, a := range acs {
		zs.accels = append(zs.accels, AcceleratorType{
			Kind: "compute#acceleratorType", ID: Uint64(s.newID()), CreationTimestamp: "1969-12-31T16:00:00.000-08:00",
			Name: a.Name, Description: a.Description, Zone: s.zoneLink(z.Name),
			SelfLink: s.zoneLink(z.Name) + "/acceleratorTypes/" + a.Name, MaximumCardsPerInstance: a.MaxPerVM,
		})
	}
	s.zones[z.Name] = zs
	s.zoneOrder = append(s.zoneOrder, z.Name)
}

func describe(m MachineTypeSpec) string {
	mem := strconv.FormatFloat(float64(m.MemoryMb)/1024, 'f', -1, 64)
	if m.GPUs > 0 {
		return fmt.Sprintf("Accelerator Optimized: %d %s GPU, %d vCPUs, %sGB RAM", m.GPUs, m.GPUType, m.VCPUs, mem)
	}
	return fmt.Sprintf("%d vCPUs, %s GB RAM", m.VCPUs, mem)
}

func (s *Server) newID() uint64 {
	s.nextID += 7919 // ids are not consecutive in the real API either
	return s.nextID
}

func (s *Server) zoneLink(zone string) string {
	return APIBase + "projects/" + s.project + "/zones/" + zone
}

// --- knobs -------------------------------------------------------------

// SetInsertFault makes inserts in zone ("" for every zone) fail with f;
// nil clears it.
func (s *Server) SetInsertFault(zone string, f *Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f == nil {
		delete(s.faults, zone)
		return
	}
	c := *f
	s.faults[zone] = &c
}

// SetStockout turns a ZONE_RESOURCE_POOL_EXHAUSTED stockout in zone on or off.
func (s *Server) SetStockout(zone string, on bool) {
	if on {
		s.SetInsertFault(zone, StockoutFault(s.project, zone))
	} else {
		s.SetInsertFault(zone, nil)
	}
}

// SetOperationPolls makes operations started from now on report RUNNING
// for n polls (operations get or wait) before they are DONE.
func (s *Server) SetOperationPolls(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.polls = n
}

// CompleteOperations finishes every pending operation at once.
func (s *Server) CompleteOperations() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, z := range s.zones {
		for _, o := range z.ops {
			s.complete(o)
		}
	}
}

// Preempt preempts an instance as GCE does a Spot VM: the instance ends
// TERMINATED and a DONE compute.instances.preempted system operation is
// recorded in its zone. It returns the operation.
func (s *Server) Preempt(zone, name string) (Operation, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	z, ok := s.zones[zone]
	if !ok {
		return Operation{}, fmt.Errorf("no zone %q", zone)
	}
	in, ok := z.instances[name]
	if !ok {
		return Operation{}, fmt.Errorf("no instance %s/%s", zone, name)
	}
	now := stamp(time.Now())
	in.Status, in.StatusMessage, in.LastStopTimestamp = "TERMINATED", "Instance was preempted.", now
	o := s.newOp(z, OperationTypePreempted, in)
	o.op.Name = fmt.Sprintf("systemevent-%d-%s", time.Now().UnixMilli(), randHex(s.nextID, 13))
	o.op.SelfLink = s.zoneLink(zone) + "/operations/" + o.op.Name
	o.op.User = "system"
	o.op.StatusMessage = "Instance was preempted."
	o.op.Status, o.op.Progress, o.op.StartTime, o.op.EndTime = "DONE", 100, now, now
	s.register(z, o)
	return o.op, nil
}

// Remove deletes an instance without an operation, as the DELETE
// termination action eventually does after a preemption.
func (s *Server) Remove(zone, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if z, ok := s.zones[zone]; ok {
		delete(z.instances, name)
	}
}

// Instance returns a copy of an instance.
func (s *Server) Instance(zone, name string) (Instance, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	z, ok := s.zones[zone]
	if !ok {
		return Instance{}, false
	}
	in, ok := z.instances[name]
	if !ok {
		return Instance{}, false
	}
	return cloneInstance(in), true
}

// Instances returns copies of every instance, ordered by zone and name.
func (s *Server) Instances() []Instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Instance
	for _, zn := range s.zoneOrder {
		z := s.zones[zn]
		for _, name := range slices.Sorted(maps.Keys(z.instances)) {
			out = append(out, cloneInstance(z.instances[name]))
		}
	}
	return out
}

// Operations returns copies of a zone's operations in the order recorded.
func (s *Server) Operations(zone string) []Operation {
	s.mu.Lock()
	defer s.mu.Unlock()
	z, ok := s.zones[zone]
	if !ok {
		return nil
	}
	out := make([]Operation, 0, len(z.ops))
	for _, o := range z.ops {
		out = append(out, o.op)
	}
	return out
}

// Stats returns the request counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// --- handlers ------------------------------------------------------------

// zone resolves the project and zone of a request, writing the 404 the
// real API returns for an unknown one.
func (s *Server) zone(w http.ResponseWriter, r *http.Request) (*zoneState, bool) {
	if !s.checkProject(w, r) {
		return nil, false
	}
	z, ok := s.zones[r.PathValue("zone")]
	if !ok {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/zones/%s' was not found", s.project, r.PathValue("zone")))
		return nil, false
	}
	return z, true
}

// zonal serves h under s.mu once the request's project and zone resolve.
func (s *Server) zonal(h func(w http.ResponseWriter, r *http.Request, z *zoneState)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if z, ok := s.zone(w, r); ok {
			h(w, r, z)
		}
	}
}

func (s *Server) checkProject(w http.ResponseWriter, r *http.Request) bool {
	if p := r.PathValue("project"); p != s.project {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s' was not found", p))
		return false
	}
	return true
}

func (s *Server) listMachineTypes(w http.ResponseWriter, r *http.Request, z *zoneState) {
	listZonal(s, w, r, z, "compute#machineTypeList", "machineTypes", z.mts)
}

func (s *Server) getMachineType(w http.ResponseWriter, r *http.Request, z *zoneState) {
	if mt, ok := zonalItem(s, w, r, z, "machineTypes", "name", findIn((*zoneState).machineType)); ok {
		writeJSON(w, http.StatusOK, mt)
	}
}

// zonalItem finds the item the path's param names in zone z, answering
// GCE's 404 when it is missing. The caller holds s.mu.
func zonalItem[V any](s *Server, w http.ResponseWriter, r *http.Request, z *zoneState, collection, param string, find func(z *zoneState, name string) (V, bool)) (V, bool) {
	name := r.PathValue(param)
	v, ok := find(z, name)
	if !ok {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/zones/%s/%s/%s' was not found", s.project, z.name, collection, name))
	}
	return v, ok
}

// findIn adapts a lookup that answers nil for a missing item to zonalItem.
func findIn[V any](lookup func(*zoneState, string) *V) func(*zoneState, string) (*V, bool) {
	return func(z *zoneState, name string) (*V, bool) {
		v := lookup(z, name)
		return v, v != nil
	}
}

// inMap adapts a per-zone map to zonalItem.
func inMap[V any](m func(*zoneState) map[string]V) func(*zoneState, string) (V, bool) {
	return func(z *zoneState, name string) (V, bool) {
		v, ok := m(z)[name]
		return v, ok
	}
}

func (s *Server) listAcceleratorTypes(w http.ResponseWriter, r *http.Request, z *zoneState) {
	listZonal(s, w, r, z, "compute#acceleratorTypeList", "acceleratorTypes", z.accels)
}

// listZonal answers a zonal list: the zone's items vs, filtered and paged.
func listZonal[V any](s *Server, w http.ResponseWriter, r *http.Request, z *zoneState, kind, collection string, vs []V) {
	items, ok := filterItems(w, r, len(vs), func(i int) any { return vs[i] })
	if !ok {
		return
	}
	s.writeList(w, r, kind, "projects/"+s.project+"/zones/"+z.name+"/"+collection, s.zoneLink(z.name)+"/"+collection, items)
}

// readFirst reads a request body of at most limit bytes before h runs
// (and takes s.mu), answering GCE's parseError when it cannot; h reads the
// body with decodeBody.
func readFirst(limit int64, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, limit))
		if err != nil {
			writeError(w, http.StatusBadRequest, "parseError", "Could not read the request body.")
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		h(w, r)
	}
}

// decodeBody unmarshals the body readFirst read into v, answering GCE's
// parseError when it is not JSON.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	body, _ := io.ReadAll(r.Body) // in memory: readFirst read it
	if err := json.Unmarshal(body, v); err != nil {
		writeError(w, http.StatusBadRequest, "parseError", "Invalid JSON payload received. "+err.Error())
		return false
	}
	return true
}

var (
	nameRE  = regexp.MustCompile(`^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$`)
	uuidRE  = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
	lkeyRE  = regexp.MustCompile(`^[\p{Ll}\p{Lo}][\p{Ll}\p{Lo}\p{N}_-]{0,62}$`)
	lvalRE  = regexp.MustCompile(`^[\p{Ll}\p{Lo}\p{N}_-]{0,63}$`)
	maxMeta = 512 * 1024
)

func (s *Server) insertInstance(w http.ResponseWriter, r *http.Request, z *zoneState) {
	s.stats.InsertCalls++

	reqID := r.URL.Query().Get("requestId")
	if reqID != "" {
		if !uuidRE.MatchString(reqID) || reqID == "00000000-0000-0000-0000-000000000000" {
			writeError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("Invalid value for field 'requestId': '%s'. The requestId must be a valid UUID.", reqID))
			return
		}
		if o, ok := s.requestIDs[z.name+"/"+reqID]; ok {
			// GCE answers a repeated requestId with the original operation.
			s.stats.DedupedInserts++
			writeJSON(w, http.StatusOK, o.op)
			return
		}
	}

	var in Instance
	if !decodeBody(w, r, &in) {
		return
	}
	msg := s.validate(z, &in)
	if msg == "" {
		msg = s.validateNetwork(z, &in)
	}
	if msg != "" {
		writeError(w, http.StatusBadRequest, "invalid", msg)
		return
	}
	if _, exists := z.instances[in.Name]; exists {
		writeError(w, http.StatusConflict, "alreadyExists", fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' already exists", s.project, z.name, in.Name))
		return
	}

	mtName := lastSegment(in.MachineType)
	f := s.takeFault(z.name, mtName)
	if f != nil && f.HTTPStatus != 0 {
		writeError(w, f.HTTPStatus, f.Reason, f.Message)
		return
	}

	s.fill(z, &in)
	for i, rp := range in.ResourcePolicies {
		in.ResourcePolicies[i] = s.absLink(rp) // GCE answers with full URLs
	}
	o := s.newOp(z, "insert", &in)
	if reqID != "" {
		s.requestIDs[z.name+"/"+reqID] = o
	}
	if f != nil {
		errs := slices.Clone(f.OpErrors)
		status := f.OpHTTPStatus
		o.finish = func() {
			o.op.Error = &OperationError{Errors: errs}
			if status != 0 {
				o.op.HTTPErrorStatusCode, o.op.HTTPErrorMessage = status, strings.ToUpper(http.StatusText(status))
			}
		}
	} else {
		z.instances[in.Name] = &in
		s.stats.InstancesCreated++
		inst := &in
		o.finish = func() {
			if inst.Status == "PROVISIONING" || inst.Status == "STAGING" {
				inst.Status, inst.LastStartTimestamp = "RUNNING", stamp(time.Now())
			}
		}
	}
	s.register(z, o)
	writeJSON(w, http.StatusOK, o.op)
}

// takeFault returns the fault that applies to an insert, consuming one
// use of a counted fault.
func (s *Server) takeFault(zone, machineType string) *Fault {
	for _, key := range []string{zone, ""} {
		f, ok := s.faults[key]
		if !ok || (f.MachineType != "" && f.MachineType != machineType) {
			continue
		}
		if f.Count > 0 {
			f.Count--
			if f.Count == 0 {
				delete(s.faults, key)
			}
		}
		return f
	}
	return nil
}

// validate applies the checks of the real API that a provider can get
// wrong; it returns the 400 message, or "".
func (s *Server) validate(z *zoneState, in *Instance) string {
	if !nameRE.MatchString(in.Name) {
		return fmt.Sprintf("Invalid value for field 'resource.name': '%s'. Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'", in.Name)
	}
	if in.MachineType == "" {
		return "Invalid value for field 'resource.machineType': ''. Machine type must be specified."
	}
	mtName := lastSegment(in.MachineType)
	mt := z.machineType(mtName)
	if mt == nil || !strings.Contains(in.MachineType, "zones/"+z.name+"/machineTypes/") {
		return fmt.Sprintf("Invalid value for field 'resource.machineType': '%s'. Machine type with name '%s' does not exist in zone '%s'.", in.MachineType, mtName, z.name)
	}
	boot := 0
	for i, d := range in.Disks {
		if d.Boot {
			boot++
			if d.InitializeParams == nil || d.InitializeParams.SourceImage == "" {
				return fmt.Sprintf("Invalid value for field 'resource.disks[%d].initializeParams.sourceImage': ''. Source image must be specified.", i)
			}
		}
	}
	if boot != 1 {
		return "Invalid value for field 'resource.disks': exactly one boot disk must be specified."
	}
	for k, v := range in.Labels {
		if !lkeyRE.MatchString(k) {
			return fmt.Sprintf("Invalid value for field 'resource.labels': '%s'. Label keys must start with a lowercase letter and contain only lowercase letters, numbers, underscores and dashes (at most 63 characters).", k)
		}
		if !lvalRE.MatchString(v) {
			return fmt.Sprintf("Invalid value for field 'resource.labels': '%s'. Label values must contain only lowercase letters, numbers, underscores and dashes (at most 63 characters).", v)
		}
	}
	if len(in.Labels) > 64 {
		return "Invalid value for field 'resource.labels': at most 64 labels are allowed."
	}
	if in.Metadata != nil {
		size := 0
		for _, it := range in.Metadata.Items {
			size += len(it.Key)
			if it.Value != nil {
				size += len(*it.Value)
			}
		}
		if size > maxMeta {
			return "Invalid value for field 'resource.metadata': metadata exceeds the 512 KB limit."
		}
	}
	gpus := len(mt.Accelerators) > 0
	for i, a := range in.GuestAccelerators {
		name := lastSegment(a.AcceleratorType)
		at := z.acceleratorType(name)
		if at == nil || !strings.Contains(a.AcceleratorType, "zones/"+z.name+"/acceleratorTypes/") {
			return fmt.Sprintf("Invalid value for field 'resource.guestAccelerators[%d].acceleratorType': '%s'. Accelerator type '%s' does not exist in zone '%s'.", i, a.AcceleratorType, name, z.name)
		}
		if a.AcceleratorCount < 1 || a.AcceleratorCount > at.MaximumCardsPerInstance {
			return fmt.Sprintf("Invalid value for field 'resource.guestAccelerators[%d].acceleratorCount': '%d'.", i, a.AcceleratorCount)
		}
		if !strings.HasPrefix(mtName, "n1-") {
			return fmt.Sprintf("Invalid value for field 'resource.guestAccelerators': accelerators cannot be attached to machine type '%s'.", mtName)
		}
		gpus = true
	}
	sc := in.Scheduling
	if sc == nil {
		sc = &Scheduling{}
	}
	spot := sc.ProvisioningModel == "SPOT" || sc.Preemptible
	switch sc.ProvisioningModel {
	case "", "STANDARD", "SPOT":
	default:
		return fmt.Sprintf("Invalid value for field 'resource.scheduling.provisioningModel': '%s'.", sc.ProvisioningModel)
	}
	switch sc.InstanceTerminationAction {
	case "", "STOP", "DELETE":
	default:
		return fmt.Sprintf("Invalid value for field 'resource.scheduling.instanceTerminationAction': '%s'.", sc.InstanceTerminationAction)
	}
	if spot && sc.AutomaticRestart != nil && *sc.AutomaticRestart {
		return "Invalid value for field 'resource.scheduling.automaticRestart': 'true'. Preemptible and Spot instances cannot be automatically restarted."
	}
	ohm := sc.OnHostMaintenance
	if ohm == "" && !spot {
		ohm = "MIGRATE" // the API's default for standard VMs
	}
	if gpus && ohm == "MIGRATE" {
		return "Invalid value for field 'resource.scheduling.onHostMaintenance': 'MIGRATE'. Instances with guest accelerators do not support live migration."
	}
	if spot && sc.OnHostMaintenance == "MIGRATE" {
		return "Invalid value for field 'resource.scheduling.onHostMaintenance': 'MIGRATE'. Spot instances must terminate on host maintenance."
	}
	return ""
}

func (z *zoneState) machineType(name string) *MachineType {
	for i := range z.mts {
		if z.mts[i].Name == name {
			return &z.mts[i]
		}
	}
	return nil
}

func (z *zoneState) acceleratorType(name string) *AcceleratorType {
	for i := range z.accels {
		if z.accels[i].Name == name {
			return &z.accels[i]
		}
	}
	return nil
}

// fill sets the output-only fields GCE adds to an inserted instance.
func (s *Server) fill(z *zoneState, in *Instance) {
	now := stamp(time.Now())
	in.Kind, in.ID, in.CreationTimestamp, in.Status = "compute#instance", Uint64(s.newID()), now, "PROVISIONING"
	in.Zone = s.zoneLink(z.name)
	in.SelfLink = s.zoneLink(z.name) + "/instances/" + in.Name
	in.MachineType = s.zoneLink(z.name) + "/machineTypes/" + lastSegment(in.MachineType)
	in.CPUPlatform = "Unknown CPU Platform"
	in.Fingerprint = fingerprint(in.Name, now)
	in.LabelFingerprint = fingerprint("labels", in.Name)
	if len(in.NetworkInterfaces) == 0 {
		in.NetworkInterfaces = []NetworkInterface{{Network: "global/networks/default"}}
	}
	for i := range in.NetworkInterfaces {
		ni := &in.NetworkInterfaces[i]
		ni.Kind, ni.Name, ni.StackType = "compute#networkInterface", "nic"+strconv.Itoa(i), "IPV4_ONLY"
		ni.Network = s.absLink(ni.Network)
		if ni.Subnetwork != "" {
			ni.Subnetwork = s.absLink(ni.Subnetwork)
		}
		ni.NetworkIP = fmt.Sprintf("10.128.%d.%d", z.nextIP/250, z.nextIP%250+2)
		ni.Fingerprint = fingerprint("nic", in.Name)
		z.nextIP++
	}
	for i := range in.Disks {
		d := &in.Disks[i]
		size := Int64(10)
		if d.InitializeParams != nil && d.InitializeParams.DiskSizeGb > 0 {
			size = d.InitializeParams.DiskSizeGb
		}
		name := in.Name
		if i > 0 {
			name += "-" + strconv.Itoa(i)
		}
		d.Kind, d.Type, d.Mode, d.Index, d.Interface, d.DiskSizeGb = "compute#attachedDisk", "PERSISTENT", "READ_WRITE", i, "SCSI", size
		d.Source, d.DeviceName = s.zoneLink(z.name)+"/disks/"+name, name
		d.InitializeParams = nil // input-only
	}
	if in.Metadata == nil {
		in.Metadata = &Metadata{}
	}
	in.Metadata.Kind, in.Metadata.Fingerprint = "compute#metadata", fingerprint("metadata", in.Name)
	for i := range in.GuestAccelerators {
		in.GuestAccelerators[i].AcceleratorType = s.zoneLink(z.name) + "/acceleratorTypes/" + lastSegment(in.GuestAccelerators[i].AcceleratorType)
	}
	if in.Scheduling == nil {
		in.Scheduling = &Scheduling{}
	}
	sc := in.Scheduling
	if sc.ProvisioningModel == "" {
		sc.ProvisioningModel = "STANDARD"
	}
	if sc.OnHostMaintenance == "" {
		sc.OnHostMaintenance = "MIGRATE"
		if sc.ProvisioningModel == "SPOT" || sc.Preemptible {
			sc.OnHostMaintenance = "TERMINATE"
		}
	}
	if sc.AutomaticRestart == nil {
		restart := sc.ProvisioningModel != "SPOT" && !sc.Preemptible
		sc.AutomaticRestart = &restart
	}
	if sc.ProvisioningModel == "SPOT" && sc.InstanceTerminationAction == "" {
		sc.InstanceTerminationAction = "STOP"
	}
}

func (s *Server) absLink(l string) string {
	if strings.HasPrefix(l, "https://") {
		return l
	}
	if strings.HasPrefix(l, "projects/") {
		return APIBase + l
	}
	return APIBase + "projects/" + s.project + "/" + l
}

func (s *Server) getInstance(w http.ResponseWriter, r *http.Request, z *zoneState) {
	if in, ok := zonalItem(s, w, r, z, "instances", "name", inMap(func(z *zoneState) map[string]*Instance { return z.instances })); ok {
		writeJSON(w, http.StatusOK, in)
	}
}

func (s *Server) deleteInstance(w http.ResponseWriter, r *http.Request, z *zoneState) {
	s.stats.DeleteCalls++
	name := r.PathValue("name")
	in, ok := z.instances[name]
	if !ok {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' was not found", s.project, z.name, name))
		return
	}
	reqID := r.URL.Query().Get("requestId")
	if o, ok := s.requestIDs[z.name+"/"+reqID]; ok && reqID != "" {
		writeJSON(w, http.StatusOK, o.op)
		return
	}
	in.Status = "STOPPING"
	o := s.newOp(z, "delete", in)
	o.finish = func() { delete(z.instances, name) }
	if reqID != "" {
		s.requestIDs[z.name+"/"+reqID] = o
	}
	s.register(z, o)
	writeJSON(w, http.StatusOK, o.op)
}

func (s *Server) listInstances(w http.ResponseWriter, r *http.Request, z *zoneState) {
	var ins []*Instance
	for _, name := range slices.Sorted(maps.Keys(z.instances)) {
		ins = append(ins, z.instances[name])
	}
	listZonal(s, w, r, z, "compute#instanceList", "instances", ins)
}

func (s *Server) aggregatedInstances(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.checkProject(w, r) {
		return
	}
	f, err := parseFilter(r.URL.Query().Get("filter"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", "Invalid value for field 'filter': "+err.Error())
		return
	}
	type hit struct {
		zone string
		in   *Instance
	}
	var hits []hit
	for _, zn := range s.zoneOrder {
		z := s.zones[zn]
		for _, name := range slices.Sorted(maps.Keys(z.instances)) {
			if f.match(toDoc(z.instances[name])) {
				hits = append(hits, hit{zn, z.instances[name]})
			}
		}
	}
	start, end, next, err := page(r, len(hits))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error())
		return
	}
	items := map[string]scopedInstances{}
	for _, h := range hits[start:end] {
		sc := items["zones/"+h.zone]
		sc.Instances = append(sc.Instances, *h.in)
		items["zones/"+h.zone] = sc
	}
	for _, zn := range s.zoneOrder {
		if _, ok := items["zones/"+zn]; !ok {
			items["zones/"+zn] = scopedInstances{Warning: &warning{
				Code: "NO_RESULTS_ON_PAGE", Message: "There are no results for scope 'zones/" + zn + "' on this page.",
				Data: []warningData{{Key: "scope", Value: "zones/" + zn}},
			}}
		}
	}
	raw, _ := json.Marshal(items)
	writeJSON(w, http.StatusOK, listResponse{
		Kind: "compute#instanceAggregatedList", ID: "projects/" + s.project + "/aggregated/instances",
		Items: raw, NextPageToken: next, SelfLink: APIBase + "projects/" + s.project + "/aggregated/instances",
	})
}

func (s *Server) listOperations(w http.ResponseWriter, r *http.Request, z *zoneState) {
	ops := make([]Operation, len(z.ops))
	for i, o := range z.ops {
		ops[i] = o.op
	}
	listZonal(s, w, r, z, "compute#operationList", "operations", ops)
}

func (s *Server) getOperation(w http.ResponseWriter, r *http.Request, z *zoneState) {
	s.pollOperation(w, r, z)
}

// waitOperation is operations.wait. The real one blocks up to two minutes
// for DONE; the fake counts it as one poll and answers at once, so a
// client must loop on a not-yet-DONE answer exactly as it must in reality.
func (s *Server) waitOperation(w http.ResponseWriter, r *http.Request, z *zoneState) {
	s.pollOperation(w, r, z)
}

func (s *Server) pollOperation(w http.ResponseWriter, r *http.Request, z *zoneState) {
	o, ok := zonalItem(s, w, r, z, "operations", "op", inMap(func(z *zoneState) map[string]*opRec { return z.opsByName }))
	if !ok {
		return
	}
	s.stats.OperationPolls++
	if o.op.Status != "DONE" {
		if o.pollsLeft > 0 {
			o.pollsLeft--
		} else {
			s.complete(o)
		}
	}
	writeJSON(w, http.StatusOK, o.op)
}

// --- operations ----------------------------------------------------------

func (s *Server) newOp(z *zoneState, typ string, target *Instance) *opRec {
	now := time.Now()
	id := s.newID()
	name := fmt.Sprintf("operation-%d-%s", now.UnixMilli(), randHex(id, 13))
	return &opRec{
		op: Operation{
			Kind: "compute#operation", ID: Uint64(id), Name: name, Zone: s.zoneLink(z.name),
			OperationType: typ, TargetLink: target.SelfLink, TargetID: target.ID,
			Status: "RUNNING", User: "fleetd-test@" + s.project + ".iam.gserviceaccount.com",
			InsertTime: stamp(now), StartTime: stamp(now), SelfLink: s.zoneLink(z.name) + "/operations/" + name,
		},
		pollsLeft: s.polls,
	}
}

func (s *Server) register(z *zoneState, o *opRec) {
	z.ops = append(z.ops, o)
	z.opsByName[o.op.Name] = o
}

func (s *Server) complete(o *opRec) {
	if o.op.Status == "DONE" {
		return
	}
	o.op.Status, o.op.Progress, o.op.EndTime = "DONE", 100, stamp(time.Now())
	if o.finish != nil {
		o.finish()
		o.finish = nil
	}
}

// --- helpers -------------------------------------------------------------

// filterItems applies the request's filter to n items; on a bad filter it
// writes the 400 and returns false.
func filterItems(w http.ResponseWriter, r *http.Request, n int, item func(int) any) ([]any, bool) {
	f, err := parseFilter(r.URL.Query().Get("filter"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", "Invalid value for field 'filter': "+err.Error())
		return nil, false
	}
	var out []any
	for i := range n {
		if v := item(i); f.match(toDoc(v)) {
			out = append(out, v)
		}
	}
	return out, true
}

// writeList pages items by maxResults/pageToken into a list response.
func (s *Server) writeList(w http.ResponseWriter, r *http.Request, kind, id, self string, items []any) {
	start, end, next, err := page(r, len(items))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error())
		return
	}
	resp := listResponse{Kind: kind, ID: id, SelfLink: self, NextPageToken: next}
	if end > start {
		resp.Items, _ = json.Marshal(items[start:end])
	}
	writeJSON(w, http.StatusOK, resp)
}

// page resolves maxResults (default and cap 500, as in the real API) and
// the opaque pageToken into a slice window and the next token.
func page(r *http.Request, n int) (start, end int, next string, err error) {
	q := r.URL.Query()
	max := 500
	if v := q.Get("maxResults"); v != "" {
		m, err := strconv.Atoi(v)
		if err != nil || m < 0 {
			return 0, 0, "", fmt.Errorf("Invalid value for field 'maxResults': '%s'.", v)
		}
		if m > 0 && m < max {
			max = m
		}
	}
	if tok := q.Get("pageToken"); tok != "" {
		b, err := base64.RawURLEncoding.DecodeString(tok)
		if err == nil {
			start, err = strconv.Atoi(strings.TrimPrefix(string(b), "offset:"))
		}
		if err != nil || start < 0 || start > n {
			return 0, 0, "", fmt.Errorf("Invalid value for field 'pageToken': '%s'.", tok)
		}
	}
	end = min(start+max, n)
	if end < n {
		next = base64.RawURLEncoding.EncodeToString([]byte("offset:" + strconv.Itoa(end)))
	}
	return start, end, next, nil
}

func toDoc(v any) map[string]any {
	b, _ := json.Marshal(v)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	return m
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, reason, msg string) {
	writeJSON(w, status, errorBody{Error: errorDetail{
		Code: status, Message: msg, Errors: []errorItem{{Message: msg, Domain: "global", Reason: reason}},
	}})
}

// stamp formats a time as the API does: RFC 3339 with milliseconds, in
// Pacific time with a numeric offset (so clients must parse offsets).
func stamp(t time.Time) string {
	return t.In(time.FixedZone("PDT", -7*3600)).Format("2006-01-02T15:04:05.000-07:00")
}

func fingerprint(parts ...string) string {
	h := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return base64.StdEncoding.EncodeToString(h[:8])
}

func randHex(seed uint64, n int) string {
	h := sha256.Sum256([]byte(strconv.FormatUint(seed, 10)))
	return hex.EncodeToString(h[:])[:n]
}

func lastSegment(s string) string {
	if i := strings.LastIndexByte(s, '/'); i >= 0 {
		return s[i+1:]
	}
	return s
}

func cloneInstance(in *Instance) Instance {
	var out Instance
	b, _ := json.Marshal(in)
	_ = json.Unmarshal(b, &out)
	return out
}
