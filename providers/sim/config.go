package sim

import (
	"fmt"
	"time"

	"github.com/fleetd/fleetd/providers"
)

// Name is the provider name used in `provider "sim"` blocks.
const Name = "sim"

// Defaults of the provider block.
const (
	DefaultLaunchLatency = 2 * time.Minute
	DefaultChangeover    = 12 * time.Minute // 0.2 h, as in Can't Be Late and SkyNomad
	DefaultInstanceType  = "sim.gpu1"
	DefaultGPUType       = "sim-gpu"
	DefaultVCPUs         = 8
	DefaultMemoryGiB     = 61
)

// NoticeLeadOf is a cloud's spot interruption notice lead: 2 min on AWS,
// 30 s on GCP and Azure; unknown clouds get AWS's.
func NoticeLeadOf(cloud string) time.Duration {
	switch cloud {
	case "gcp", "azure":
		return 30 * time.Second
	}
	return 2 * time.Minute
}

// Schema is the schema of a `provider "sim"` block.
var Schema = providers.ConfigSchema{Attributes: []providers.Attribute{
	{Name: "trace", Type: providers.TypeString, Required: true, Description: "Trace directory (docs/sim.md): series CSV/JSON files, optional trace.json and spot_prices.json."},
	{Name: "zones", Type: providers.TypeListString, Description: "Zones to offer (default: every zone of the trace)."},
	{Name: "cloud", Type: providers.TypeString, Description: "Cloud of series that do not name one: sets the notice lead (aws 2m, gcp/azure 30s)."},
	{Name: "instance_type", Type: providers.TypeString, Description: "Instance type of series that do not name one (default \"sim.gpu1\")."},
	{Name: "gpus", Type: providers.TypeNumber, Description: "GPUs per instance for series that do not say (default 1)."},
	{Name: "gpu_type", Type: providers.TypeString, Description: "GPU type for series that do not say (default \"sim-gpu\")."},
	{Name: "vcpus", Type: providers.TypeNumber, Description: "vCPUs per instance for series that do not say (default 8)."},
	{Name: "memory_gib", Type: providers.TypeNumber, Description: "Memory per instance for series that do not say (default 61)."},
	{Name: "on_demand_price", Type: providers.TypeNumber, Description: "On-demand $/h; overrides the trace's."},
	{Name: "spot_price", Type: providers.TypeNumber, Description: "Constant spot $/h for series without per-tick prices."},
	{Name: "notice_lead", Type: providers.TypeString, Description: "Interruption notice lead for every zone; overrides the clouds' (aws 2m, gcp/azure 30s)."},
	{Name: "launch_latency", Type: providers.TypeString, Description: "Time from launch until the instance runs and its agent joins (default \"2m\")."},
	{Name: "changeover", Type: providers.TypeString, Description: "Total cost of one (re)start in time, launch latency included: launch, setup and lost progress (default \"12m\"). Used by fleetd sim's job model."},
	{Name: "start", Type: providers.TypeString, Description: "Daemon mode: trace time the provider's clock starts at, RFC 3339 or an offset from the trace start such as \"36h\" (default: the trace start)."},
	{Name: "speed", Type: providers.TypeNumber, Description: "Daemon mode: virtual seconds per real second (default 1)."},
	{Name: "capacity_scale", Type: providers.TypeNumber, Description: "Multiplies every series' spot capacity (default 1): a 0/1 probe trace stands for pools of this many instances, for multi-node fleets."},
	{Name: "checkpoint_gb", Type: providers.TypeNumber, Description: "fleetd sim: the job's checkpoint size in GB; every (re)start restores it, charged egress from checkpoint_region and restore time (default 0: none)."},
	{Name: "checkpoint_region", Type: providers.TypeString, Description: "fleetd sim: region of the checkpoint store (default: the region of the trace's first zone)."},
	{Name: "restore_mib_per_s", Type: providers.TypeNumber, Description: "fleetd sim: restore throughput in MiB/s (default 200)."},
}}

