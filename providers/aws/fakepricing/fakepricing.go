// Package fakepricing is an in-process AWS Price List Query API endpoint for
// tests: an http.Handler speaking the JSON 1.1 protocol the real service
// speaks (POST /, Content-Type application/x-amz-json-1.1, X-Amz-Target:
// AWSPriceListService.<Operation>, errors as {"__type": …, "Message": …}),
// so the real aws-sdk-go-v2 pricing client, pointed at it with
// BaseEndpoint, works unchanged. moto does not serve this API.
//
// It implements GetProducts for ServiceCode AmazonEC2: TERM_MATCH filters
// on product attributes (case-insensitive values, as the service matches
// them), MaxResults/NextToken paging, and PriceList items shaped like the
// service's (product.attributes, terms.OnDemand.*.priceDimensions.*.
// pricePerUnit.USD, publicationDate).
package fakepricing

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleetd/providers/internal/failscript"
)

// PublicationDate is the publicationDate of every price list item.
var PublicationDate = time.Date(2026, 10, 1, 12, 0, 0, 0, time.UTC)

// Server is the fake endpoint. Use it with httptest.NewServer(s). It is
// safe for concurrent use.
type Server struct {
	mu       sync.Mutex
	products []map[string]string // attributes, plus "_usd" for the price
	script   failscript.Queue[apiError]
	last     []Filter
}

// Filter is one GetProducts filter as received.
type Filter struct{ Type, Field, Value string }

type apiError struct {
	status    int
	code, msg string
}

// New returns a Server with no products.
func New() *Server { return &Server{} }

// AddEC2 adds the Linux, shared-tenancy, no-software, used-capacity
// on-demand product of instanceType in region at usd per hour; extra
// attributes (key, value pairs) override or add product attributes, e.g.
// to add a Windows or dedicated product that filters must exclude. Adding
// a product again with only the price changed reprices it.
func (s *Server) AddEC2(region, instanceType, usd string, extra ...string) {
	attrs := map[string]string{
		"servicecode": "AmazonEC2", "instanceType": instanceType, "regionCode": region,
		"location": regionNames[region], "operatingSystem": "Linux", "tenancy": "Shared",
		"preInstalledSw": "NA", "capacitystatus": "Used", "licenseModel": "No License required",
		"operation": "RunInstances", "marketoption": "OnDemand", "_usd": usd,
	}
	for i := 0; i+1 < len(extra); i += 2 {
		attrs[extra[i]] = extra[i+1]
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, p := range s.products {
		if sameProduct(p, attrs) {
			s.products[i] = attrs // a new price for the same product
			return
		}
	}
	s.products = append(s.products, attrs)
}

func sameProduct(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if k != "_usd" && b[k] != v {
			return false
		}
	}
	return true
}

// Fail makes the next n calls fail with an AWS error (e.g. 400
// "AccessDeniedException").
func (s *Server) Fail(n, status int, code, msg string) {
	s.script.Fail(n, apiError{status, code, msg})
}

// Recover drops the failures Fail scripted and not yet served.
func (s *Server) Recover() { s.script.Recover() }

// Calls is how many GetProducts calls were served (failed ones included).
func (s *Server) Calls() int { return s.script.Calls() }

// LastFilters are the filters of the last GetProducts call.
func (s *Server) LastFilters() []Filter {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Filter(nil), s.last...)
}

var regionNames = map[string]string{
	"us-east-1": "US East (N. Virginia)", "us-east-2": "US East (Ohio)",
	"us-west-2": "US West (Oregon)", "eu-central-1": "EU (Frankfurt)",
}

