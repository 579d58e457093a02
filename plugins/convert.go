package plugins

import (
	"fmt"
	"math"
	"time"

	providerv1 "github.com/fleetd/fleetd/plugins/proto/provider/v1"
	"github.com/fleetd/fleetd/providers"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Conversions between providers types and their wire form. Zero times
// travel as an unset Timestamp so they come back as time.Time{}, not as
// the Unix epoch.

func configToPB(c providers.Config) *providerv1.Config {
	return &providerv1.Config{Fleet: c.Fleet, RawJson: c.Raw}
}

func configFromPB(c *providerv1.Config) providers.Config {
	if c == nil {
		return providers.Config{}
	}
	return providers.Config{Fleet: c.GetFleet(), Raw: c.GetRawJson()}
}

func timeToPB(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func timeFromPB(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime()
}

func durationToPB(d time.Duration) *durationpb.Duration {
	if d == 0 {
		return nil
	}
	return durationpb.New(d)
}

func durationFromPB(d *durationpb.Duration) time.Duration {
	if d == nil {
		return 0
	}
	return d.AsDuration()
}

// toInt32 guards the int → int32 narrowing the wire format imposes.
func toInt32(field string, v int) (int32, error) {
	if v > math.MaxInt32 || v < math.MinInt32 {
		return 0, providers.Errorf(providers.KindInvalidConfig, "%s %d does not fit the plugin protocol", field, v)
	}
	return int32(v), nil
}

func infoToPB(i providers.Info) *providerv1.InfoResponse {
	attrs := make([]*providerv1.Attribute, 0, len(i.Schema.Attributes))
	for _, a := range i.Schema.Attributes {
		attrs = append(attrs, &providerv1.Attribute{Name: a.Name, Type: string(a.Type), Required: a.Required, Description: a.Description})
	}
	return &providerv1.InfoResponse{
		Name:       i.Name,
		Schema:     &providerv1.ConfigSchema{Attributes: attrs},
		NoticeLead: durationToPB(i.NoticeLead),
	}
}

func infoFromPB(r *providerv1.InfoResponse) providers.Info {
	info := providers.Info{Name: r.GetName(), NoticeLead: durationFromPB(r.GetNoticeLead())}
	for _, a := range r.GetSchema().GetAttributes() {
		info.Schema.Attributes = append(info.Schema.Attributes, providers.Attribute{
			Name: a.GetName(), Type: providers.AttrType(a.GetType()), Required: a.GetRequired(), Description: a.GetDescription(),
		})
	}
	return info
}

func offeringToPB(o providers.Offering) (*providerv1.Offering, error) {
	gpus, err := toInt32("gpus", o.GPUs)
	if err != nil {
		return nil, err
	}
	vcpus, err := toInt32("vcpus", o.VCPUs)
	if err != nil {
		return nil, err
	}
	avail, err := toInt32("available", o.Available)
	if err != nil {
		return nil, err
	}
	score, err := toInt32("placement_score", o.PlacementScore)
	if err != nil {
		return nil, err
	}
	return &providerv1.Offering{
		PlacementScore:     score,
		PlacementScoreNote: o.PlacementScoreNote,
		Arch:               o.Arch,
		PriceSource:        o.PriceSource,
		PriceAsOf:          timeToPB(o.PriceAsOf),
		Provider:           o.Provider,
		Region:             o.Region,
		Zone:               o.Zone,
		InstanceType:       o.InstanceType,
		CapacityType:       string(o.CapacityType),
		PricePerHour:       o.PricePerHour,
		Gpus:               gpus,
		GpuType:            o.GPUType,
		Vcpus:              vcpus,
		MemoryGib:          o.MemoryGiB,
		Available:          avail,
		Network:            networkInfoToPB(o.Network),
	}, nil
}

func networkInfoToPB(n providers.NetworkInfo) *providerv1.NetworkInfo {
	if n == (providers.NetworkInfo{}) {
		return nil
	}
	// Interface counts are tens at most; the cast cannot overflow.
	return &providerv1.NetworkInfo{Fabric: n.Fabric, Interfaces: int32(min(n.Interfaces, math.MaxInt32)), BandwidthGbps: n.BandwidthGbps}
}

func networkInfoFromPB(n *providerv1.NetworkInfo) providers.NetworkInfo {
	if n == nil {
		return providers.NetworkInfo{}
	}
	return providers.NetworkInfo{Fabric: n.GetFabric(), Interfaces: int(n.GetInterfaces()), BandwidthGbps: n.GetBandwidthGbps()}
}

func networkRequestToPB(r providers.NetworkRequest) *providerv1.NetworkRequest {
	if !r.Fabric && r.Group == "" && len(r.GroupTags) == 0 {
		return nil
	}
	return &providerv1.NetworkRequest{Fabric: r.Fabric, Group: r.Group, GroupTags: r.GroupTags}
}

func networkRequestFromPB(r *providerv1.NetworkRequest) providers.NetworkRequest {
	if r == nil {
		return providers.NetworkRequest{}
	}
	return providers.NetworkRequest{Fabric: r.GetFabric(), Group: r.GetGroup(), GroupTags: r.GetGroupTags()}
}

func offeringFromPB(o *providerv1.Offering) providers.Offering {
	return providers.Offering{
		Provider:     o.GetProvider(),
		Region:       o.GetRegion(),
		Zone:         o.GetZone(),
		InstanceType: o.GetInstanceType(),
		CapacityType: providers.CapacityType(o.GetCapacityType()),
		PricePerHour: o.GetPricePerHour(),
		GPUs:         int(o.GetGpus()),
		GPUType:      o.GetGpuType(),
		VCPUs:        int(o.GetVcpus()),
		MemoryGiB:    o.GetMemoryGib(),
		Available:    int(o.GetAvailable()),

		PlacementScore:     int(o.GetPlacementScore()),
		PlacementScoreNote: o.GetPlacementScoreNote(),
		Arch:               o.GetArch(),
		PriceSource:        o.GetPriceSource(),
		PriceAsOf:          timeFromPB(o.GetPriceAsOf()),
		Network:            networkInfoFromPB(o.GetNetwork()),
	}
}

func checkResultsToPB(rs []providers.CheckResult) []*providerv1.CheckResult {
	out := make([]*providerv1.CheckResult, 0, len(rs))
	for _, r := range rs {
		out = append(out, &providerv1.CheckResult{Check: r.Check, Scope: r.Scope, Status: string(r.Status), Detail: r.Detail, Fix: r.Fix})
	}
	return out
}

func checkResultsFromPB(rs []*providerv1.CheckResult) []providers.CheckResult {
	out := make([]providers.CheckResult, 0, len(rs))
	for _, r := range rs {
		out = append(out, providers.CheckResult{Check: r.GetCheck(), Scope: r.GetScope(), Status: providers.CheckStatus(r.GetStatus()), Detail: r.GetDetail(), Fix: r.GetFix()})
	}
	return out
}

func offeringsToPB(offs []providers.Offering) ([]*providerv1.Offering, error) {
	out := make([]*providerv1.Offering, 0, len(offs))
	for i, o := range offs {
		p, err := offeringToPB(o)
		if err != nil {
			return nil, fmt.Errorf("offering %d (%s): %w", i, o.Key(), err)
		}
		out = append(out, p)
	}
	return out, nil
}

func offeringsFromPB(offs []*providerv1.Offering) []providers.Offering {
	out := make([]providers.Offering, 0, len(offs))
	for _, o := range offs {
		out = append(out, offeringFromPB(o))
	}
	return out
}

func launchToPB(r providers.LaunchRequest) (*providerv1.LaunchRequest, error) {
	off, err := offeringToPB(r.Offering)
	if err != nil {
		return nil, err
	}
	count, err := toInt32("count", r.Count)
	if err != nil {
		return nil, err
	}
	return &providerv1.LaunchRequest{
		Offering:         off,
		Count:            count,
		UserData:         r.UserData,
		Tags:             r.Tags,
		IdempotencyToken: r.IdempotencyToken,
		Network:          networkRequestToPB(r.Network),
	}, nil
}

func launchFromPB(r *providerv1.LaunchRequest) providers.LaunchRequest {
	return providers.LaunchRequest{
		Offering:         offeringFromPB(r.GetOffering()),
		Count:            int(r.GetCount()),
		UserData:         r.GetUserData(),
		Tags:             r.GetTags(),
		IdempotencyToken: r.GetIdempotencyToken(),
		Network:          networkRequestFromPB(r.GetNetwork()),
	}
}

func interruptionToPB(i *providers.InterruptionInfo) *providerv1.InterruptionInfo {
	if i == nil {
		return nil
	}
	return &providerv1.InterruptionInfo{Kind: i.Kind, Deadline: timeToPB(i.Deadline)}
}

func interruptionFromPB(i *providerv1.InterruptionInfo) *providers.InterruptionInfo {
	if i == nil {
		return nil
	}
	return &providers.InterruptionInfo{Kind: i.GetKind(), Deadline: timeFromPB(i.GetDeadline())}
}

func instanceToPB(in providers.Instance) (*providerv1.Instance, error) {
	off, err := offeringToPB(in.Offering)
	if err != nil {
		return nil, err
	}
	return &providerv1.Instance{
		Id:           in.ID,
		Offering:     off,
		State:        string(in.State),
		Address:      in.Address,
		Tags:         in.Tags,
		LaunchedAt:   timeToPB(in.LaunchedAt),
		Interruption: interruptionToPB(in.Interruption),
	}, nil
}

func instanceFromPB(in *providerv1.Instance) providers.Instance {
	return providers.Instance{
		ID:           in.GetId(),
		Offering:     offeringFromPB(in.GetOffering()),
		State:        providers.InstanceState(in.GetState()),
		Address:      in.GetAddress(),
		Tags:         in.GetTags(),
		LaunchedAt:   timeFromPB(in.GetLaunchedAt()),
		Interruption: interruptionFromPB(in.GetInterruption()),
	}
}

func instancesToPB(ins []providers.Instance) ([]*providerv1.Instance, error) {
	out := make([]*providerv1.Instance, 0, len(ins))
	for _, in := range ins {
		p, err := instanceToPB(in)
		if err != nil {
			return nil, fmt.Errorf("instance %s: %w", in.ID, err)
		}
		out = append(out, p)
	}
	return out, nil
}

func instancesFromPB(ins []*providerv1.Instance) []providers.Instance {
	out := make([]providers.Instance, 0, len(ins))
	for _, in := range ins {
		out = append(out, instanceFromPB(in))
	}
	return out
}
