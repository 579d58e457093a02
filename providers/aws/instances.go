package aws

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/fleetd/fleetd/providers"
)

// instanceIDRe matches EC2 instance ids; anything else cannot exist, so
// Get and Delete answer without asking EC2.
var instanceIDRe = regexp.MustCompile(`^i-[0-9a-f]{8,17}$`)

// spotMarkedCodes are the spot request status codes EC2 sets during the
// two-minute warning.
var spotMarkedCodes = map[string]bool{"marked-for-termination": true, "marked-for-stop": true}

// toInstance converts an EC2 instance; its Offering has no price or shape
// (see describeOffering).
func toInstance(region string, in types.Instance) providers.Instance {
	out := providers.Instance{
		ID:         awssdk.ToString(in.InstanceId),
		Address:    awssdk.ToString(in.PrivateIpAddress),
		LaunchedAt: awssdk.ToTime(in.LaunchTime),
		Tags:       map[string]string{},
		Offering: providers.Offering{
			Provider: Name, Region: region, InstanceType: string(in.InstanceType),
			CapacityType: providers.OnDemand, Available: -1,
		},
	}
	if in.Placement != nil {
		out.Offering.Zone = awssdk.ToString(in.Placement.AvailabilityZone)
	}
	if in.InstanceLifecycle == types.InstanceLifecycleTypeSpot {
		out.Offering.CapacityType = providers.Spot
	}
	if in.State != nil {
		out.State = mapState(in.State.Name)
	}
	for _, t := range in.Tags {
		out.Tags[awssdk.ToString(t.Key)] = awssdk.ToString(t.Value)
	}
	return out
}

// mapState folds EC2's six states into fleetd's four: an instance that is
// stopping, stopped or shutting down is on its way out.
func mapState(s types.InstanceStateName) providers.InstanceState {
	switch s {
	case types.InstanceStateNamePending:
		return providers.StatePending
	case types.InstanceStateNameRunning:
		return providers.StateRunning
	case types.InstanceStateNameTerminated:
		return providers.StateTerminated
	}
	return providers.StateStopping
}

type found struct {
	inst providers.Instance
	sir  string // spot instance request id
}

// describe runs DescribeInstances to the last page.
func describe(ctx context.Context, client ec2API, region string, in *ec2.DescribeInstancesInput) ([]found, error) {
	var out []found
	for range maxPages {
		resp, err := client.DescribeInstances(ctx, in)
		if err != nil {
			return nil, classify("DescribeInstances in "+region, "", err)
		}
		for _, r := range resp.Reservations {
			for _, i := range r.Instances {
				out = append(out, found{inst: toInstance(region, i), sir: awssdk.ToString(i.SpotInstanceRequestId)})
			}
		}
		if awssdk.ToString(resp.NextToken) == "" {
			return out, nil
		}
		in.NextToken = resp.NextToken
	}
	return out, nil
}

// markInterruptions sets Interruption on spot instances whose request EC2
// has marked for termination or stop (the two-minute warning).
func markInterruptions(ctx context.Context, client ec2API, region string, fs []found) error {
	idx := map[string]int{}
	var sirs []string
	for i, f := range fs {
		if f.sir != "" && f.inst.State != providers.StateTerminated {
			idx[f.sir] = i
			sirs = append(sirs, f.sir)
		}
	}
	// A filter (not SpotInstanceRequestIds) so a request EC2 does not show
	// yet is skipped rather than failing the call; 200 values per filter
	// is EC2's limit.
	for chunk := range slices.Chunk(sirs, 200) {
		in := &ec2.DescribeSpotInstanceRequestsInput{Filters: []types.Filter{{Name: awssdk.String("spot-instance-request-id"), Values: chunk}}}
		for range maxPages {
			resp, err := client.DescribeSpotInstanceRequests(ctx, in)
			if err != nil {
				return classify("DescribeSpotInstanceRequests in "+region, "", err)
			}
			for _, sr := range resp.SpotInstanceRequests {
				if sr.Status == nil || !spotMarkedCodes[awssdk.ToString(sr.Status.Code)] {
					continue
				}
				i, ok := idx[awssdk.ToString(sr.SpotInstanceRequestId)]
				if !ok {
					continue
				}
				// The status changes when the warning is issued; EC2 acts
				// about two minutes later.
				fs[i].inst.Interruption = &providers.InterruptionInfo{
					Kind:     "spot-interruption",
					Deadline: awssdk.ToTime(sr.Status.UpdateTime).Add(NoticeLead).UTC(),
				}
			}
			if awssdk.ToString(resp.NextToken) == "" {
				break
			}
			in.NextToken = resp.NextToken
		}
	}
	return nil
}

// regionsFor orders the block's regions for a lookup of id: the region it
// was launched in first, when this process launched it.
func (p *Provider) regionsFor(b block, id string) []string {
	p.mu.Lock()
	rl, ok := p.recent[id]
	p.mu.Unlock()
	if !ok || !slices.Contains(b.Regions, rl.region) {
		return b.Regions
	}
	out := []string{rl.region}
	for _, r := range b.Regions {
		if r != rl.region {
			out = append(out, r)
		}
	}
	return out
}

// recentLaunch returns the launch record of id if it is within the
// consistency window and from block b's scope.
func (p *Provider) recentLaunch(b block, id string) (recentLaunch, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	rl, ok := p.recent[id]
	if !ok || rl.scope != b.scope() || p.opts.Now().Sub(rl.at) > p.opts.ConsistencyWindow {
		return recentLaunch{}, false
	}
	return rl, true
}

