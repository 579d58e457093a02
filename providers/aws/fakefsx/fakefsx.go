// Package fakefsx is an in-process Amazon FSx endpoint for tests: an
// http.Handler speaking FSx's awsJson1_1 protocol (POST /, X-Amz-Target:
// AWSSimbaAPIService_v20180301.<Operation>, JSON bodies, errors as
// {"__type": …, "Message": …}), so the real aws-sdk-go-v2 FSx client,
// pointed at it with BaseEndpoint, works unchanged.
//
// It exists because moto 5.2.1's FSx leaves out what a preflight reads:
// its file systems have no Lifecycle, VpcId or NetworkInterfaceIds, and
// DescribeFileSystems answers an unknown id with an empty list where FSx
// says FileSystemNotFound. It implements DescribeFileSystems only, with
// file systems a test adds, per region (the region of the request's SigV4
// credential scope).
package fakefsx

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"sync"
)

// TargetPrefix is the X-Amz-Target prefix of FSx operations.
const TargetPrefix = "AWSSimbaAPIService_v20180301."

// FileSystem is one file system in the shape FSx describes it (the
// fields a client of Lustre reads).
type FileSystem struct {
	FileSystemID        string   `json:"FileSystemId"`
	FileSystemType      string   `json:"FileSystemType"`            // LUSTRE, WINDOWS, ONTAP, OPENZFS
	Lifecycle           string   `json:"Lifecycle"`                 // AVAILABLE, CREATING, FAILED, …
	StorageCapacity     int      `json:"StorageCapacity,omitempty"` // GiB
	VpcID               string   `json:"VpcId,omitempty"`
	SubnetIDs           []string `json:"SubnetIds,omitempty"`
	NetworkInterfaceIDs []string `json:"NetworkInterfaceIds,omitempty"`
	DNSName             string   `json:"DNSName,omitempty"`
	ResourceARN         string   `json:"ResourceARN,omitempty"`
}

// Server is the fake. It is safe for concurrent use.
type Server struct {
	mu    sync.Mutex
	fss   map[string][]FileSystem // by region
	calls int
}

// New returns an empty fake; serve it with httptest.NewServer.
func New() *Server { return &Server{fss: map[string][]FileSystem{}} }

// Add puts a file system in region; a missing DNSName and ResourceARN
// are filled in as FSx names them.
func (s *Server) Add(region string, fs FileSystem) {
	if fs.DNSName == "" {
		fs.DNSName = fmt.Sprintf("%s.fsx.%s.amazonaws.com", fs.FileSystemID, region)
	}
	if fs.ResourceARN == "" {
		fs.ResourceARN = fmt.Sprintf("arn:aws:fsx:%s:123456789012:file-system/%s", region, fs.FileSystemID)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fss[region] = append(s.fss[region], fs)
}

// Calls is how many requests the fake answered.
func (s *Server) Calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

var scopeRE = regexp.MustCompile(`Credential=[^/]+/[0-9]+/([^/]+)/fsx/aws4_request`)

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.calls++
	s.mu.Unlock()
	if r.Method != http.MethodPost {
		writeError(w, http.StatusBadRequest, "BadRequest", "FSx takes POST")
		return
	}
	m := scopeRE.FindStringSubmatch(r.Header.Get("Authorization"))
	if m == nil {
		writeError(w, http.StatusForbidden, "MissingAuthenticationTokenException", "Missing or malformed SigV4 Authorization for service fsx")
		return
	}
	region := m[1]
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		writeError(w, http.StatusBadRequest, "BadRequest", err.Error())
		return
	}
	switch r.Header.Get("X-Amz-Target") {
	case TargetPrefix + "DescribeFileSystems":
		s.describe(w, region, body)
	default:
		writeError(w, http.StatusBadRequest, "UnknownOperationException", "unsupported operation "+r.Header.Get("X-Amz-Target"))
	}
}

func (s *Server) describe(w http.ResponseWriter, region string, body []byte) {
	var in struct {
		FileSystemIDs []string `json:"FileSystemIds"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		writeError(w, http.StatusBadRequest, "BadRequest", "malformed request: "+err.Error())
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []FileSystem{}
	for _, fs := range s.fss[region] {
		if len(in.FileSystemIDs) == 0 || slices.Contains(in.FileSystemIDs, fs.FileSystemID) {
			out = append(out, fs)
		}
	}
	// FSx fails the whole call when any asked-for id is unknown.
	for _, id := range in.FileSystemIDs {
		if !slices.ContainsFunc(out, func(fs FileSystem) bool { return fs.FileSystemID == id }) {
			writeError(w, http.StatusBadRequest, "FileSystemNotFound", fmt.Sprintf("File system '%s' does not exist.", id))
			return
		}
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	_ = json.NewEncoder(w).Encode(map[string]any{"FileSystems": out})
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	w.Header().Set("X-Amzn-ErrorType", code)
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"__type": code, "Message": msg})
}
