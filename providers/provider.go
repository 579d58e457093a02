// Package providers is the contract between fleetd and the clouds it buys
// capacity from. It imports nothing from the daemon so an external provider
// can depend on it (and on plugins/) alone.
package providers

import (
	"bytes"
	"context"
	"encoding/json"
	"time"
)

// Tag keys every fleetd instance carries. Crash adoption and orphan GC list
// instances by these, so they are part of the wire contract and never change.
const (
	TagFleet    = "fleetd-fleet"
	TagNodeID   = "fleetd-node"
	TagDaemonID = "fleetd-daemon"
	// TagIncarnation names the fleet incarnation (one apply-to-destroy
	// life of a fleet name) an instance was launched for: a re-created
	// fleet of the same name never adopts its predecessor's instances.
	TagIncarnation = "fleetd-incarnation"
)

// CapacityType is how an instance is bought.
type CapacityType string

const (
	Spot     CapacityType = "spot"
	OnDemand CapacityType = "on-demand"
)

// Offering is one purchasable shape of capacity in one place.
type Offering struct {
	Provider     string       `json:"provider"`
	Region       string       `json:"region"`
	Zone         string       `json:"zone"`
	InstanceType string       `json:"instance_type"`
	CapacityType CapacityType `json:"capacity_type"`
	PricePerHour float64      `json:"price_per_hour"` // USD
	GPUs         int          `json:"gpus"`
	GPUType      string       `json:"gpu_type,omitempty"`
	VCPUs        int          `json:"vcpus"`
	MemoryGiB    float64      `json:"memory_gib"`
	// Available is the provider's best knowledge of how many more instances
	// of this offering can be launched now; -1 means unknown (not zero).
	Available int `json:"available"`
	// PlacementScore is the cloud's own capacity signal for a spot
	// offering, 1 (a launch is unlikely to succeed) to 10 (likely), such as
	// an EC2 spot placement score; 0 means none. Placement weighs it next
	// to the interruption history it learns itself.
	PlacementScore int `json:"placement_score,omitempty"`
	// PlacementScoreNote says why PlacementScore is 0 when the provider
	// asked for one and could not get it (denied, not served).
	PlacementScoreNote string `json:"placement_score_note,omitempty"`
	// Arch is the CPU architecture as Go names it ("amd64", "arm64"); ""
	// means amd64. The daemon hands each node the agent built for it.
	Arch string `json:"arch,omitempty"`
	// PriceSource says where PricePerHour comes from and PriceAsOf when
	// that source last said so, so status can show how old prices are.
	PriceSource string    `json:"price_source,omitempty"`
	PriceAsOf   time.Time `json:"price_as_of,omitzero"`
	// Network is the fast node-to-node path the type supports (EFA, GPU
	// NICs) and its bandwidth; zero for a standard network only.
	Network NetworkInfo `json:"network,omitzero"`
	// VPC is the network the nodes land in: an AWS VPC id ("vpc-…") or a
	// GCP VPC network name; "" when unknown. A file system is reachable
	// only from its own network, so placement excludes offerings in
	// another one.
	VPC string `json:"vpc,omitempty"`
}

// Key identifies an offering independent of its price, e.g. for the
// unavailable-offerings cache and interruption history.
func (o Offering) Key() string {
	return o.Provider + "/" + o.Region + "/" + o.Zone + "/" + o.InstanceType + "/" + string(o.CapacityType)
}

// PricePerGPUHour is the offering's price divided by its GPU count; for
// GPU-less offerings it is the instance price.
func (o Offering) PricePerGPUHour() float64 {
	if o.GPUs <= 0 {
		return o.PricePerHour
	}
	return o.PricePerHour / float64(o.GPUs)
}

