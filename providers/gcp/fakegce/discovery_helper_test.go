package fakegce

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"mime"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The fake is checked against the discovery documents (the published API
// descriptions) that ship in the google.golang.org/api module go.mod
// selects: every response any test in this package gets from a fake is
// recorded (wrapHandler) and validated against the response schema of the
// API method the request is. The real clients ignore unknown fields, so
// without this a misspelt or invented field in the fake goes unnoticed.

// TestMain records the traffic of every fake the package's tests start,
// and after them checks it all (see checkAllTraffic).
func TestMain(m *testing.M) {
	wrapHandler = traffic.wrap
	code := m.Run()
	if traffic.fakes() > 0 {
		// Coverage only when every test ran and passed: a failed test may
		// have stopped before reaching its routes.
		if problems := checkAllTraffic(code == 0 && !filtered()); len(problems) > 0 {
			fmt.Fprintf(os.Stderr, "--- FAIL: responses of the fakes that do not match the discovery documents:\n")
			for _, p := range problems {
				fmt.Fprintf(os.Stderr, "    %s\n", p)
			}
			if code == 0 {
				fmt.Println("FAIL")
				code = 1
			}
		}
	}
	os.Exit(code)
}

// --- discovery documents ------------------------------------------------

// apiDocs are the APIs the fake answers for (it stands in for each one's
// host), with the shape of their error bodies. A route of another API
// fails the check until its document is added here.
var apiDocs = []struct {
	file   string // in the google.golang.org/api module
	errors *dschema
}{
	{"compute/v1/compute-api.json", legacyErrors},
	{"cloudresourcemanager/v1/cloudresourcemanager-api.json", rpcErrors},
	{"iam/v1/iam-api.json", rpcErrors},
}

// discovery is the part of a Google API discovery document the checks read.
type discovery struct {
	Name        string                `json:"name"`
	ServicePath string                `json:"servicePath"`
	Schemas     map[string]*dschema   `json:"schemas"`
	Resources   map[string]*dresource `json:"resources"`

	errors  *dschema // the envelope of its error bodies
	checker *checker
}

type dresource struct {
	Methods   map[string]*dmethod   `json:"methods"`
	Resources map[string]*dresource `json:"resources"`
}

type dmethod struct {
	ID         string   `json:"id"`
	HTTPMethod string   `json:"httpMethod"`
	Path       string   `json:"path"`
	FlatPath   string   `json:"flatPath"`
	Response   *dschema `json:"response"`

	doc      *discovery
	template string         // "/" + servicePath + flatPath (or path)
	re       *regexp.Regexp // matches the request paths of the template
	literal  int            // literal characters of the template: the more, the more specific
}

// dschema is a discovery schema: a JSON Schema draft-3 dialect in which
// int64/uint64 are JSON strings with a format. Required is not used by
// the discovery documents; the hand-written error envelopes use it.
type dschema struct {
	Ref                  string              `json:"$ref"`
	Type                 string              `json:"type"`
	Format               string              `json:"format"`
	Properties           map[string]*dschema `json:"properties"`
	AdditionalProperties *dschema            `json:"additionalProperties"`
	Items                *dschema            `json:"items"`
	Enum                 []string            `json:"enum"`
	Pattern              string              `json:"pattern"`
	Default              string              `json:"default"`
	Required             []string            `json:"required"`
}

// apiSet is the discovery documents of apiDocs, and their methods by
// HTTP method.
type apiSet struct {
	docs   []*discovery
	byVerb map[string][]*dmethod
}

var (
	apisOnce sync.Once
	apisVal  *apiSet
	apisErr  error
)

// loadAPIs reads apiDocs from the module cache, once per test binary.
func loadAPIs() (*apiSet, error) {
	apisOnce.Do(func() { apisVal, apisErr = readAPIs() })
	return apisVal, apisErr
}

func readAPIs() (*apiSet, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "google.golang.org/api")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("locating google.golang.org/api: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return nil, errors.New("google.golang.org/api is not in the module cache (run go mod download)")
	}
	set := &apiSet{byVerb: map[string][]*dmethod{}}
	for _, a := range apiDocs {
		d, err := readDiscovery(filepath.Join(dir, filepath.FromSlash(a.file)))
		if err != nil {
			return nil, err
		}
		d.errors = a.errors
		set.docs = append(set.docs, d)
		var walk func(map[string]*dresource)
		walk = func(rs map[string]*dresource) {
			for _, r := range rs {
				for _, m := range r.Methods {
					m.doc = d
					p := m.FlatPath
					if p == "" {
						p = m.Path
					}
					m.template = "/" + d.ServicePath + p
					m.re, m.literal = templateRE(m.template)
					set.byVerb[m.HTTPMethod] = append(set.byVerb[m.HTTPMethod], m)
				}
				walk(r.Resources)
			}
		}
		walk(d.Resources)
	}
	for _, ms := range set.byVerb {
		sort.Slice(ms, func(i, j int) bool { return ms[i].ID < ms[j].ID })
	}
	return set, nil
}

