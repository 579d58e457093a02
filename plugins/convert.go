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

// narrowing applies toInt32 to several fields, keeping the first error,
// so a message is built in one expression and checked once.
type narrowing struct{ err error }

func (n *narrowing) int32(field string, v int) int32 {
	if n.err != nil {
		return 0
	}
	x, err := toInt32(field, v)
	n.err = err
	return x
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
	var n narrowing // fields in wire order: the first too large is reported
	pb := &providerv1.Offering{
		Provider:           o.Provider,
		Region:             o.Region,
		Zone:               o.Zone,
		InstanceType:       o.InstanceType,
		CapacityType:       string(o.CapacityType),
		PricePerHour:       o.PricePerHour,
		Gpus:               n.int32("gpus", o.GPUs),
		GpuType:            o.GPUType,
		Vcpus:              n.int32("vcpus", o.VCPUs),
		MemoryGib:          o.MemoryGiB,
		Available:          n.int32("available", o.Available),
		PlacementScore:     n.int32("placement_score", o.PlacementScore),
		PlacementScoreNote: o.PlacementScoreNote,
		Arch:               o.Arch,
		PriceSource:        o.PriceSource,
		PriceAsOf:          timeToPB(o.PriceAsOf),
		Network:            networkInfoToPB(o.Network),
		Vpc:                o.VPC,
	}
	if n.err != nil {
		return nil, n.err
	}
	return pb, nil
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
		VPC:                o.GetVpc(),
	}
}

// each converts every element of a list (an empty list, never nil).
func each[A, B any](as []A, conv func(A) B) []B {
	out := make([]B, 0, len(as))
	for _, a := range as {
		out = append(out, conv(a))
	}
	return out
}

// eachOrErr is each for a conversion that can fail; the error names the
// element (what) that failed.
func eachOrErr[A, B any](as []A, conv func(A) (B, error), what func(i int, a A) string) ([]B, error) {
	out := make([]B, 0, len(as))
	for i, a := range as {
		b, err := conv(a)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what(i, a), err)
		}
		out = append(out, b)
	}
	return out, nil
}

func fileSystemsToPB(fs []providers.FileSystemCheck) []*providerv1.FileSystemCheck {
	if len(fs) == 0 {
		return nil
	}
	out := make([]*providerv1.FileSystemCheck, len(fs))
	for i, f := range fs {
		out[i] = &providerv1.FileSystemCheck{Source: f.Source, Scheme: f.Scheme, Host: f.Host, Path: f.Path,
			Region: f.Region, Zone: f.Zone, Zones: f.Zones}
	}
	return out
}

func fileSystemsFromPB(fs []*providerv1.FileSystemCheck) []providers.FileSystemCheck {
	if len(fs) == 0 {
		return nil
	}
	out := make([]providers.FileSystemCheck, len(fs))
	for i, f := range fs {
		out[i] = providers.FileSystemCheck{Source: f.GetSource(), Scheme: f.GetScheme(), Host: f.GetHost(), Path: f.GetPath(),
			Region: f.GetRegion(), Zone: f.GetZone(), Zones: f.GetZones()}
	}
	return out
}

func checkResultsToPB(rs []providers.CheckResult) []*providerv1.CheckResult {
	return each(rs, func(r providers.CheckResult) *providerv1.CheckResult {
		return &providerv1.CheckResult{Check: r.Check, Scope: r.Scope, Status: string(r.Status), Detail: r.Detail, Fix: r.Fix}
	})
}

func checkResultsFromPB(rs []*providerv1.CheckResult) []providers.CheckResult {
	return each(rs, func(r *providerv1.CheckResult) providers.CheckResult {
		return providers.CheckResult{Check: r.GetCheck(), Scope: r.GetScope(), Status: providers.CheckStatus(r.GetStatus()), Detail: r.GetDetail(), Fix: r.GetFix()}
	})
}

func offeringsToPB(offs []providers.Offering) ([]*providerv1.Offering, error) {
	return eachOrErr(offs, offeringToPB, func(i int, o providers.Offering) string { return fmt.Sprintf("offering %d (%s)", i, o.Key()) })
}

func offeringsFromPB(offs []*providerv1.Offering) []providers.Offering {
	return each(offs, offeringFromPB)
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
	return eachOrErr(ins, instanceToPB, func(_ int, in providers.Instance) string { return "instance " + in.ID })
}

func instancesFromPB(ins []*providerv1.Instance) []providers.Instance {
	return each(ins, instanceFromPB)
}
