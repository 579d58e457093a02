package gcp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/fleetd/fleetd/internal/ctxtime"
	"github.com/fleetd/fleetd/providers"
	"google.golang.org/protobuf/proto"
)

// Metadata keys fleetd sets on its instances besides user-data. The exact
// tags and offering live here because labels are lossy (see labelKey).
const (
	MetaUserData = "user-data"
	MetaTags     = "fleetd-tags"
	MetaOffering = "fleetd-offering"
	MetaLaunch   = "fleetd-launch" // hash of (fleet, token): who may adopt the name
)

// Operation types recorded in a zone's operations for an instance.
const (
	OpPreempted = "compute.instances.preempted"
	opDelete    = "delete"
	opStop      = "stop"
	opSuspend   = "suspend"
)

// Create launches req.Count instances of the offering, in parallel. Each
// insert carries a requestId and an instance name derived from the
// idempotency token, so a retried Create returns the instances of the
// first. When some launches fail, the ones that succeeded are returned
// with the (first) error.
func (p *Provider) Create(ctx context.Context, cfg providers.Config, req providers.LaunchRequest) ([]providers.Instance, error) {
	c, cl, err := p.setup(ctx, cfg)
	if err != nil {
		return nil, err
	}
	off := req.Offering
	if off.Provider != "" && off.Provider != Name {
		return nil, providers.Errorf(providers.KindInvalidConfig, "gcp: offering %s is not a gcp offering", off.Key())
	}
	if !zoneRE.MatchString(off.Zone) || !typeRE.MatchString(off.InstanceType) {
		return nil, providers.Errorf(providers.KindInvalidConfig, "gcp: offering %s has no valid zone and machine type", off.Key())
	}
	if off.CapacityType != providers.Spot && off.CapacityType != providers.OnDemand {
		return nil, providers.Errorf(providers.KindInvalidConfig, "gcp: offering %s: unknown capacity type %q", off.Key(), off.CapacityType)
	}
	if req.Count < 1 {
		return nil, providers.Errorf(providers.KindInvalidConfig, "gcp: count %d < 1", req.Count)
	}
	token := req.IdempotencyToken
	if token == "" {
		// No token, no idempotency: make each call distinct.
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		token = "random-" + hex.EncodeToString(b)
	}
	fleet := req.Tags[providers.TagFleet]
	if fleet == "" {
		fleet = c.fleet
	}

	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		out  = make([]*providers.Instance, req.Count)
		errs = make([]error, req.Count)
	)
	for i := range req.Count {
		wg.Go(func() {
			in, err := p.launchOne(ctx, cl, c, req, fleet, token, i)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs[i] = err
				return
			}
			out[i] = &in
		})
	}
	wg.Wait()
	var launched []providers.Instance
	for _, in := range out {
		if in != nil {
			launched = append(launched, *in)
		}
	}
	for _, err := range errs {
		if err != nil {
			return launched, err
		}
	}
	return launched, nil
}