func readDiscovery(path string) (*discovery, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading a discovery document: %w", err)
	}
	var d discovery
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", path, err)
	}
	if len(d.Schemas) == 0 || len(d.Resources) == 0 {
		return nil, fmt.Errorf("%s: no schemas or resources", path)
	}
	d.checker = &checker{schemas: d.Schemas, patterns: map[string]*regexp.Regexp{}}
	return &d, nil
}

var paramRE = regexp.MustCompile(`\{\+?[^}]*\}`)

// templateRE turns a path template ("/compute/v1/projects/{project}",
// "/v1/projects/{resource}:testIamPermissions") into a regexp of the
// request paths it names: {x} is one path segment, {+x} several.
func templateRE(tmpl string) (*regexp.Regexp, int) {
	var b strings.Builder
	literal, last := 0, 0
	for _, loc := range paramRE.FindAllStringIndex(tmpl, -1) {
		b.WriteString(regexp.QuoteMeta(tmpl[last:loc[0]]))
		literal += loc[0] - last
		if strings.HasPrefix(tmpl[loc[0]:], "{+") {
			b.WriteString(`.+`)
		} else {
			b.WriteString(`[^/]+`)
		}
		last = loc[1]
	}
	b.WriteString(regexp.QuoteMeta(tmpl[last:]))
	literal += len(tmpl) - last
	return regexp.MustCompile("^" + b.String() + "$"), literal
}

// probePath is a request path of a template, every parameter "x".
func probePath(tmpl string) string { return paramRE.ReplaceAllString(tmpl, "x") }

// --- routes ---------------------------------------------------------------

// isCatchAll reports whether a route pattern is the fake's handler of the
// paths it does not serve, whose answers can only be errors.
func isCatchAll(pattern string) bool {
	if i := strings.IndexAny(pattern, " \t"); i >= 0 {
		pattern = strings.TrimLeft(pattern[i:], " \t")
	}
	return pattern == "/"
}

// methodFor finds the discovery method a request is: the HTTP method and
// a path template matching the request path, the most literal one when
// several do (as "images/family/{family}" beats "images/{image}").
func (a *apiSet) methodFor(verb, path string) (*dmethod, error) {
	if verb == http.MethodHead {
		verb = http.MethodGet
	}
	var best []*dmethod
	for _, m := range a.byVerb[verb] {
		if !m.re.MatchString(path) {
			continue
		}
		switch {
		case len(best) == 0 || m.literal > best[0].literal:
			best = []*dmethod{m}
		case m.literal == best[0].literal:
			best = append(best, m)
		}
	}
	switch len(best) {
	case 0:
		return nil, fmt.Errorf("%s %s is no method of the discovery documents", verb, path)
	case 1:
		return best[0], nil
	}
	ids := make([]string, len(best))
	for i, m := range best {
		ids[i] = m.ID
	}
	return nil, fmt.Errorf("%s %s matches several discovery methods: %s", verb, path, strings.Join(ids, ", "))
}

// servedRoutes probes mux with a request for every method of the
// discovery documents and returns, by route pattern, the methods that
// route answers: the routes of the fake that are API methods. The
// catch-all is left out.
func (a *apiSet) servedRoutes(mux *http.ServeMux) map[string][]*dmethod {
	out := map[string][]*dmethod{}
	for verb, ms := range a.byVerb {
		for _, m := range ms {
			r := httptest.NewRequest(verb, probePath(m.template), nil)
			if _, pattern := mux.Handler(r); pattern != "" && !isCatchAll(pattern) {
				out[pattern] = append(out[pattern], m)
			}
		}
	}
	return out
}

// --- schema validation ----------------------------------------------------

