// Package fakefilestore is an in-process fake of the Cloud Filestore v1
// REST API (file.googleapis.com) for tests: instances.list over
// projects/{project}/locations/{location}/instances, with "-" for every
// location and pageSize/pageToken paging, in the JSON shapes
// google.golang.org/api/file/v1 parses; errors in the googleapi shape
// ({"error":{"code","message","status"}}). Tests point the real client at
// Server.URL (the provider's filestore_endpoint).
package fakefilestore

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// Instance is a Filestore instance as the API describes it (the fields a
// client mounting it reads).
type Instance struct {
	Name       string          `json:"name"` // projects/P/locations/L/instances/ID
	State      string          `json:"state"`
	Tier       string          `json:"tier"`
	FileShares []FileShare     `json:"fileShares"`
	Networks   []NetworkConfig `json:"networks"`
	CreateTime string          `json:"createTime,omitempty"`
}

// FileShare is one share of an instance.
type FileShare struct {
	Name       string `json:"name"`
	CapacityGb string `json:"capacityGb"` // int64 as a JSON string, as the API sends it
}

// NetworkConfig is one VPC network the instance is reachable from.
type NetworkConfig struct {
	Network         string   `json:"network"`
	Modes           []string `json:"modes"`
	ReservedIPRange string   `json:"reservedIpRange,omitempty"`
	IPAddresses     []string `json:"ipAddresses"`
	ConnectMode     string   `json:"connectMode,omitempty"`
}

// Server is a running fake; safe for concurrent use.
type Server struct {
	URL string

	project string
	srv     *httptest.Server

	mu        sync.Mutex
	instances []Instance
	// Deny makes every list answer 403 with this message (a missing
	// file.instances.list permission, or the API not enabled).
	deny  string
	calls int
	// pageSize is the page a list answers when the request sets none.
	pageSize int
}

// New starts a fake serving project on a loopback port; Close it.
func New(project string) *Server {
	s := &Server{project: project}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/projects/{project}/locations/{location}/instances", s.list)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "NOT_FOUND", "Method not found: "+r.URL.Path)
	})
	s.srv = httptest.NewServer(mux)
	s.URL = s.srv.URL
	return s
}

// SetPageSize makes lists without pageSize answer n instances a page (0,
// the default: all), so tests see the client follow nextPageToken.
func (s *Server) SetPageSize(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pageSize = n
}

// Close stops the server.
func (s *Server) Close() { s.srv.Close() }

// Add creates an instance id in location (a zone, or a region for
// regional and enterprise tiers) with one share and one network; its
// state is READY unless state says otherwise.
func (s *Server) Add(location, id, share, network, ip, state string) {
	if state == "" {
		state = "READY"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.instances = append(s.instances, Instance{
		Name: fmt.Sprintf("projects/%s/locations/%s/instances/%s", s.project, location, id), State: state, Tier: "BASIC_SSD",
		FileShares: []FileShare{{Name: share, CapacityGb: "2560"}},
		Networks:   []NetworkConfig{{Network: network, Modes: []string{"MODE_IPV4"}, ReservedIPRange: "10.20.0.0/29", IPAddresses: []string{ip}, ConnectMode: "DIRECT_PEERING"}},
		CreateTime: "2026-11-01T00:00:00Z",
	})
}

// Deny makes every later call fail with 403 and msg ("" lifts it).
func (s *Server) Deny(msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deny = msg
}

// Calls is how many requests the fake answered.
func (s *Server) Calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if s.deny != "" {
		writeError(w, http.StatusForbidden, "PERMISSION_DENIED", s.deny)
		return
	}
	if p := r.PathValue("project"); p != s.project {
		writeError(w, http.StatusForbidden, "PERMISSION_DENIED", fmt.Sprintf("Permission 'file.instances.list' denied on resource 'projects/%s/locations/%s' (or it may not exist).", p, r.PathValue("location")))
		return
	}
	loc := r.PathValue("location")
	var match []Instance
	for _, in := range s.instances {
		if loc == "-" || strings.Contains(in.Name, "/locations/"+loc+"/") {
			match = append(match, in)
		}
	}
	sort.Slice(match, func(i, j int) bool { return match[i].Name < match[j].Name })
	start := 0
	if tok := r.URL.Query().Get("pageToken"); tok != "" {
		n, err := strconv.Atoi(tok)
		if err != nil || n < 0 || n > len(match) {
			writeError(w, http.StatusBadRequest, "INVALID_ARGUMENT", "invalid page token")
			return
		}
		start = n
	}
	end := len(match)
	ps, _ := strconv.Atoi(r.URL.Query().Get("pageSize"))
	if ps <= 0 {
		ps = s.pageSize
	}
	if ps > 0 && start+ps < end {
		end = start + ps
	}
	out := map[string]any{"instances": match[start:end]}
	if end < len(match) {
		out["nextPageToken"] = strconv.Itoa(end)
	}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	_ = json.NewEncoder(w).Encode(out)
}

func writeError(w http.ResponseWriter, code int, status, msg string) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": code, "message": msg, "status": status}})
}