// launchOne inserts instance i of a request and waits for it.
func (p *Provider) launchOne(ctx context.Context, cl *clients, c *config, req providers.LaunchRequest, fleet, token string, i int) (providers.Instance, error) {
	off := req.Offering
	offKey := off.Key()
	zone := off.Zone
	name := instanceName(req.Tags[providers.TagNodeID], fleet, token, i, req.Count)
	launch := shortHash("launch\x00"+fleet+"\x00"+token, 32)
	res, err := p.instanceResource(c, req, name, launch)
	if err != nil {
		return providers.Instance{}, err
	}
	if req.Network.Group != "" {
		g := policyName(req.Network, zone)
		if err := p.ensurePolicy(ctx, cl, c, regionOf(zone), g, req.Network.GroupTags); err != nil {
			return providers.Instance{}, err
		}
	}
	rid := requestID("insert", fleet, token, offKey, strconv.Itoa(i))
	started := time.Now()
	for attempt := 0; ; attempt++ {
		op, err := cl.instances.Insert(ctx, &computepb.InsertInstanceRequest{
			Project: c.Project, Zone: zone, RequestId: proto.String(rid), InstanceResource: res,
		})
		if err != nil {
			if a, ok := classifyAPI(err); ok && a.class == classExists {
				return p.adopt(ctx, cl, c, zone, name, launch, offKey)
			}
			if a, ok := classifyAPI(err); ok && a.class == classNotFound {
				return providers.Instance{}, &providers.Error{Kind: providers.KindInvalidConfig, Code: a.code, Offering: offKey, Err: fmt.Errorf("gcp: insert %s in %s: %w", name, zone, err)}
			}
			return providers.Instance{}, mapErr(err, "insert "+name+" in "+zone, offKey)
		}
		done, err := p.wait(ctx, cl, c.Project, zone, op.Proto())
		if err != nil {
			return providers.Instance{}, mapErr(err, "wait for insert of "+name, offKey)
		}
		cls, code, ferr := opFailure(done)
		if ferr == nil {
			break
		}
		// GCE answers a known requestId with the original operation for a
		// while. If that operation failed before this call began, it is a
		// stale answer to an earlier attempt (the offering was, say, out of
		// stock then): launch again under a requestId derived from the
		// failed operation, which concurrent retries derive alike.
		if t, err := time.Parse(time.RFC3339Nano, done.GetInsertTime()); attempt == 0 && err == nil && t.Before(started.Add(-2*time.Second)) {
			rid = requestID("insert", fleet, token, offKey, strconv.Itoa(i), "after", done.GetName())
			continue
		}
		if cls == classExists {
			return p.adopt(ctx, cl, c, zone, name, launch, offKey)
		}
		return providers.Instance{}, opErr(cls, code, ferr, offKey)
	}
	got, err := cl.instances.Get(ctx, &computepb.GetInstanceRequest{Project: c.Project, Zone: zone, Instance: name})
	if err != nil {
		return providers.Instance{}, mapErr(err, "get "+name+" after insert", offKey)
	}
	return p.convert(ctx, cl, c, got)
}

// adopt returns the existing instance of a name this launch owns: the
// instance an earlier attempt of the same (fleet, token) created. Another
// launch's instance of the same name is a conflict, not ours to return.
func (p *Provider) adopt(ctx context.Context, cl *clients, c *config, zone, name, launch, offKey string) (providers.Instance, error) {
	got, err := cl.instances.Get(ctx, &computepb.GetInstanceRequest{Project: c.Project, Zone: zone, Instance: name})
	if err != nil {
		return providers.Instance{}, mapErr(err, "get existing "+name, offKey)
	}
	if metaValue(got, MetaLaunch) != launch {
		return providers.Instance{}, &providers.Error{Kind: providers.KindInvalidConfig, Code: "alreadyExists", Offering: offKey,
			Err: fmt.Errorf("gcp: instance %s/%s exists but was not created by this launch", zone, name)}
	}
	return p.convert(ctx, cl, c, got)
}