// errorEnvelopeJSON is Google's JSON error body, in the discovery dialect.
// The discovery documents describe only the success responses (each
// method's response.$ref), not the envelope every failed call returns,
// so it is written out here: the fields googleapi.Error decodes, with
// "status" and "details" of google.rpc.Status. Which fields are required
// depends on the API, see errorEnvelope.
const errorEnvelopeJSON = `{
  "type": "object", "required": ["error"],
  "properties": {"error": {
    "type": "object",
    "properties": {
      "code": {"type": "integer", "format": "int32"},
      "message": {"type": "string"},
      "status": {"type": "string", "enum": ["OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
        "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
        "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"]},
      "errors": {"type": "array", "items": {
        "type": "object", "required": ["message", "domain", "reason"],
        "properties": {
          "message": {"type": "string"}, "domain": {"type": "string"}, "reason": {"type": "string"},
          "location": {"type": "string"}, "locationType": {"type": "string"}
        }}},
      "details": {"type": "array", "items": {"type": "object", "required": ["@type"], "additionalProperties": {"type": "any"}}}
    }}}
}`

var (
	// legacyErrors is Compute Engine's envelope: errors[] carries the
	// reason ("notFound", "quotaExceeded") that callers branch on.
	legacyErrors = errorEnvelope("code", "message", "errors")
	// rpcErrors is google.rpc.Status, as Resource Manager and IAM answer:
	// a canonical status and typed details instead of errors[].
	rpcErrors = errorEnvelope("code", "message", "status")
	// anyErrors is for requests that reach no API method.
	anyErrors = errorEnvelope("code", "message")
)

func errorEnvelope(required ...string) *dschema {
	var s dschema
	if err := json.Unmarshal([]byte(errorEnvelopeJSON), &s); err != nil {
		panic(err)
	}
	s.Properties["error"].Required = required
	return &s
}

// checker validates JSON values against the schemas of one document.
type checker struct {
	schemas map[string]*dschema

	mu       sync.Mutex
	patterns map[string]*regexp.Regexp // compiled schema patterns; nil when RE2 cannot
}

// body checks that b is exactly one JSON object valid against s, named
// name in the problems returned.
func (c *checker) body(b []byte, s *dschema, name string) []string {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return []string{fmt.Sprintf("%s: body is not JSON: %v", name, err)}
	}
	if _, err := dec.Token(); err != io.EOF {
		return []string{fmt.Sprintf("%s: data after the JSON value", name)}
	}
	var problems []string
	c.value(name, v, s, &problems)
	return problems
}

func (c *checker) value(at string, v any, s *dschema, problems *[]string) {
	bad := func(format string, args ...any) {
		*problems = append(*problems, at+": "+fmt.Sprintf(format, args...))
	}
	for s.Ref != "" {
		ref, ok := c.schemas[s.Ref]
		if !ok {
			bad("unresolved $ref %q", s.Ref)
			return
		}
		s = ref
	}
	if v == nil {
		bad("null; the API omits unset fields")
		return
	}
	switch s.Type {
	case "any", "":
		// Nothing to check: the document does not constrain it.
	case "object":
		obj, ok := v.(map[string]any)
		if !ok {
			bad("%s, want an object", jsonKind(v))
			return
		}
		for _, k := range s.Required {
			if _, ok := obj[k]; !ok {
				bad("required field %q is missing", k)
			}
		}
		if s.Properties == nil && s.AdditionalProperties == nil {
			return // a free-form object
		}
		for _, k := range slices.Sorted(maps.Keys(obj)) {
			if p, ok := s.Properties[k]; ok {
				c.value(at+"."+k, obj[k], p, problems)
				continue
			}
			if s.AdditionalProperties != nil {
				c.value(at+"["+strconv.Quote(k)+"]", obj[k], s.AdditionalProperties, problems)
				continue
			}
			msg := fmt.Sprintf("unknown field %q", k)
			for name := range s.Properties {
				if strings.EqualFold(name, k) {
					msg += fmt.Sprintf(" (did you mean %q?)", name)
				}
			}
			bad("%s", msg)
		}
	case "array":
		arr, ok := v.([]any)
		if !ok {
			bad("%s, want an array", jsonKind(v))
			return
		}
		if s.Items == nil {
			return
		}
		for i, e := range arr {
			c.value(fmt.Sprintf("%s[%d]", at, i), e, s.Items, problems)
		}
	case "string":
		str, ok := v.(string)
		if !ok {
			want := "a string"
			if s.Format != "" {
				want += " (" + s.Format + ")"
			}
			bad("%s, want %s", jsonKind(v), want)
			return
		}
		// A resource's kind is fixed: the document gives it as the default.
		if strings.HasSuffix(at, ".kind") && strings.HasPrefix(s.Default, "compute#") && str != s.Default {
			bad("%q, want %q", str, s.Default)
		}
		if len(s.Enum) > 0 && !slices.Contains(s.Enum, str) {
			bad("%q is not one of the enum values %v", str, s.Enum)
		}
		if msg := checkStringFormat(s.Format, str); msg != "" {
			bad("%s", msg)
		}
		if s.Pattern != "" {
			if re := c.pattern(s.Pattern); re != nil && !re.MatchString(str) {
				bad("%q does not match the pattern %s", str, s.Pattern)
			}
		}
	case "integer":
		n, ok := v.(json.Number)
		if !ok {
			bad("%s, want an integer", jsonKind(v))
			return
		}
		i, err := strconv.ParseInt(n.String(), 10, 64)
		if err != nil {
			bad("%s is not an integer", n)
			return
		}
		switch {
		case s.Format == "int32" && (i < math.MinInt32 || i > math.MaxInt32),
			s.Format == "uint32" && (i < 0 || i > math.MaxUint32):
			bad("%d is out of %s range", i, s.Format)
		}
	case "number":
		n, ok := v.(json.Number)
		if !ok {
			bad("%s, want a number", jsonKind(v))
			return
		}
		if _, err := n.Float64(); err != nil {
			bad("%s is not a number", n)
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			bad("%s, want a boolean", jsonKind(v))
		}
	default:
		bad("schema type %q is not understood by this checker", s.Type)
	}
}

