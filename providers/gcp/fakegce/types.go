package fakegce

import (
	"encoding/json"
	"strconv"
)

// The wire types below mirror the Compute Engine v1 REST resources as the
// real API sends them (field names, string-encoded 64-bit integers,
// selfLinks, kinds). Only the fields fleetd's provider reads or writes are
// modelled; unknown request fields are ignored.

// Int64 is a 64-bit integer that the API encodes as a JSON string and
// accepts as a string or a number, like protojson.
type Int64 int64

func (v Int64) MarshalJSON() ([]byte, error) {
	return []byte(strconv.Quote(strconv.FormatInt(int64(v), 10))), nil
}

func (v *Int64) UnmarshalJSON(b []byte) error {
	n, err := strconv.ParseInt(unquoted(b), 10, 64)
	if err != nil {
		return err
	}
	*v = Int64(n)
	return nil
}

// unquoted is the text of a JSON integer sent as a string or a number.
func unquoted(b []byte) string {
	if s, err := strconv.Unquote(string(b)); err == nil {
		return s
	}
	return string(b)
}

// Uint64 is the unsigned counterpart (resource and operation ids).
type Uint64 uint64

func (v Uint64) MarshalJSON() ([]byte, error) {
	return []byte(strconv.Quote(strconv.FormatUint(uint64(v), 10))), nil
}

func (v *Uint64) UnmarshalJSON(b []byte) error {
	n, err := strconv.ParseUint(unquoted(b), 10, 64)
	if err != nil {
		return err
	}
	*v = Uint64(n)
	return nil
}

// Operation is a zonal operation (compute#operation).
type Operation struct {
	Kind                string          `json:"kind"`
	ID                  Uint64          `json:"id"`
	Name                string          `json:"name"`
	Zone                string          `json:"zone,omitempty"`
	OperationType       string          `json:"operationType"`
	TargetLink          string          `json:"targetLink,omitempty"`
	TargetID            Uint64          `json:"targetId,omitempty"`
	Status              string          `json:"status"`
	StatusMessage       string          `json:"statusMessage,omitempty"`
	User                string          `json:"user,omitempty"`
	Progress            int             `json:"progress"`
	InsertTime          string          `json:"insertTime"`
	StartTime           string          `json:"startTime,omitempty"`
	EndTime             string          `json:"endTime,omitempty"`
	Error               *OperationError `json:"error,omitempty"`
	HTTPErrorStatusCode int             `json:"httpErrorStatusCode,omitempty"`
	HTTPErrorMessage    string          `json:"httpErrorMessage,omitempty"`
	SelfLink            string          `json:"selfLink"`
}

// OperationError is the error block of a failed operation.
type OperationError struct {
	Errors []OperationErrorItem `json:"errors"`
}

// OperationErrorItem is one error of a failed operation; Code is the
// machine-readable code, e.g. ZONE_RESOURCE_POOL_EXHAUSTED or QUOTA_EXCEEDED.
type OperationErrorItem struct {
	Code     string `json:"code"`
	Location string `json:"location,omitempty"`
	Message  string `json:"message"`
}

// Instance is a VM instance (compute#instance).
type Instance struct {
	Kind               string              `json:"kind"`
	ID                 Uint64              `json:"id"`
	CreationTimestamp  string              `json:"creationTimestamp"`
	Name               string              `json:"name"`
	Description        string              `json:"description,omitempty"`
	MachineType        string              `json:"machineType"`
	Status             string              `json:"status"`
	StatusMessage      string              `json:"statusMessage,omitempty"`
	Zone               string              `json:"zone"`
	CanIPForward       bool                `json:"canIpForward"`
	NetworkInterfaces  []NetworkInterface  `json:"networkInterfaces,omitempty"`
	Disks              []AttachedDisk      `json:"disks,omitempty"`
	Metadata           *Metadata           `json:"metadata,omitempty"`
	ServiceAccounts    []ServiceAccount    `json:"serviceAccounts,omitempty"`
	SelfLink           string              `json:"selfLink"`
	Scheduling         *Scheduling         `json:"scheduling,omitempty"`
	CPUPlatform        string              `json:"cpuPlatform,omitempty"`
	Labels             map[string]string   `json:"labels,omitempty"`
	LabelFingerprint   string              `json:"labelFingerprint,omitempty"`
	GuestAccelerators  []AcceleratorConfig `json:"guestAccelerators,omitempty"`
	StartRestricted    bool                `json:"startRestricted"`
	DeletionProtection bool                `json:"deletionProtection"`
	Fingerprint        string              `json:"fingerprint,omitempty"`
	LastStartTimestamp string              `json:"lastStartTimestamp,omitempty"`
	LastStopTimestamp  string              `json:"lastStopTimestamp,omitempty"`
	ResourcePolicies   []string            `json:"resourcePolicies,omitempty"`
}

// MetadataValue returns the value of a metadata item of in.
func (in Instance) MetadataValue(key string) (string, bool) {
	if in.Metadata == nil {
		return "", false
	}
	for _, it := range in.Metadata.Items {
		if it.Key == key && it.Value != nil {
			return *it.Value, true
		}
	}
	return "", false
}