// instanceResource builds the insert body.
func (p *Provider) instanceResource(c *config, req providers.LaunchRequest, name, launch string) (*computepb.Instance, error) {
	off := req.Offering
	zone, region := off.Zone, regionOf(off.Zone)
	tags, err := json.Marshal(req.Tags)
	if err != nil {
		return nil, providers.InvalidConfig(fmt.Errorf("gcp: tags: %w", err))
	}
	offJSON, err := json.Marshal(off)
	if err != nil {
		return nil, providers.InvalidConfig(fmt.Errorf("gcp: offering: %w", err))
	}
	labels := map[string]string{}
	for k, v := range req.Tags {
		labels[labelKey(k)] = labelValue(v)
	}
	if len(labels) > 64 {
		return nil, providers.Errorf(providers.KindInvalidConfig, "gcp: %d tags, GCE allows at most 64 labels", len(labels))
	}
	spot := off.CapacityType == providers.Spot
	gpus := off.GPUs > 0
	sched := &computepb.Scheduling{
		AutomaticRestart: proto.Bool(false), // fleetd replaces nodes; a silent restart would only confuse rendezvous
		OnHostMaintenance: proto.String(func() string {
			if spot || gpus {
				return computepb.Scheduling_TERMINATE.String() // GPUs cannot live-migrate
			}
			return computepb.Scheduling_MIGRATE.String()
		}()),
	}
	if spot {
		sched.ProvisioningModel = proto.String(computepb.Scheduling_SPOT.String())
		// DELETE, not the default STOP: a stopped Spot VM keeps its disk
		// and address and would have to be cleaned up.
		sched.InstanceTerminationAction = proto.String(computepb.Scheduling_DELETE.String())
	} else {
		sched.ProvisioningModel = proto.String(computepb.Scheduling_STANDARD.String())
	}
	nic := &computepb.NetworkInterface{Network: proto.String(c.network())}
	if sub := c.subnetwork(region); sub != "" {
		nic.Subnetwork = proto.String(sub)
	}
	if c.externalIP() {
		nic.AccessConfigs = []*computepb.AccessConfig{{
			Name: proto.String("External NAT"), Type: proto.String(computepb.AccessConfig_ONE_TO_ONE_NAT.String()),
		}}
	}
	res := &computepb.Instance{
		Name:        proto.String(name),
		Description: proto.String(fmt.Sprintf("fleetd node %s of fleet %s", req.Tags[providers.TagNodeID], req.Tags[providers.TagFleet])),
		MachineType: proto.String("zones/" + zone + "/machineTypes/" + off.InstanceType),
		Labels:      labels,
		Scheduling:  sched,
		Disks: []*computepb.AttachedDisk{{
			Boot: proto.Bool(true), AutoDelete: proto.Bool(true),
			Type: proto.String(computepb.AttachedDisk_PERSISTENT.String()),
			InitializeParams: &computepb.AttachedDiskInitializeParams{
				SourceImage: proto.String(c.Image), DiskSizeGb: proto.Int64(c.diskSizeGB()), DiskType: proto.String(c.diskType(zone)),
			},
		}},
		NetworkInterfaces: []*computepb.NetworkInterface{nic},
		Metadata: &computepb.Metadata{Items: []*computepb.Items{
			{Key: proto.String(MetaUserData), Value: proto.String(req.UserData)},
			{Key: proto.String(MetaTags), Value: proto.String(string(tags))},
			{Key: proto.String(MetaOffering), Value: proto.String(string(offJSON))},
			{Key: proto.String(MetaLaunch), Value: proto.String(launch)},
		}},
	}
	if err := applyNetwork(c, res, req); err != nil {
		return nil, err
	}
	if c.ServiceAccount != "" {
		res.ServiceAccounts = []*computepb.ServiceAccount{{Email: proto.String(c.ServiceAccount), Scopes: c.scopes()}}
	}
	if gpus && attachable(off.InstanceType) {
		if c.accel == nil {
			return nil, providers.Errorf(providers.KindInvalidConfig, "gcp: offering %s has %d GPUs but the block attaches no accelerators", off.Key(), off.GPUs)
		}
		res.GuestAccelerators = []*computepb.AcceleratorConfig{{
			AcceleratorType:  proto.String("zones/" + zone + "/acceleratorTypes/" + c.accel.Type),
			AcceleratorCount: proto.Int32(int32(c.accel.Count)),
		}}
	}
	return res, nil
}

// wait polls a zone operation with operations.wait until it is DONE.
func (p *Provider) wait(ctx context.Context, cl *clients, project, zone string, op *computepb.Operation) (*computepb.Operation, error) {
	for op.GetStatus() != computepb.Operation_DONE {
		start := time.Now()
		next, err := cl.ops.Wait(ctx, &computepb.WaitZoneOperationRequest{Project: project, Zone: zone, Operation: op.GetName()})
		if err != nil {
			return nil, err
		}
		op = next
		if op.GetStatus() != computepb.Operation_DONE {
			if err := ctxtime.Sleep(ctx, p.opts.PollInterval-time.Since(start)); err != nil {
				return nil, err
			}
		}
	}
	return op, nil
}