func (c *checker) pattern(p string) *regexp.Regexp {
	c.mu.Lock()
	defer c.mu.Unlock()
	re, ok := c.patterns[p]
	if !ok {
		if c.patterns == nil {
			c.patterns = map[string]*regexp.Regexp{}
		}
		re, _ = regexp.Compile(`^(?:` + p + `)$`) // nil when RE2 cannot compile it: unchecked
		c.patterns[p] = re
	}
	return re
}

var durationRE = regexp.MustCompile(`^-?[0-9]+(\.[0-9]{1,9})?s$`)

// checkStringFormat checks the formats of string-encoded values; "" if ok.
func checkStringFormat(format, s string) string {
	var err error
	switch format {
	case "int64":
		_, err = strconv.ParseInt(s, 10, 64)
	case "uint64":
		_, err = strconv.ParseUint(s, 10, 64)
	case "byte":
		if _, e := base64.StdEncoding.DecodeString(s); e != nil {
			_, err = base64.URLEncoding.DecodeString(s)
		}
	case "google-datetime":
		_, err = time.Parse(time.RFC3339Nano, s)
	case "google-duration":
		if !durationRE.MatchString(s) {
			err = errors.New("want seconds like 3.5s")
		}
	}
	if err != nil {
		return fmt.Sprintf("%q is not a valid %s: %v", s, format, err)
	}
	return ""
}

func jsonKind(v any) string {
	switch v := v.(type) {
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case string:
		return fmt.Sprintf("string %q", v)
	case json.Number:
		return "number " + v.String()
	case bool:
		return "boolean " + strconv.FormatBool(v)
	}
	return fmt.Sprintf("%T", v)
}

// --- traffic --------------------------------------------------------------

// exchange is one request a fake answered.
type exchange struct {
	host        string // the fake's address, to tell fakes apart
	method      string
	path        string
	pattern     string // the route that answered; "" when ServeMux answered itself (405, redirect)
	status      int
	contentType string
	body        []byte
}

func (e exchange) String() string { return e.method + " " + e.path }

type recorder struct {
	mu        sync.Mutex
	exchanges []exchange
	mux       *http.ServeMux // of the last fake started; all serve the same routes
	nfakes    int
	checked   map[string]bool // hosts whose traffic a test already checked
}

var traffic = &recorder{checked: map[string]bool{}}

func (rec *recorder) wrap(mux *http.ServeMux) http.Handler {
	rec.mu.Lock()
	rec.mux = mux
	rec.nfakes++
	rec.mu.Unlock()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cw := &captureWriter{ResponseWriter: w}
		mux.ServeHTTP(cw, r) // sets r.Pattern
		if cw.status == 0 {
			cw.status = http.StatusOK
		}
		rec.mu.Lock()
		defer rec.mu.Unlock()
		rec.exchanges = append(rec.exchanges, exchange{
			host: r.Host, method: r.Method, path: r.URL.Path, pattern: r.Pattern,
			status: cw.status, contentType: cw.Header().Get("Content-Type"), body: cw.body.Bytes(),
		})
	})
}

// routes is the routes of the fakes (all serve the same).
func (rec *recorder) routes() *http.ServeMux {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.mux
}