// LaunchRequest asks for Count instances of one offering.
type LaunchRequest struct {
	Offering Offering          `json:"offering"`
	Count    int               `json:"count"`
	UserData string            `json:"user_data"` // #cloud-config document
	Tags     map[string]string `json:"tags"`
	// IdempotencyToken makes Create safe to retry: a second Create with the
	// same token returns the instances of the first instead of launching
	// more (EC2 ClientToken, GCE requestId). fleetd derives it from its
	// daemon id and the node id (which carries the fleet incarnation and a
	// random part), so it never repeats across daemons or re-created fleets.
	IdempotencyToken string `json:"idempotency_token"`
	// Network asks for the offering's fast path and a placement group;
	// the zero value launches on the standard network.
	Network NetworkRequest `json:"network,omitzero"`
}

// InstanceState is the provider-side state, coarser than fleetd's node lifecycle.
type InstanceState string

const (
	StatePending    InstanceState = "pending"
	StateRunning    InstanceState = "running"
	StateStopping   InstanceState = "stopping"
	StateTerminated InstanceState = "terminated"
)

// Instance is one VM (or local agent process) as the provider sees it.
type Instance struct {
	ID         string            `json:"id"`
	Offering   Offering          `json:"offering"`
	State      InstanceState     `json:"state"`
	Address    string            `json:"address,omitempty"` // private address agents use
	Tags       map[string]string `json:"tags"`
	LaunchedAt time.Time         `json:"launched_at"`
	// Interruption is set when the provider itself knows the instance is
	// marked for termination (spot request status, preemption).
	Interruption *InterruptionInfo `json:"interruption,omitempty"`
}

// InterruptionInfo is what a provider knows about an announced loss.
type InterruptionInfo struct {
	Kind     string    `json:"kind"` // spot-interruption, rebalance, maintenance, preempted
	Deadline time.Time `json:"deadline"`
}

// Config is a provider block from a fleet spec, decoded against the
// provider's schema and carried as a JSON object. It is passed on every
// call so a provider holds no per-fleet state and a restarted plugin
// process can serve the next call at once.
type Config struct {
	Fleet string          `json:"fleet"`
	Raw   json.RawMessage `json:"raw"`
}

// Decode unmarshals the provider block into v.
func (c Config) Decode(v any) error {
	if len(c.Raw) == 0 {
		return json.Unmarshal([]byte("{}"), v)
	}
	if err := json.Unmarshal(c.Raw, v); err != nil {
		return InvalidConfig(err)
	}
	return nil
}

// DecodeStrict decodes the provider block into v, an empty block as {},
// rejecting attributes v has no field for. Its error is the JSON decoder's,
// for the provider to wrap with its name as an invalid-config error.
func (c Config) DecodeStrict(v any) error {
	raw := bytes.TrimSpace(c.Raw)
	if len(raw) == 0 {
		raw = []byte("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// Info describes a provider.
type Info struct {
	Name   string       `json:"name"`
	Schema ConfigSchema `json:"schema"`
	// NoticeLead is how long before a spot loss the provider warns (2 min AWS, 30 s GCP).
	NoticeLead time.Duration `json:"notice_lead"`
}

// Provider is implemented by every capacity source. Every method that may
// block takes a context first and must honour its cancellation.
type Provider interface {
	Info(ctx context.Context) (Info, error)
	Offerings(ctx context.Context, cfg Config) ([]Offering, error)
	// Create launches instances; idempotent under LaunchRequest.IdempotencyToken.
	Create(ctx context.Context, cfg Config, req LaunchRequest) ([]Instance, error)
	// Get returns one instance or an error matching IsNotFound.
	Get(ctx context.Context, cfg Config, id string) (Instance, error)
	// List returns instances carrying all the given tags (terminated ones may be omitted).
	List(ctx context.Context, cfg Config, tags map[string]string) ([]Instance, error)
	// Delete terminates an instance; deleting an absent or terminated instance is not an error.
	Delete(ctx context.Context, cfg Config, id string) error
}

// Interrupter is implemented by providers that can inject an interruption
// notice (local, sim): used by `fleetd debug interrupt` and tests.
type Interrupter interface {
	Interrupt(ctx context.Context, cfg Config, id string, info InterruptionInfo) error
}

// HasTags reports whether have carries every tag of want, with its value:
// the filter List applies.
func HasTags(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}