type getProductsInput struct {
	ServiceCode   string
	Filters       []Filter
	FormatVersion string
	MaxResults    int
	NextToken     string
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-amz-json-1.1") {
		writeErr(w, apiError{400, "SerializationException", "want POST application/x-amz-json-1.1"})
		return
	}
	if !strings.HasPrefix(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256 ") {
		writeErr(w, apiError{400, "MissingAuthenticationTokenException", "request is not signed"})
		return
	}
	op, ok := strings.CutPrefix(r.Header.Get("X-Amz-Target"), "AWSPriceListService.")
	if !ok || op != "GetProducts" {
		writeErr(w, apiError{400, "UnknownOperationException", "operation " + r.Header.Get("X-Amz-Target") + " is not served"})
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		writeErr(w, apiError{400, "SerializationException", err.Error()})
		return
	}
	var in getProductsInput
	if err := json.Unmarshal(body, &in); err != nil {
		writeErr(w, apiError{400, "SerializationException", err.Error()})
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = in.Filters
	if e, ok := s.script.Serve(); ok {
		writeErr(w, e)
		return
	}
	if in.ServiceCode != "AmazonEC2" {
		writeErr(w, apiError{400, "InvalidParameterException", "unknown service code " + in.ServiceCode})
		return
	}
	if in.MaxResults < 0 || in.MaxResults > 100 {
		writeErr(w, apiError{400, "InvalidParameterException", "MaxResults must be 1..100"})
		return
	}
	var match []map[string]string
	for _, p := range s.products {
		if matches(p, in.Filters) {
			match = append(match, p)
		}
	}
	start := 0
	if in.NextToken != "" {
		if start, err = strconv.Atoi(in.NextToken); err != nil || start > len(match) {
			writeErr(w, apiError{400, "InvalidNextTokenException", "bad NextToken"})
			return
		}
	}
	limit := in.MaxResults
	if limit == 0 {
		limit = 100
	}
	end := min(start+limit, len(match))
	out := struct {
		FormatVersion string
		PriceList     []string
		NextToken     string `json:",omitempty"`
	}{FormatVersion: "aws_v1", PriceList: []string{}}
	for i, p := range match[start:end] {
		out.PriceList = append(out.PriceList, item(p, start+i))
	}
	if end < len(match) {
		out.NextToken = strconv.Itoa(end)
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	json.NewEncoder(w).Encode(out)
}

func matches(p map[string]string, fs []Filter) bool {
	for _, f := range fs {
		if f.Type != "TERM_MATCH" {
			return false
		}
		if !strings.EqualFold(p[f.Field], f.Value) {
			return false
		}
	}
	return true
}

// item renders one product as the JSON string the service returns.
func item(p map[string]string, n int) string {
	sku := fmt.Sprintf("FAKESKU%05d", n)
	attrs := map[string]string{}
	for k, v := range p {
		if !strings.HasPrefix(k, "_") && k != "servicecode" {
			attrs[k] = v
		}
	}
	term := sku + ".JRTCKXETXF"
	doc := map[string]any{
		"product":     map[string]any{"productFamily": "Compute Instance", "attributes": attrs, "sku": sku},
		"serviceCode": "AmazonEC2",
		"terms": map[string]any{"OnDemand": map[string]any{term: map[string]any{
			"offerTermCode": "JRTCKXETXF", "sku": sku, "effectiveDate": "2026-09-01T00:00:00Z", "termAttributes": map[string]any{},
			"priceDimensions": map[string]any{term + ".6YS6EN2CT7": map[string]any{
				"unit": "Hrs", "beginRange": "0", "endRange": "Inf", "appliesTo": []string{},
				"rateCode":     term + ".6YS6EN2CT7",
				"description":  "$" + p["_usd"] + " per On Demand Linux " + p["instanceType"] + " Instance Hour",
				"pricePerUnit": map[string]string{"USD": p["_usd"]},
			}},
		}}},
		"version":         PublicationDate.Format("20060102150405"),
		"publicationDate": PublicationDate.Format(time.RFC3339),
	}
	b, _ := json.Marshal(doc)
	return string(b)
}

func writeErr(w http.ResponseWriter, e apiError) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	w.Header().Set("X-Amzn-ErrorType", e.code)
	w.WriteHeader(e.status)
	json.NewEncoder(w).Encode(map[string]string{"__type": e.code, "Message": e.msg})
}