// seen forgets launch records of instances EC2 now shows: from then on
// EC2 is the truth.
func (p *Provider) seen(fs []found) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, f := range fs {
		delete(p.recent, f.inst.ID)
	}
}

func (p *Provider) pruneRecentLocked(now time.Time) {
	for id, rl := range p.recent {
		if now.Sub(rl.at) > p.opts.ConsistencyWindow {
			delete(p.recent, id)
		}
	}
}

// Get returns one instance, searching the block's regions.
func (p *Provider) Get(ctx context.Context, cfg providers.Config, id string) (providers.Instance, error) {
	b, err := callBlock(ctx, cfg)
	if err != nil {
		return providers.Instance{}, err
	}
	if !instanceIDRe.MatchString(id) {
		return providers.Instance{}, providers.NotFound(fmt.Errorf("no EC2 instance %q (not an instance id)", id))
	}
	for _, region := range p.regionsFor(b, id) {
		client, err := p.ec2Client(ctx, b, region)
		if err != nil {
			return providers.Instance{}, err
		}
		fs, err := describe(ctx, client, region, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
		if providers.IsNotFound(err) {
			continue
		}
		if err != nil {
			return providers.Instance{}, err
		}
		if len(fs) == 0 {
			continue
		}
		if err := markInterruptions(ctx, client, region, fs); err != nil {
			return providers.Instance{}, err
		}
		p.seen(fs)
		inst := fs[0].inst
		inst.Offering = p.describeOffering(b, inst.Offering)
		return inst, nil
	}
	if rl, ok := p.recentLaunch(b, id); ok {
		// Launched moments ago and not visible yet (EC2 is eventually
		// consistent): it exists, as RunInstances said.
		return rl.inst, nil
	}
	return providers.Instance{}, providers.NotFound(fmt.Errorf("no EC2 instance %s in %v", id, b.Regions))
}

// List returns the instances carrying every tag in tags, in every region
// of the block, terminated ones left out.
func (p *Provider) List(ctx context.Context, cfg providers.Config, tags map[string]string) ([]providers.Instance, error) {
	b, err := callBlock(ctx, cfg)
	if err != nil {
		return nil, err
	}
	var filters []types.Filter
	keys := make([]string, 0, len(tags))
	for k := range tags {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		filters = append(filters, types.Filter{Name: awssdk.String("tag:" + k), Values: []string{tags[k]}})
	}
	var out []providers.Instance
	listed := map[string]bool{}
	for _, region := range b.Regions {
		client, err := p.ec2Client(ctx, b, region)
		if err != nil {
			return nil, err
		}
		// Terminated instances are fetched too (and dropped below) so a
		// launch record is retired once EC2 shows its instance in any state.
		fs, err := describe(ctx, client, region, &ec2.DescribeInstancesInput{Filters: filters, MaxResults: awssdk.Int32(1000)})
		if err != nil {
			return nil, err
		}
		if err := markInterruptions(ctx, client, region, fs); err != nil {
			return nil, err
		}
		p.seen(fs)
		for _, f := range fs {
			listed[f.inst.ID] = true
			if f.inst.State == providers.StateTerminated {
				continue
			}
			f.inst.Offering = p.describeOffering(b, f.inst.Offering)
			out = append(out, f.inst)
		}
	}
	// Instances launched moments ago that EC2 does not list yet.
	p.mu.Lock()
	now := p.opts.Now()
	for id, rl := range p.recent {
		if listed[id] || rl.scope != b.scope() || !slices.Contains(b.Regions, rl.region) || now.Sub(rl.at) > p.opts.ConsistencyWindow {
			continue
		}
		if providers.HasTags(rl.inst.Tags, tags) {
			out = append(out, rl.inst)
		}
	}
	p.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Delete terminates an instance. An instance EC2 does not know is already
// gone, so that is success; except for one this process launched moments
// ago, which EC2 may not show yet: that one is retried (bounded), since
// calling it gone would leak a running VM.
func (p *Provider) Delete(ctx context.Context, cfg providers.Config, id string) error {
	b, err := callBlock(ctx, cfg)
	if err != nil {
		return err
	}
	if !instanceIDRe.MatchString(id) {
		return nil
	}
	rl, recent := p.recentLaunch(b, id)
	for _, region := range p.regionsFor(b, id) {
		client, err := p.ec2Client(ctx, b, region)
		if err != nil {
			return err
		}
		attempts := 1
		if recent && region == rl.region {
			attempts = 8
		}
		delay := p.opts.ConsistencyRetryDelay
		for attempt := 1; ; attempt++ {
			_, err = client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{id}})
			err = classify("TerminateInstances "+id+" in "+region, "", err)
			if err == nil {
				p.mu.Lock()
				delete(p.recent, id)
				p.mu.Unlock()
				return nil
			}
			if !providers.IsNotFound(err) {
				return err
			}
			if attempt >= attempts {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(delay):
			}
			delay *= 2
		}
		if recent && region == rl.region {
			return &providers.Error{Kind: providers.KindTransient, Code: apiCode(err), RetryAfter: 5 * time.Second,
				Err: fmt.Errorf("instance %s was launched %v ago and EC2 does not show it yet: %w", id, p.opts.Now().Sub(rl.at).Round(time.Millisecond), err)}
		}
	}
	return nil
}