func (rec *recorder) fakes() int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.nfakes
}

// of returns the exchanges of the fake at url so far and marks them
// checked, so TestMain does not report their problems twice.
func (rec *recorder) of(url string) []exchange {
	host := strings.TrimPrefix(strings.TrimPrefix(url, "http://"), "https://")
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.checked[host] = true
	var out []exchange
	for _, e := range rec.exchanges {
		if e.host == host {
			out = append(out, e)
		}
	}
	return out
}

type captureWriter struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (w *captureWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *captureWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	w.body.Write(b)
	return w.ResponseWriter.Write(b)
}

// checkExchange validates one response. served is the fake's routes that
// are API methods (servedRoutes). A request that is an API method gets a
// success body valid against the method's response schema, or an error
// body in its API's envelope; any other request gets an error.
func (a *apiSet) checkExchange(served map[string][]*dmethod, e exchange) []string {
	var problems []string
	at := e.String()
	routed := e.pattern != "" && !isCatchAll(e.pattern)
	if routed && served[e.pattern] == nil {
		problems = append(problems, fmt.Sprintf("route %q serves no method of the discovery documents", e.pattern))
	}
	m, err := a.methodFor(e.method, e.path)
	if err == nil {
		at += " (" + m.ID + ")"
	}
	if mt, _, _ := mime.ParseMediaType(e.contentType); mt != "application/json" && (len(e.body) > 0 || e.status >= 400) {
		return append(problems, fmt.Sprintf("%s: HTTP %d with Content-Type %q, want application/json: %.80q", at, e.status, e.contentType, e.body))
	}
	switch {
	case e.status >= 400:
		env := anyErrors
		if m != nil && routed {
			env = m.doc.errors
		}
		problems = append(problems, (&checker{}).body(e.body, env, at+": error body")...)
		var body struct {
			Error struct {
				Code int `json:"code"`
			} `json:"error"`
		}
		if json.Unmarshal(e.body, &body) == nil && body.Error.Code != e.status {
			problems = append(problems, fmt.Sprintf("%s: error.code %d differs from the HTTP status %d", at, body.Error.Code, e.status))
		}
	case e.status < 200 || e.status > 299:
		problems = append(problems, fmt.Sprintf("%s: HTTP %d, want a 2xx success or a 4xx/5xx error", at, e.status))
	case !routed || m == nil:
		problems = append(problems, fmt.Sprintf("%s: HTTP %d from route %q to a request that is no API method", at, e.status, e.pattern))
	case m.Response == nil:
		if len(bytes.TrimSpace(e.body)) > 0 {
			problems = append(problems, fmt.Sprintf("%s: %s has no response body, got %.80q", at, m.ID, e.body))
		}
	default:
		problems = append(problems, m.doc.checker.body(e.body, m.Response, at+": "+m.Response.Ref)...)
	}
	return problems
}

// checkAllTraffic validates every exchange no test checked already and,
// with coverage, that every API route of the fake answered at least one
// success, so no route's response shape goes unchecked.
func checkAllTraffic(coverage bool) []string {
	a, err := loadAPIs()
	if err != nil {
		return []string{err.Error()}
	}
	traffic.mu.Lock()
	defer traffic.mu.Unlock()
	served := a.servedRoutes(traffic.mux)

	seen := map[string]int{} // problem → count: one bug in a list is reported once
	var order []string
	note := func(p string) {
		if seen[p] == 0 {
			order = append(order, p)
		}
		seen[p]++
	}
	succeeded := map[string]bool{}
	for _, e := range traffic.exchanges {
		if e.status >= 200 && e.status <= 299 {
			succeeded[e.pattern] = true
		}
		if traffic.checked[e.host] {
			continue
		}
		for _, p := range a.checkExchange(served, e) {
			note(p)
		}
	}
	if coverage {
		for _, pattern := range slices.Sorted(maps.Keys(served)) {
			if !succeeded[pattern] {
				note(fmt.Sprintf("route %q (%s) never answered a success in this package's tests, so its response schema went unchecked: exercise it",
					pattern, served[pattern][0].ID))
			}
		}
	}

	out := make([]string, len(order))
	for i, p := range order {
		out[i] = p
		if n := seen[p]; n > 1 {
			out[i] += fmt.Sprintf(" (×%d)", n)
		}
	}
	return out
}

// filtered reports whether only some tests ran (-run or -skip), when the
// traffic cannot be expected to reach every route.
func filtered() bool {
	for _, name := range []string{"test.run", "test.skip"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" {
			return true
		}
	}
	return false
}