// Config is the decoded provider block.
type Config struct {
	Trace string   `json:"trace"`
	Zones []string `json:"zones,omitempty"`
	Cloud string   `json:"cloud,omitempty"`
	// Instance is for the series whose trace does not say; on_demand_price
	// and notice_lead override what it says.
	Instance
	LaunchLatency string  `json:"launch_latency,omitempty"`
	Changeover    string  `json:"changeover,omitempty"`
	Start         string  `json:"start,omitempty"`
	Speed         float64 `json:"speed,omitempty"`
	// CapacityScale multiplies the series' spot capacity (0: 1).
	CapacityScale int `json:"capacity_scale,omitempty"`
	// The checkpoint fleetd sim restores at every (re)start.
	CheckpointGB     float64 `json:"checkpoint_gb,omitempty"`
	CheckpointRegion string  `json:"checkpoint_region,omitempty"`
	RestoreMiBps     float64 `json:"restore_mib_per_s,omitempty"`
}

// DecodeConfig decodes and checks a provider block; errors are
// invalid-config errors.
func DecodeConfig(cfg providers.Config) (Config, error) {
	var c Config
	if err := cfg.DecodeStrict(&c); err != nil {
		return c, providers.InvalidConfig(fmt.Errorf("sim provider block: %w", err))
	}
	if c.Trace == "" {
		return c, providers.Errorf(providers.KindInvalidConfig, "sim provider block: trace is required")
	}
	if c.GPUs < 0 || c.VCPUs < 0 || c.MemoryGiB < 0 || c.OnDemandPrice < 0 || c.SpotPrice < 0 || c.Speed < 0 {
		return c, providers.Errorf(providers.KindInvalidConfig, "sim provider block: negative gpus, vcpus, memory_gib, price or speed")
	}
	if c.CapacityScale < 0 || c.CapacityScale > 1<<20 {
		return c, providers.Errorf(providers.KindInvalidConfig, "sim provider block: capacity_scale must be in 1..%d", 1<<20)
	}
	if c.CheckpointGB < 0 || c.RestoreMiBps < 0 {
		return c, providers.Errorf(providers.KindInvalidConfig, "sim provider block: negative checkpoint_gb or restore_mib_per_s")
	}
	for name, s := range map[string]string{"notice_lead": c.NoticeLead, "launch_latency": c.LaunchLatency, "changeover": c.Changeover} {
		if s == "" {
			continue
		}
		if d, err := time.ParseDuration(s); err != nil || d < 0 {
			return c, providers.Errorf(providers.KindInvalidConfig, "sim provider block: %s %q: want a non-negative Go duration", name, s)
		}
	}
	if l, d := c.LaunchLatencyDuration(), c.ChangeoverDuration(); l > d {
		return c, providers.Errorf(providers.KindInvalidConfig, "sim provider block: launch_latency %s exceeds changeover %s (the changeover includes the launch)", l, d)
	}
	return c, nil
}

func durationOr(s string, def time.Duration) time.Duration {
	if s == "" {
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return def
	}
	return d
}

// LaunchLatencyDuration is launch_latency or its default.
func (c Config) LaunchLatencyDuration() time.Duration {
	return durationOr(c.LaunchLatency, DefaultLaunchLatency)
}

// ChangeoverDuration is changeover or its default.
func (c Config) ChangeoverDuration() time.Duration {
	return durationOr(c.Changeover, DefaultChangeover)
}

// StartOffset resolves start against a trace: an RFC 3339 time or an
// offset from the trace's start.
func (c Config) StartOffset(tr *Trace) (time.Duration, error) {
	if c.Start == "" {
		return 0, nil
	}
	if t, err := time.Parse(time.RFC3339, c.Start); err == nil {
		return t.Sub(tr.Start), nil
	}
	d, err := time.ParseDuration(c.Start)
	if err != nil {
		return 0, providers.Errorf(providers.KindInvalidConfig, "sim provider block: start %q: want RFC 3339 or a duration", c.Start)
	}
	return d, nil
}
