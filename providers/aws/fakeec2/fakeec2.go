// Package fakeec2 is an in-process EC2 endpoint for tests: an http.Handler
// that speaks the EC2 Query protocol (form-encoded POST, Action=…,
// Version=2016-11-15, XML responses in the 2016-11-15 namespace, errors as
// <Response><Errors><Error>…) closely enough that the real aws-sdk-go-v2 EC2
// client, pointed at it with BaseEndpoint, cannot tell the difference for
// the calls fleetd makes.
//
// One Server holds every region; the region of a request is read from the
// SigV4 credential scope of its Authorization header, exactly the region
// the SDK client was built for. Knobs make it misbehave the way EC2 does:
// capacity per (zone, type), vCPU quotas, throttling, scripted errors,
// eventual consistency after launch, small pages and spot interruptions.
package fakeec2

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// APIVersion is the only EC2 API version the fake accepts.
const APIVersion = "2016-11-15"

// Options configures a Server. The zero value serves any region with zones
// REGION+"a", "b", "c" and DefaultInstanceTypes.
type Options struct {
	// Regions maps a region to its zones. Nil: every region exists, with
	// three zones. Non-nil: other regions fail with AuthFailure, as an
	// opted-out region does.
	Regions map[string][]string
	// InstanceTypes is the catalogue; default DefaultInstanceTypes.
	InstanceTypes []InstanceType
	// PageSize caps every Describe page (EC2 may return fewer results than
	// MaxResults); 0 means 1000.
	PageSize int
	// OwnerID is the account id in reservations; default "123456789012".
	OwnerID string
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Server is the fake EC2 endpoint. Use it with httptest.NewServer(s). It is
// safe for concurrent use.
type Server struct {
	opts Options
	now  func() time.Time

	mu       sync.Mutex
	seq      uint64
	types    map[string]InstanceType
	regions  map[string]*region
	pageSize int
	throttle int
	scripted map[string][]scriptedError
	calls    map[string]int
	last     map[string]url.Values
	lastKey  map[string]string
	hideNext int
	denied   map[string]bool
	// groupCap: placement group name → launches left (SetGroupCapacity).
	groupCap map[string]int
}

type scriptedError struct{ code, message string }

type region struct {
	name     string
	zones    []string
	prices   []spotPrice
	inst     map[string]*instance
	order    []string // instance ids in launch order
	tokens   map[string]*tokenRecord
	spot     map[string]*spotRequest
	spotIDs  []string
	capacity map[string]int // zone|type → launches left
	quota    map[string]int // market → vCPU limit
	subnets  map[string]string
	// subnetVPC: subnet id → its VPC when not DefaultVPC (AddSubnetInVPC);
	// noDefaultVPC: the region has no default VPC (RemoveDefaultVPC).
	subnetVPC    map[string]string
	noDefaultVPC bool
	noImages     map[string]bool
	// notOffered: zone|type pairs the zone does not offer.
	notOffered map[string]bool
	// scores: zone|type → spot placement score set by a test.
	scores map[string]int
	// groups: the security group ids that exist (AddSecurityGroup).
	groups map[string]bool
	// selfRule: groups that allow all traffic from and to themselves (AllowSelf).
	selfRule map[string]bool
	// pgroups: placement groups by name.
	pgroups map[string]*placementGroup
}

type spotPrice struct {
	zone, typ, product string
	price              float64
	at                 time.Time
}

type tokenRecord struct {
	canonical   string
	reservation string
	ids         []string
}

type instance struct {
	id, reservation, imageID, typ, zone, subnet, keyName, profile, token string
	market, sir, privateIP                                               string
	metaTokens, metaEndpoint                                             string
	metaHops                                                             int
	groups                                                               []string
	tags                                                                 map[string]string
	userData                                                             []byte
	state                                                                string // pending running shutting-down terminated
	reason                                                               string
	launched, stateAt                                                    time.Time
	hidden                                                               int
	// pgroup is the placement group it was launched into; nics its
	// interfaces when the launch named them.
	pgroup string
	nics   []nic
	// terminatedBy is the access key id of the TerminateInstances call
	// that ended it ("" for reclaims and other cloud-side ends).
	terminatedBy string
}

type spotRequest struct {
	id, instanceID, zone, typ, state, code, message string
	created, updated                                time.Time
	terminateAt                                     time.Time // zero: no reclaim scheduled
	tags                                            map[string]string
}

// New returns a Server.
func New(opts Options) *Server {
	if opts.OwnerID == "" {
		opts.OwnerID = "123456789012"
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	types := opts.InstanceTypes
	if types == nil {
		types = DefaultInstanceTypes
	}
	s := &Server{
		opts:     opts,
		now:      now,
		types:    map[string]InstanceType{},
		regions:  map[string]*region{},
		pageSize: opts.PageSize,
		scripted: map[string][]scriptedError{},
		calls:    map[string]int{},
		last:     map[string]url.Values{},
		lastKey:  map[string]string{},
	}
	for _, t := range types {
		s.types[t.Name] = t
	}
	return s
}

// regionLocked returns (creating on first use) the state of region name, or
// nil when Options.Regions does not list it.
func (s *Server) regionLocked(name string) *region {
	if r, ok := s.regions[name]; ok {
		return r
	}
	var zones []string
	if s.opts.Regions != nil {
		z, ok := s.opts.Regions[name]
		if !ok {
			return nil
		}
		zones = slices.Clone(z)
	} else {
		zones = []string{name + "a", name + "b", name + "c"}
	}
	r := &region{
		name: name, zones: zones,
		inst: map[string]*instance{}, tokens: map[string]*tokenRecord{}, spot: map[string]*spotRequest{},
		capacity: map[string]int{}, quota: map[string]int{}, subnets: map[string]string{}, noImages: map[string]bool{},
		notOffered: map[string]bool{}, scores: map[string]int{}, groups: map[string]bool{},
	}
	// Seed two history points per (zone, type): an hour-old one and a
	// current one, so a client must pick the latest, not the first.
	at := s.now().Add(-time.Hour).UTC().Truncate(time.Second)
	for zi, z := range zones {
		for _, name := range s.typeNames() {
			t := s.types[name]
			cur := roundPrice(t.SpotPrice * (1 + 0.05*float64(zi)))
			r.prices = append(r.prices,
				spotPrice{zone: z, typ: name, product: "Linux/UNIX", price: roundPrice(cur * 1.2), at: at.Add(-time.Hour)},
				spotPrice{zone: z, typ: name, product: "Linux/UNIX", price: cur, at: at},
				spotPrice{zone: z, typ: name, product: "Windows", price: roundPrice(cur * 1.8), at: at},
			)
		}
	}
	s.regions[name] = r
	return r
}

func roundPrice(p float64) float64 { return float64(int64(p*10000+0.5)) / 10000 }

func (s *Server) typeNames() []string {
	names := make([]string, 0, len(s.types))
	for n := range s.types {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// regionOfZoneLocked finds the region a zone belongs to.
func (s *Server) regionOfZoneLocked(zone string) *region {
	for name, zones := range s.opts.Regions {
		if slices.Contains(zones, zone) {
			return s.regionLocked(name)
		}
	}
	if s.opts.Regions == nil && len(zone) > 1 {
		return s.regionLocked(zone[:len(zone)-1])
	}
	return nil
}

// ---- knobs ----

// SetCapacity sets how many more instances of instanceType can be launched
// in zone (spot and on-demand alike); launches beyond it fail with
// InsufficientInstanceCapacity. A negative n means unlimited (the default).
// Terminating an instance gives its capacity back.
func (s *Server) SetCapacity(zone, instanceType string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.regionOfZoneLocked(zone)
	if r == nil {
		panic("fakeec2: unknown zone " + zone)
	}
	if n < 0 {
		delete(r.capacity, zone+"|"+instanceType)
		return
	}
	r.capacity[zone+"|"+instanceType] = n
}

// Market names for SetVCPUQuota.
const (
	MarketSpot     = "spot"
	MarketOnDemand = "on-demand"
)

// SetVCPUQuota limits the vCPUs of live instances of one market in region.
// A launch past it fails with VcpuLimitExceeded (on-demand) or
// MaxSpotInstanceCountExceeded (spot), as EC2's vCPU-based limits do. A
// negative limit removes it.
func (s *Server) SetVCPUQuota(regionName, market string, vcpus int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.regionLocked(regionName)
	if vcpus < 0 {
		delete(r.quota, market)
		return
	}
	r.quota[market] = vcpus
}

// SetSpotPrice records a Linux/UNIX spot price for (zone, type) at time at.
func (s *Server) SetSpotPrice(zone, instanceType string, price float64, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.regionOfZoneLocked(zone)
	if r == nil {
		panic("fakeec2: unknown zone " + zone)
	}
	r.prices = append(r.prices, spotPrice{zone: zone, typ: instanceType, product: "Linux/UNIX", price: price, at: at.UTC()})
}

// AddSubnet registers a subnet in zone. RunInstances with an unknown
// SubnetId fails with InvalidSubnetID.NotFound.
func (s *Server) AddSubnet(id, zone string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.regionOfZoneLocked(zone)
	if r == nil {
		panic("fakeec2: unknown zone " + zone)
	}
	r.subnets[id] = zone
}

// RemoveImage makes an AMI id unknown in region (InvalidAMIID.NotFound).
// Every well-formed ami-… id exists otherwise.
func (s *Server) RemoveImage(regionName, imageID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.regionLocked(regionName).noImages[imageID] = true
}

// Throttle makes the next n requests, whatever their action, fail with
// RequestLimitExceeded (HTTP 503).
func (s *Server) Throttle(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.throttle = n
}

// FailNext makes the next n calls of action fail with code. The HTTP status
// is EC2's for the code (5xx for server-side capacity and availability
// errors, 503 for throttling, 400 otherwise).
func (s *Server) FailNext(action, code, message string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.scripted[action] = append(s.scripted[action], scriptedError{code: code, message: message})
	}
}

// SetConsistencyDelay makes instances launched from now on invisible to
// the next n DescribeInstances and TerminateInstances calls of their
// region (they answer InvalidInstanceID.NotFound or leave them out), as
// EC2's eventual consistency does right after RunInstances.
func (s *Server) SetConsistencyDelay(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hideNext = n
}

// SetPageSize caps every Describe page at n results (n <= 0: 1000).
func (s *Server) SetPageSize(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pageSize = n
}

// InterruptSpot marks the spot request of instance id for termination
// (status marked-for-termination, as during EC2's two-minute warning). The
// instance is reclaimed terminateAfter later; a negative terminateAfter
// leaves it running until Reclaim.
func (s *Server) InterruptSpot(id string, terminateAfter time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	in, r := s.findLocked(id)
	if in == nil {
		return fmt.Errorf("fakeec2: no instance %s", id)
	}
	sr := r.spot[in.sir]
	if sr == nil {
		return fmt.Errorf("fakeec2: %s is not a spot instance", id)
	}
	now := s.now().UTC()
	sr.code, sr.message, sr.updated = "marked-for-termination", "Your Spot Instance is marked to be terminated.", now
	if terminateAfter >= 0 {
		sr.terminateAt = now.Add(terminateAfter)
	}
	return nil
}

// Reclaim terminates spot instance id as EC2 does when it takes the
// capacity back.
func (s *Server) Reclaim(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	in, r := s.findLocked(id)
	if in == nil {
		return fmt.Errorf("fakeec2: no instance %s", id)
	}
	s.reclaimLocked(r, in, s.now().UTC())
	return nil
}

func (s *Server) reclaimLocked(r *region, in *instance, now time.Time) {
	if sr := r.spot[in.sir]; sr != nil {
		sr.state, sr.code, sr.message, sr.updated = "closed", "instance-terminated-by-no-capacity", "Spot Instance terminated due to no available capacity.", now
		sr.terminateAt = time.Time{}
	}
	s.terminateLocked(r, in, "Server.SpotInstanceTermination", now)
}

func (s *Server) findLocked(id string) (*instance, *region) {
	for _, r := range s.regions {
		if in, ok := r.inst[id]; ok {
			return in, r
		}
	}
	return nil, nil
}

// Calls returns how many requests of action the server has answered
// (errors included).
func (s *Server) Calls(action string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[action]
}

// LastRequest returns the form parameters of the last request of action.
func (s *Server) LastRequest(action string) url.Values {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last[action]
}

// LastAccessKeyID returns the access key id that signed the last request
// of action (from its SigV4 credential scope).
func (s *Server) LastAccessKeyID(action string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastKey[action]
}

// Instance is a test's view of one fake instance.
type Instance struct {
	ID, Region, Zone, InstanceType, State string
	Market                                string // spot or on-demand
	ImageID, SubnetID, KeyName            string
	IamInstanceProfile                    string
	SecurityGroups                        []string
	UserData                              []byte // decoded
	Tags                                  map[string]string
	ClientToken                           string
	SpotRequestStatus                     string // status code of its spot request
	// TerminatedBy is the access key id that terminated it through the
	// API, so a test can tell which of several clients ended it.
	TerminatedBy string
	// PlacementGroup is the group it was launched into; Interfaces its
	// network interfaces as "card/device:type" when the launch named them.
	PlacementGroup string
	Interfaces     []string
}

// Instances returns every instance of every region (terminated ones
// included) in launch order.
func (s *Server) Instances() []Instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now().UTC()
	var out []Instance
	names := make([]string, 0, len(s.regions))
	for n := range s.regions {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		r := s.regions[n]
		s.advanceLocked(r, now)
		for _, id := range r.order {
			in := r.inst[id]
			v := Instance{
				ID: in.id, Region: r.name, Zone: in.zone, InstanceType: in.typ, State: in.state, Market: in.market,
				ImageID: in.imageID, SubnetID: in.subnet, KeyName: in.keyName, IamInstanceProfile: in.profile,
				SecurityGroups: slices.Clone(in.groups), UserData: slices.Clone(in.userData),
				Tags: map[string]string{}, ClientToken: in.token, TerminatedBy: in.terminatedBy,
				PlacementGroup: in.pgroup,
			}
			for _, x := range in.nics {
				v.Interfaces = append(v.Interfaces, fmt.Sprintf("%d/%d:%s", x.card, x.device, x.typ))
			}
			for k, val := range in.tags {
				v.Tags[k] = val
			}
			if sr := r.spot[in.sir]; sr != nil {
				v.SpotRequestStatus = sr.code
			}
			out = append(out, v)
		}
	}
	return out
}

// Live returns the instances that are not shutting down or terminated.
func (s *Server) Live() []Instance {
	return slices.DeleteFunc(s.Instances(), func(in Instance) bool {
		return in.State == "terminated" || in.State == "shutting-down"
	})
}

// ---- HTTP ----

// ServeHTTP answers one EC2 Query request.
func (s *Server) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	requestID := s.newRequestID()
	if target := req.Header.Get("X-Amz-Target"); strings.HasPrefix(target, "ServiceQuotasV20190624.") {
		s.serveServiceQuotas(w, req, target)
		return
	}
	if req.Method != http.MethodPost {
		writeError(w, requestID, &apiError{Code: "InvalidAction", Message: "The EC2 Query API takes POST requests in this fake."})
		return
	}
	if err := req.ParseForm(); err != nil {
		writeError(w, requestID, &apiError{Code: "MalformedQueryString", Message: err.Error()})
		return
	}
	p := params(req.PostForm)
	action := p.get("Action")
	accessKey, regionName, err := signingScope(req.Header.Get("Authorization"))
	if err != nil {
		writeError(w, requestID, &apiError{Code: "AuthFailure", Message: err.Error()})
		return
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[action]++
	s.last[action] = url.Values(p)
	s.lastKey[action] = accessKey
	resp, apiErr := s.dispatchLocked(regionName, action, p)
	if apiErr != nil {
		writeError(w, requestID, apiErr)
		return
	}
	resp.head().RequestID = requestID
	var buf bytes.Buffer
	buf.WriteString(xml.Header)
	start := xml.StartElement{Name: xml.Name{Local: action + "Response"}, Attr: []xml.Attr{{Name: xml.Name{Local: "xmlns"}, Value: Namespace}}}
	if err := xml.NewEncoder(&buf).EncodeElement(resp, start); err != nil {
		writeError(w, requestID, &apiError{Code: "InternalError", Message: err.Error()})
		return
	}
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(buf.Bytes())
}

// actions are the EC2 Query actions the fake serves, each answering with
// a body that ServeHTTP opens with the action's xmlHead.
var actions = map[string]func(*Server, *region, params) (answer, *apiError){
	"DescribeImages":                (*Server).describeImages,
	"DescribeSubnets":               (*Server).describeSubnets,
	"DescribeVpcs":                  (*Server).describeVpcs,
	"DescribeSecurityGroups":        (*Server).describeSecurityGroups,
	"CreateTags":                    (*Server).createTags,
	"DescribeInstanceTypes":         (*Server).describeInstanceTypes,
	"DescribeSpotPriceHistory":      (*Server).describeSpotPriceHistory,
	"DescribeInstanceTypeOfferings": (*Server).describeInstanceTypeOfferings,
	"GetSpotPlacementScores":        (*Server).getSpotPlacementScores,
	"DescribeAvailabilityZones":     (*Server).describeAvailabilityZones,
	"RunInstances":                  (*Server).runInstances,
	"DescribeInstances":             (*Server).describeInstances,
	"TerminateInstances":            (*Server).terminateInstances,
	"DescribeSpotInstanceRequests":  (*Server).describeSpotInstanceRequests,
	"CreatePlacementGroup":          (*Server).createPlacementGroup,
	"DescribePlacementGroups":       (*Server).describePlacementGroups,
	"DeletePlacementGroup":          (*Server).deletePlacementGroup,
}

// createTags answers only dry runs (preflightLocked); a real tagging
// call is refused.
func (s *Server) createTags(*region, params) (answer, *apiError) {
	return nil, &apiError{Code: "InvalidAction", Message: "CreateTags is served only as a dry run by this fake."}
}

func (s *Server) dispatchLocked(regionName, action string, p params) (answer, *apiError) {
	if v := p.get("Version"); v != APIVersion {
		return nil, &apiError{Code: "InvalidParameterValue", Message: fmt.Sprintf("Version %q is not supported by this fake (want %s).", v, APIVersion)}
	}
	if s.throttle > 0 {
		s.throttle--
		return nil, &apiError{Code: "RequestLimitExceeded", Message: "Request limit exceeded."}
	}
	if q := s.scripted[action]; len(q) > 0 {
		s.scripted[action] = q[1:]
		return nil, &apiError{Code: q[0].code, Message: q[0].message}
	}
	r := s.regionLocked(regionName)
	if r == nil {
		return nil, &apiError{Code: "AuthFailure", Message: fmt.Sprintf("AWS was not able to validate the provided access credentials (region %s is not enabled).", regionName)}
	}
	s.advanceLocked(r, s.now().UTC())
	if e := s.preflightLocked(r, action, p); e != nil {
		return nil, e
	}
	if handle, ok := actions[action]; ok {
		return handle(s, r, p)
	}
	return nil, &apiError{Code: "InvalidAction", Message: fmt.Sprintf("The action %s is not valid for this web service.", action)}
}

// signingScope reads the access key id and region from a SigV4
// Authorization header:
// "AWS4-HMAC-SHA256 Credential=AKID/20260101/us-east-1/ec2/aws4_request, …".
// The signature itself is not checked.
func signingScope(auth string) (accessKey, region string, err error) {
	const prefix = "AWS4-HMAC-SHA256 "
	if !strings.HasPrefix(auth, prefix) {
		return "", "", fmt.Errorf("request is not signed with SigV4")
	}
	for _, part := range strings.Split(strings.TrimPrefix(auth, prefix), ",") {
		part = strings.TrimSpace(part)
		cred, ok := strings.CutPrefix(part, "Credential=")
		if !ok {
			continue
		}
		scope := strings.Split(cred, "/")
		if len(scope) != 5 || scope[3] != "ec2" || scope[4] != "aws4_request" {
			return "", "", fmt.Errorf("malformed credential scope %q", cred)
		}
		return scope[0], scope[2], nil
	}
	return "", "", fmt.Errorf("no Credential in the Authorization header")
}

func (s *Server) newRequestID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	return fmt.Sprintf("%08x-0000-4000-8000-%012x", s.seq, s.seq)
}

func (s *Server) nextIDLocked(prefix string, width int) string {
	s.seq++
	return fmt.Sprintf("%s-%0*x", prefix, width, s.seq)
}

// apiError is an EC2 error response.
type apiError struct {
	Code, Message string
}

// statusFor is the HTTP status EC2 answers an error code with: capacity
// and internal problems are server errors (5xx), throttling 503, auth 401
// and 403, everything else a 400 client error.
func statusFor(code string) int {
	switch code {
	case "InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientHostCapacity",
		"InsufficientReservedInstanceCapacity", "InsufficientAddressCapacity", "InternalError", "InternalFailure":
		return http.StatusInternalServerError
	case "RequestLimitExceeded", "ServiceUnavailable", "Unavailable":
		return http.StatusServiceUnavailable
	case "AuthFailure":
		return http.StatusUnauthorized
	case "UnauthorizedOperation", "Blocked":
		return http.StatusForbidden
	case "DryRunOperation":
		// EC2 answers a permitted dry run with HTTP 412 and this code.
		return http.StatusPreconditionFailed
	}
	return http.StatusBadRequest
}

func writeError(w http.ResponseWriter, requestID string, e *apiError) {
	var buf bytes.Buffer
	buf.WriteString(xml.Header)
	_ = xml.NewEncoder(&buf).Encode(xmlErrorResponse{Errors: []xmlError{{Code: e.Code, Message: e.Message}}, RequestID: requestID})
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(statusFor(e.Code))
	_, _ = w.Write(buf.Bytes())
}

// ---- time-driven transitions ----

// advanceLocked applies what happened since the last request: pending
// instances run, shutting-down ones are gone, scheduled spot reclaims fire.
func (s *Server) advanceLocked(r *region, now time.Time) {
	for _, id := range r.order {
		in := r.inst[id]
		if sr := r.spot[in.sir]; sr != nil && !sr.terminateAt.IsZero() && !now.Before(sr.terminateAt) {
			s.reclaimLocked(r, in, now)
		}
	}
}

// observeLocked moves an instance one step along its lifecycle the first
// time a Describe call sees it after the step was due: pending → running
// and shutting-down → terminated happen between calls, never inside the
// call that caused them, as in EC2.
func observeLocked(in *instance, now time.Time) {
	if !now.After(in.stateAt) {
		return
	}
	switch in.state {
	case "pending":
		in.state, in.stateAt = "running", now
	case "shutting-down":
		in.state, in.stateAt = "terminated", now
	}
}

func (s *Server) terminateLocked(r *region, in *instance, reason string, now time.Time) {
	if in.state == "terminated" || in.state == "shutting-down" {
		return
	}
	in.state, in.stateAt, in.reason = "shutting-down", now, reason
	if n, ok := r.capacity[in.zone+"|"+in.typ]; ok {
		r.capacity[in.zone+"|"+in.typ] = n + 1
	}
	if sr := r.spot[in.sir]; sr != nil && sr.state == "active" {
		sr.state, sr.code, sr.message, sr.updated = "closed", "instance-terminated-by-user", "Spot Instance terminated due to user-initiated termination.", now
	}
}

var stateCodes = map[string]int{"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48, "stopping": 64, "stopped": 80}

func xmlStateOf(name string) xmlState { return xmlState{Code: stateCodes[name], Name: name} }

func timestamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }
