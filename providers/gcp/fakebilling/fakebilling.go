// Package fakebilling is an in-process fake of the Cloud Billing Catalog
// API (cloudbilling.googleapis.com v1) for tests: it serves
// `GET /v1/services/{service}/skus` in the wire format the real service
// uses, so the real Go client (google.golang.org/api/cloudbilling/v1),
// pointed at it with option.WithEndpoint, works unchanged.
//
// What it speaks:
//   - SKUs as the API returns them: name, skuId, description, category
//     {serviceDisplayName, resourceFamily, resourceGroup, usageType},
//     serviceRegions, pricingInfo[] {effectiveTime, summary,
//     pricingExpression {usageUnit, usageUnitDescription, baseUnit,
//     baseUnitDescription, baseUnitConversionFactor, displayQuantity,
//     tieredRates[] {startUsageAmount, unitPrice {currencyCode, units (a
//     string), nanos}}}, aggregationInfo, currencyConversionRate},
//     serviceProviderName, geoTaxonomy.
//   - Paging: pageSize (the real default and maximum is 5000; the fake's
//     maximum is Options.MaxPageSize, so tests see several pages) and an
//     opaque nextPageToken; a token it did not issue is 400
//     INVALID_ARGUMENT.
//   - Credentials as the client sends them: an API key as the `key` query
//     parameter (option.WithAPIKey), or OAuth as `Authorization: Bearer`.
//     With Options.APIKey or Options.Token set, a call without them is
//     403 PERMISSION_DENIED ("unregistered callers"), a wrong key 400
//     API_KEY_INVALID and a wrong token 401 UNAUTHENTICATED, as the real
//     API answers.
//   - Errors in the google.rpc.Status JSON shape ({"error": {code,
//     message, status, details: [{@type: …ErrorInfo, reason, domain,
//     metadata}]}}), e.g. SERVICE_DISABLED when the Cloud Billing API is
//     off in the caller's project (SetDisabled).
//
// Only USD is served (currencyCode other than USD is 400); the fields
// parameter (partial responses) is accepted and ignored: the fake always
// answers every field, which a client asking for fewer must tolerate.
package fakebilling

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleetd/providers/internal/failscript"
)

// ComputeEngine is the service id of Compute Engine in the catalog.
const ComputeEngine = "6F81-5844-456A"

// EffectiveTime is the effectiveTime of every SKU's pricing info.
var EffectiveTime = time.Date(2026, 11, 1, 8, 0, 0, 0, time.UTC)

// Options configures a fake.
type Options struct {
	// APIKey and Token, when set, are the credentials the fake accepts
	// (`key=` or `Authorization: Bearer`); when both are empty any caller
	// is served.
	APIKey, Token string
	// MaxPageSize caps pageSize (default 100).
	MaxPageSize int
}

// Server is a running fake. Its methods are safe for concurrent use.
type Server struct {
	// URL is the endpoint to give the client (option.WithEndpoint).
	URL string

	opts Options
	srv  *httptest.Server

	mu       sync.Mutex
	skus     []SKU
	nextID   int
	script   failscript.Queue[rpcError]
	disabled bool
	last     Request
}

// Request is what the fake saw of one call.
type Request struct {
	Path     string
	Query    map[string]string // first value of each parameter
	APIKey   string            // the key parameter
	Bearer   string            // the Authorization bearer token
	PageSize int
}

// New starts a fake on a loopback port with no SKUs. Close it when done.
func New(opts Options) *Server {
	if opts.MaxPageSize <= 0 {
		opts.MaxPageSize = 100
	}
	s := &Server{opts: opts}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/services/{service}/skus", s.listSkus)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, rpcError{http.StatusNotFound, "NOT_FOUND", "", "The requested URL " + r.URL.Path + " was not found on this server."})
	})
	s.srv = httptest.NewServer(mux)
	s.URL = s.srv.URL
	return s
}

// Close stops the fake.
func (s *Server) Close() { s.srv.Close() }

// SKU is one catalog entry as the API returns it.
type SKU struct {
	Name                string        `json:"name"`
	SkuID               string        `json:"skuId"`
	Description         string        `json:"description"`
	Category            Category      `json:"category"`
	ServiceRegions      []string      `json:"serviceRegions"`
	PricingInfo         []PricingInfo `json:"pricingInfo"`
	ServiceProviderName string        `json:"serviceProviderName"`
	GeoTaxonomy         *GeoTaxonomy  `json:"geoTaxonomy,omitempty"`
}

// Category is a SKU's category.
type Category struct {
	ServiceDisplayName string `json:"serviceDisplayName"`
	ResourceFamily     string `json:"resourceFamily"`
	ResourceGroup      string `json:"resourceGroup"`
	UsageType          string `json:"usageType"`
}

// PricingInfo is one version of a SKU's price.
type PricingInfo struct {
	EffectiveTime          string            `json:"effectiveTime"`
	Summary                string            `json:"summary"`
	PricingExpression      PricingExpression `json:"pricingExpression"`
	AggregationInfo        *AggregationInfo  `json:"aggregationInfo,omitempty"`
	CurrencyConversionRate float64           `json:"currencyConversionRate"`
}

// PricingExpression says how usage is priced.
type PricingExpression struct {
	UsageUnit                string     `json:"usageUnit"`
	UsageUnitDescription     string     `json:"usageUnitDescription"`
	BaseUnit                 string     `json:"baseUnit"`
	BaseUnitDescription      string     `json:"baseUnitDescription"`
	BaseUnitConversionFactor float64    `json:"baseUnitConversionFactor"`
	DisplayQuantity          float64    `json:"displayQuantity"`
	TieredRates              []TierRate `json:"tieredRates"`
}

// TierRate is the price from StartUsageAmount on.
type TierRate struct {
	StartUsageAmount float64 `json:"startUsageAmount"`
	UnitPrice        Money   `json:"unitPrice"`
}

// Money is google.type.Money: units travel as a JSON string (int64).
type Money struct {
	CurrencyCode string `json:"currencyCode"`
	Units        string `json:"units"`
	Nanos        int64  `json:"nanos"`
}

// AggregationInfo is how usage is aggregated.
type AggregationInfo struct {
	AggregationLevel    string `json:"aggregationLevel"`
	AggregationInterval string `json:"aggregationInterval"`
	AggregationCount    int    `json:"aggregationCount"`
}

// GeoTaxonomy is where a SKU applies.
type GeoTaxonomy struct {
	Type    string   `json:"type"`
	Regions []string `json:"regions"`
}

// USD is a price as google.type.Money.
func USD(v float64) Money {
	units := math.Floor(v)
	nanos := math.Round((v - units) * 1e9)
	if nanos >= 1e9 {
		units, nanos = units+1, 0
	}
	return Money{CurrencyCode: "USD", Units: strconv.FormatInt(int64(units), 10), Nanos: int64(nanos)}
}

// Unit is a usage unit of the catalog.
type Unit string

// Units of Compute Engine SKUs.
const (
	Hour       Unit = "h"      // vCPUs, GPUs
	GiBHour    Unit = "GiBy.h" // memory
	GiBMonth   Unit = "GiBy.mo"
	GiBTraffic Unit = "GiBy"
)

var unitDesc = map[Unit][4]any{ // usage description, base unit, base description, factor
	Hour:       {"hour", "s", "second", 3600.0},
	GiBHour:    {"gibibyte hour", "By.s", "byte second", 3865470566400.0},
	GiBMonth:   {"gibibyte month", "By.s", "byte second", 2.8759101014016e15},
	GiBTraffic: {"gibibyte", "By", "byte", 1073741824.0},
}

// Add appends one SKU of Compute Engine and returns its skuId. family is
// the category's resourceFamily ("Compute", "Storage", "Network"), group
// its resourceGroup ("CPU", "RAM", "GPU", "N1Standard", …) and usage its
// usageType ("OnDemand", "Preemptible", "Commit1Yr", …).
func (s *Server) Add(description, family, group, usage string, regions []string, unit Unit, usd float64) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextID++
	id := fmt.Sprintf("%04X-%04X-%04X", 0x1000+s.nextID, (s.nextID*2654435761)&0xFFFF, (s.nextID*40503)&0xFFFF)
	d := unitDesc[unit]
	pi := PricingInfo{
		EffectiveTime: EffectiveTime.Format("2006-01-02T15:04:05.000000Z"),
		PricingExpression: PricingExpression{
			UsageUnit: string(unit), UsageUnitDescription: d[0].(string), BaseUnit: d[1].(string),
			BaseUnitDescription: d[2].(string), BaseUnitConversionFactor: d[3].(float64), DisplayQuantity: 1,
			TieredRates: []TierRate{{StartUsageAmount: 0, UnitPrice: USD(usd)}},
		},
		AggregationInfo:        &AggregationInfo{AggregationLevel: "ACCOUNT", AggregationInterval: "DAILY", AggregationCount: 1},
		CurrencyConversionRate: 1,
	}
	geo := "REGIONAL"
	if len(regions) > 1 {
		geo = "MULTI_REGIONAL"
	}
	s.skus = append(s.skus, SKU{
		Name: "services/" + ComputeEngine + "/skus/" + id, SkuID: id, Description: description,
		Category:       Category{ServiceDisplayName: "Compute Engine", ResourceFamily: family, ResourceGroup: group, UsageType: usage},
		ServiceRegions: append([]string(nil), regions...), PricingInfo: []PricingInfo{pi},
		ServiceProviderName: "Google", GeoTaxonomy: &GeoTaxonomy{Type: geo, Regions: append([]string(nil), regions...)},
	})
	return id
}

// AddSeries adds the on-demand and Spot vCPU and memory SKUs of a machine
// series as the catalog names them: "<series> Core running in <location>",
// "<series> Ram running in <location>", and the same prefixed "Spot
// Preemptible " with usageType Preemptible. series is the SKU name, e.g.
// "A2 Instance", "N1 Predefined Instance" (whose SKUs sit in resourceGroup
// N1Standard; every other series' in CPU and RAM).
func (s *Server) AddSeries(series, location string, regions []string, coreOD, ramOD, coreSpot, ramSpot float64) {
	cpuGroup, ramGroup := "CPU", "RAM"
	if strings.HasPrefix(series, "N1 ") {
		cpuGroup, ramGroup = "N1Standard", "N1Standard"
	}
	s.Add(series+" Core running in "+location, "Compute", cpuGroup, "OnDemand", regions, Hour, coreOD)
	s.Add(series+" Ram running in "+location, "Compute", ramGroup, "OnDemand", regions, GiBHour, ramOD)
	s.Add("Spot Preemptible "+series+" Core running in "+location, "Compute", cpuGroup, "Preemptible", regions, Hour, coreSpot)
	s.Add("Spot Preemptible "+series+" Ram running in "+location, "Compute", ramGroup, "Preemptible", regions, GiBHour, ramSpot)
}

// AddGPU adds a GPU's on-demand and Spot SKUs as the catalog names them:
// "<gpu> GPU running in <location>" and "<gpu> GPU attached to Spot
// Preemptible VMs running in <location>", e.g. gpu "Nvidia Tesla T4".
func (s *Server) AddGPU(gpu, location string, regions []string, od, spot float64) {
	s.Add(gpu+" GPU running in "+location, "Compute", "GPU", "OnDemand", regions, Hour, od)
	s.Add(gpu+" GPU attached to Spot Preemptible VMs running in "+location, "Compute", "GPU", "Preemptible", regions, Hour, spot)
}

// Reprice sets the on-demand or Spot price of every SKU whose description
// is exactly description.
func (s *Server) Reprice(description string, usd float64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for i := range s.skus {
		if s.skus[i].Description == description {
			s.skus[i].PricingInfo[0].PricingExpression.TieredRates[0].UnitPrice = USD(usd)
			n++
		}
	}
	return n
}

// Remove drops every SKU whose description is exactly description.
func (s *Server) Remove(description string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	kept := s.skus[:0]
	for _, k := range s.skus {
		if k.Description != description {
			kept = append(kept, k)
		}
	}
	s.skus = kept
}

// Len is the number of SKUs the fake serves.
func (s *Server) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.skus)
}

// SetDisabled turns the Cloud Billing API off (on) in the caller's
// project: every call is 403 with reason SERVICE_DISABLED, the answer a
// project that never enabled cloudbilling.googleapis.com gets.
func (s *Server) SetDisabled(off bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.disabled = off
}

// Fail makes the next n calls fail with HTTP status, google.rpc status
// (e.g. "PERMISSION_DENIED", "UNAVAILABLE"), ErrorInfo reason ("" for
// none) and message.
func (s *Server) Fail(n, status int, rpcStatus, reason, msg string) {
	s.script.Fail(n, rpcError{status, rpcStatus, reason, msg})
}

// Recover drops the failures Fail scripted and not yet served.
func (s *Server) Recover() { s.script.Recover() }

// Calls is how many skus.list calls were answered (failed ones included).
func (s *Server) Calls() int { return s.script.Calls() }

// Last is the last skus.list call.
func (s *Server) Last() Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

type rpcError struct {
	code           int
	status, reason string
	msg            string
}

func (s *Server) listSkus(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	req := Request{Path: r.URL.Path, Query: map[string]string{}, APIKey: q.Get("key")}
	for k := range q {
		req.Query[k] = q.Get(k)
	}
	if b, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		req.Bearer = b
	}
	s.mu.Lock()
	s.last = req
	if e, ok := s.script.Serve(); ok {
		s.mu.Unlock()
		writeError(w, e)
		return
	}
	disabled := s.disabled
	s.mu.Unlock()

	if e, bad := s.authError(req); bad {
		writeError(w, e)
		return
	}
	if disabled {
		writeError(w, rpcError{http.StatusForbidden, "PERMISSION_DENIED", "SERVICE_DISABLED",
			"Cloud Billing API has not been used in project 123456789012 before or it is disabled. Enable it by visiting https://console.developers.google.com/apis/api/cloudbilling.googleapis.com/overview?project=123456789012 then retry. If you enabled this API recently, wait a few minutes for the action to propagate to our systems and retry."})
		return
	}
	if svc := r.PathValue("service"); svc != ComputeEngine {
		writeError(w, rpcError{http.StatusNotFound, "NOT_FOUND", "", fmt.Sprintf("Service %q not found.", "services/"+svc)})
		return
	}
	if c := q.Get("currencyCode"); c != "" && c != "USD" {
		writeError(w, rpcError{http.StatusBadRequest, "INVALID_ARGUMENT", "", "the fake serves USD only"})
		return
	}
	size := 5000
	if v := q.Get("pageSize"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeError(w, rpcError{http.StatusBadRequest, "INVALID_ARGUMENT", "", fmt.Sprintf("Invalid value at 'page_size' (TYPE_INT32), %q", v)})
			return
		}
		if n > 0 {
			size = n
		}
	}
	size = min(size, s.opts.MaxPageSize)
	s.mu.Lock()
	s.last.PageSize = size
	skus := append([]SKU(nil), s.skus...)
	s.mu.Unlock()
	start := 0
	if tok := q.Get("pageToken"); tok != "" {
		n, ok := parseToken(tok)
		if !ok || n > len(skus) {
			writeError(w, rpcError{http.StatusBadRequest, "INVALID_ARGUMENT", "", "Invalid page token."})
			return
		}
		start = n
	}
	end := min(start+size, len(skus))
	out := struct {
		Skus          []SKU  `json:"skus"`
		NextPageToken string `json:"nextPageToken"`
	}{Skus: skus[start:end]}
	if out.Skus == nil {
		out.Skus = []SKU{}
	}
	if end < len(skus) {
		out.NextPageToken = makeToken(end)
	}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	_ = json.NewEncoder(w).Encode(out)
}

// authError is the real API's answer to missing or wrong credentials.
func (s *Server) authError(req Request) (rpcError, bool) {
	if s.opts.APIKey == "" && s.opts.Token == "" {
		return rpcError{}, false
	}
	switch {
	case req.APIKey != "" && req.APIKey == s.opts.APIKey, req.Bearer != "" && req.Bearer == s.opts.Token:
		return rpcError{}, false
	case req.APIKey != "":
		return rpcError{http.StatusBadRequest, "INVALID_ARGUMENT", "API_KEY_INVALID", "API key not valid. Please pass a valid API key."}, true
	case req.Bearer != "":
		return rpcError{http.StatusUnauthorized, "UNAUTHENTICATED", "ACCESS_TOKEN_TYPE_UNSUPPORTED",
			"Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential."}, true
	}
	return rpcError{http.StatusForbidden, "PERMISSION_DENIED", "",
		"Method doesn't allow unregistered callers (callers without established identity). Please use API Key or other form of API consumer identity to call this API."}, true
}

const tokenPrefix = "fakebilling:"

func makeToken(offset int) string {
	return base64.RawURLEncoding.EncodeToString([]byte(tokenPrefix + strconv.Itoa(offset)))
}

func parseToken(tok string) (int, bool) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return 0, false
	}
	v, ok := strings.CutPrefix(string(b), tokenPrefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(v)
	return n, err == nil && n >= 0
}

// writeError writes a google.rpc.Status error body, with an ErrorInfo
// detail when the error has a reason, as Google APIs answer.
func writeError(w http.ResponseWriter, e rpcError) {
	type errorInfo struct {
		Type     string            `json:"@type"`
		Reason   string            `json:"reason"`
		Domain   string            `json:"domain"`
		Metadata map[string]string `json:"metadata,omitempty"`
	}
	body := struct {
		Error struct {
			Code    int         `json:"code"`
			Message string      `json:"message"`
			Status  string      `json:"status"`
			Details []errorInfo `json:"details,omitempty"`
		} `json:"error"`
	}{}
	body.Error.Code, body.Error.Message, body.Error.Status = e.code, e.msg, e.status
	if e.reason != "" {
		body.Error.Details = []errorInfo{{Type: "type.googleapis.com/google.rpc.ErrorInfo", Reason: e.reason, Domain: "googleapis.com",
			Metadata: map[string]string{"service": "cloudbilling.googleapis.com"}}}
	}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(e.code)
	_ = json.NewEncoder(w).Encode(body)
}