// Get returns one instance; an id that is not a "ZONE/NAME" is not found.
func (p *Provider) Get(ctx context.Context, cfg providers.Config, id string) (providers.Instance, error) {
	c, cl, err := p.setup(ctx, cfg)
	if err != nil {
		return providers.Instance{}, err
	}
	zone, name, ok := ParseInstanceID(id)
	if !ok {
		return providers.Instance{}, providers.NotFound(fmt.Errorf("gcp: %q is not a gcp instance id (ZONE/NAME)", id))
	}
	got, err := cl.instances.Get(ctx, &computepb.GetInstanceRequest{Project: c.Project, Zone: zone, Instance: name})
	if err != nil {
		return providers.Instance{}, mapErr(err, "get "+id, "")
	}
	return p.convert(ctx, cl, c, got)
}

// List returns the fleetd instances of the project carrying all tags,
// across every zone (instances in zones no longer in the block included,
// so orphans are found). The label filter runs server-side; the exact
// tags are then checked against the metadata copy.
func (p *Provider) List(ctx context.Context, cfg providers.Config, tags map[string]string) ([]providers.Instance, error) {
	c, cl, err := p.setup(ctx, cfg)
	if err != nil {
		return nil, err
	}
	it := cl.instances.AggregatedList(ctx, &computepb.AggregatedListInstancesRequest{
		Project: c.Project, Filter: proto.String(labelFilter(tags)), MaxResults: proto.Uint32(uint32(p.opts.PageSize)),
	})
	var out []providers.Instance
	for pair, err := range it.All() {
		if err != nil {
			return nil, mapErr(err, "list instances", "")
		}
		for _, got := range pair.Value.GetInstances() {
			in, err := p.convert(ctx, cl, c, got)
			if err != nil {
				return nil, err
			}
			if providers.HasTags(in.Tags, tags) {
				out = append(out, in)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// labelFilter is the server-side filter of List: fleetd instances (those
// with a fleet label) with every tag's label.
func labelFilter(tags map[string]string) string {
	terms := []string{"(labels." + providers.TagFleet + ":*)"}
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		terms = append(terms, fmt.Sprintf("(labels.%s = %s)", labelKey(k), strconv.Quote(labelValue(tags[k]))))
	}
	return strings.Join(terms, " ")
}

// Delete deletes an instance and waits for the deletion; an absent
// instance (or an id that is not one of ours) is already deleted.
func (p *Provider) Delete(ctx context.Context, cfg providers.Config, id string) error {
	c, cl, err := p.setup(ctx, cfg)
	if err != nil {
		return err
	}
	zone, name, ok := ParseInstanceID(id)
	if !ok {
		return nil
	}
	op, err := cl.instances.Delete(ctx, &computepb.DeleteInstanceRequest{Project: c.Project, Zone: zone, Instance: name})
	if err != nil {
		if err := mapErr(err, "delete "+id, ""); !providers.IsNotFound(err) {
			return err
		}
		return nil
	}
	done, err := p.wait(ctx, cl, c.Project, zone, op.Proto())
	if err != nil {
		return mapErr(err, "wait for delete of "+id, "")
	}
	if cls, code, ferr := opFailure(done); ferr != nil && cls != classNotFound {
		if kind := kindOf(cls); kind != "" {
			return &providers.Error{Kind: kind, Code: code, Err: fmt.Errorf("gcp: %w", ferr)}
		}
		return fmt.Errorf("gcp: %w", ferr)
	}
	return nil
}

// convert turns a GCE instance into a provider instance.
func (p *Provider) convert(ctx context.Context, cl *clients, c *config, got *computepb.Instance) (providers.Instance, error) {
	zone := lastSegment(got.GetZone())
	in := providers.Instance{
		ID:    InstanceID(zone, got.GetName()),
		State: stateOf(got.GetStatus()),
		Tags:  map[string]string{},
	}
	if err := json.Unmarshal([]byte(metaValue(got, MetaOffering)), &in.Offering); err != nil {
		in.Offering = providers.Offering{Available: -1} // not launched by fleetd, or metadata edited
	}
	in.Offering.Provider, in.Offering.Zone, in.Offering.Region = Name, zone, regionOf(zone)
	in.Offering.InstanceType = lastSegment(got.GetMachineType())
	spot := got.GetScheduling().GetProvisioningModel() == computepb.Scheduling_SPOT.String() || got.GetScheduling().GetPreemptible()
	in.Offering.CapacityType = providers.OnDemand
	if spot {
		in.Offering.CapacityType = providers.Spot
	}
	if err := json.Unmarshal([]byte(metaValue(got, MetaTags)), &in.Tags); err != nil || len(in.Tags) == 0 {
		in.Tags = maps.Clone(got.GetLabels())
		if in.Tags == nil {
			in.Tags = map[string]string{}
		}
	}
	if nics := got.GetNetworkInterfaces(); len(nics) > 0 {
		in.Address = nics[0].GetNetworkIP()
	}
	if t, err := time.Parse(time.RFC3339Nano, got.GetCreationTimestamp()); err == nil {
		in.LaunchedAt = t.UTC()
	}
	if spot && (in.State == providers.StateStopping || in.State == providers.StateTerminated) {
		info, err := p.interruption(ctx, cl, c.Project, zone, got)
		if err != nil {
			return providers.Instance{}, err
		}
		in.Interruption = info
	}
	return in, nil
}

// stateOf maps GCE's instance status.
func stateOf(status string) providers.InstanceState {
	switch status {
	case "PROVISIONING", "STAGING", "REPAIRING", "PENDING":
		return providers.StatePending
	case "RUNNING":
		return providers.StateRunning
	case "STOPPING", "SUSPENDING", "PENDING_STOP":
		return providers.StateStopping
	case "TERMINATED", "STOPPED", "SUSPENDED":
		return providers.StateTerminated
	}
	return providers.StatePending
}

// interruption decides whether a stopping or stopped Spot VM was
// preempted, from its zone's operations: a compute.instances.preempted
// operation says so (and when); a delete, stop or suspend operation says
// someone (fleetd) stopped it. With neither (operations expire), a Spot VM
// that stopped on its own was preempted.
func (p *Provider) interruption(ctx context.Context, cl *clients, project, zone string, got *computepb.Instance) (*providers.InterruptionInfo, error) {
	it := cl.ops.List(ctx, &computepb.ListZoneOperationsRequest{
		Project: project, Zone: zone, Filter: proto.String("targetLink = " + strconv.Quote(got.GetSelfLink())),
		MaxResults: proto.Uint32(uint32(p.opts.PageSize)),
	})
	var preempted *computepb.Operation
	userStop := false
	for op, err := range it.All() {
		if err != nil {
			return nil, mapErr(err, "list operations of "+got.GetName(), "")
		}
		if op.GetTargetId() != got.GetId() {
			continue // an earlier instance of the same name
		}
		switch op.GetOperationType() {
		case OpPreempted:
			preempted = op
		case opDelete, opStop, opSuspend:
			userStop = true
		}
	}
	switch {
	case preempted != nil:
		info := &providers.InterruptionInfo{Kind: "preempted"}
		if t, err := time.Parse(time.RFC3339Nano, preempted.GetInsertTime()); err == nil {
			info.Deadline = t.Add(NoticeLead).UTC()
		}
		return info, nil
	case userStop:
		return nil, nil
	}
	info := &providers.InterruptionInfo{Kind: "preempted"}
	if t, err := time.Parse(time.RFC3339Nano, got.GetLastStopTimestamp()); err == nil {
		info.Deadline = t.Add(NoticeLead).UTC()
	}
	return info, nil
}

func metaValue(in *computepb.Instance, key string) string {
	for _, it := range in.GetMetadata().GetItems() {
		if it.GetKey() == key {
			return it.GetValue()
		}
	}
	return ""
}

func lastSegment(s string) string {
	if i := strings.LastIndexByte(s, '/'); i >= 0 {
		return s[i+1:]
	}
	return s
}