type NetworkInterface struct {
	Kind          string         `json:"kind,omitempty"`
	Network       string         `json:"network,omitempty"`
	Subnetwork    string         `json:"subnetwork,omitempty"`
	NetworkIP     string         `json:"networkIP,omitempty"`
	Name          string         `json:"name,omitempty"`
	Fingerprint   string         `json:"fingerprint,omitempty"`
	StackType     string         `json:"stackType,omitempty"`
	AccessConfigs []AccessConfig `json:"accessConfigs,omitempty"`
	NicType       string         `json:"nicType,omitempty"`
}

type AccessConfig struct {
	Kind        string `json:"kind,omitempty"`
	Type        string `json:"type,omitempty"`
	Name        string `json:"name,omitempty"`
	NatIP       string `json:"natIP,omitempty"`
	NetworkTier string `json:"networkTier,omitempty"`
}

type AttachedDisk struct {
	Kind             string            `json:"kind,omitempty"`
	Type             string            `json:"type,omitempty"`
	Mode             string            `json:"mode,omitempty"`
	Source           string            `json:"source,omitempty"`
	DeviceName       string            `json:"deviceName,omitempty"`
	Index            int               `json:"index"`
	Boot             bool              `json:"boot"`
	AutoDelete       bool              `json:"autoDelete"`
	Interface        string            `json:"interface,omitempty"`
	DiskSizeGb       Int64             `json:"diskSizeGb,omitempty"`
	InitializeParams *InitializeParams `json:"initializeParams,omitempty"`
}

type InitializeParams struct {
	DiskName    string `json:"diskName,omitempty"`
	SourceImage string `json:"sourceImage,omitempty"`
	DiskType    string `json:"diskType,omitempty"`
	DiskSizeGb  Int64  `json:"diskSizeGb,omitempty"`
}

type Metadata struct {
	Kind        string         `json:"kind,omitempty"`
	Fingerprint string         `json:"fingerprint,omitempty"`
	Items       []MetadataItem `json:"items,omitempty"`
}

type MetadataItem struct {
	Key   string  `json:"key"`
	Value *string `json:"value,omitempty"`
}

type ServiceAccount struct {
	Email  string   `json:"email"`
	Scopes []string `json:"scopes,omitempty"`
}

type Scheduling struct {
	OnHostMaintenance         string `json:"onHostMaintenance,omitempty"`
	AutomaticRestart          *bool  `json:"automaticRestart,omitempty"`
	Preemptible               bool   `json:"preemptible"`
	ProvisioningModel         string `json:"provisioningModel,omitempty"`
	InstanceTerminationAction string `json:"instanceTerminationAction,omitempty"`
}

type AcceleratorConfig struct {
	AcceleratorType  string `json:"acceleratorType"`
	AcceleratorCount int    `json:"acceleratorCount"`
}

// MachineType is a zonal machine type (compute#machineType). Zone is the
// bare zone name, as in the real API.
type MachineType struct {
	Kind                         string                   `json:"kind"`
	ID                           Uint64                   `json:"id"`
	CreationTimestamp            string                   `json:"creationTimestamp"`
	Name                         string                   `json:"name"`
	Description                  string                   `json:"description"`
	GuestCpus                    int                      `json:"guestCpus"`
	MemoryMb                     int                      `json:"memoryMb"`
	ImageSpaceGb                 int                      `json:"imageSpaceGb"`
	MaximumPersistentDisks       int                      `json:"maximumPersistentDisks"`
	MaximumPersistentDisksSizeGb Int64                    `json:"maximumPersistentDisksSizeGb"`
	Zone                         string                   `json:"zone"`
	SelfLink                     string                   `json:"selfLink"`
	IsSharedCpu                  bool                     `json:"isSharedCpu"`
	Architecture                 string                   `json:"architecture,omitempty"` // X86_64, ARM64
	Accelerators                 []MachineTypeAccelerator `json:"accelerators,omitempty"`
}

// MachineTypeAccelerator is a GPU built into an accelerator-optimized type.
type MachineTypeAccelerator struct {
	GuestAcceleratorType  string `json:"guestAcceleratorType"`
	GuestAcceleratorCount int    `json:"guestAcceleratorCount"`
}

// AcceleratorType is a zonal accelerator type (compute#acceleratorType).
// Zone is a full URL here, unlike MachineType.Zone.
type AcceleratorType struct {
	Kind                    string `json:"kind"`
	ID                      Uint64 `json:"id"`
	CreationTimestamp       string `json:"creationTimestamp"`
	Name                    string `json:"name"`
	Description             string `json:"description"`
	Zone                    string `json:"zone"`
	SelfLink                string `json:"selfLink"`
	MaximumCardsPerInstance int    `json:"maximumCardsPerInstance"`
}

type listResponse struct {
	Kind          string          `json:"kind"`
	ID            string          `json:"id"`
	Items         json.RawMessage `json:"items,omitempty"`
	NextPageToken string          `json:"nextPageToken,omitempty"`
	SelfLink      string          `json:"selfLink"`
	Warning       *warning        `json:"warning,omitempty"`
}

type warning struct {
	Code    string        `json:"code"`
	Message string        `json:"message"`
	Data    []warningData `json:"data,omitempty"`
}

type warningData struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

type scopedInstances struct {
	Instances []Instance `json:"instances,omitempty"`
	Warning   *warning   `json:"warning,omitempty"`
}

// errorBody is a googleapi error response.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code    int         `json:"code"`
	Message string      `json:"message"`
	Errors  []errorItem `json:"errors"`
}

type errorItem struct {
	Message string `json:"message"`
	Domain  string `json:"domain"`
	Reason  string `json:"reason"`
}
