package aws

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
)

// Spot placement scores (GetSpotPlacementScores) say how likely a spot
// request for a target capacity is to succeed in each zone, 1 to 10. AWS
// documents two limits: a target capacity limit derived from the
// account's recent spot usage, and a limit on how many *new* request
// configurations an account may ask about in 24 hours (asking again about
// a configuration used in the last 24 hours is always allowed). So the
// provider asks about one fixed configuration per (region, instance type,
// capacity), reuses the answer for PlacementScoreTTL, and after a refusal
// waits PlacementScoreRetry (24 h after a configuration-limit answer)
// before asking again. Placement works without scores.

// Defaults of the placement score options.
const (
	DefaultPlacementScoreTTL   = 30 * time.Minute
	DefaultPlacementScoreRetry = time.Hour
	configLimitRetry           = 24 * time.Hour
)

// scoreSet is the placement scores of one region: type → zone → score,
// and why there are none when the call failed.
type scoreSet struct {
	scores map[string]map[string]int
	note   string
}

// score returns the score of (instance type, zone), or 0 and the reason
// scores are missing.
func (s scoreSet) score(instanceType, zone string) (int, string) {
	if v := s.scores[instanceType][zone]; v > 0 {
		return v, ""
	}
	return 0, s.note
}

type scoreEntry struct {
	at, retryAt time.Time
	val         scoreSet
}

// placementScores returns the single-zone spot placement scores of the
// block's instance types in region. It never fails: when EC2 refuses or
// does not serve the call, the set carries a note instead of scores.
func (p *Provider) placementScores(ctx context.Context, client ec2API, b block, region string) scoreSet {
	capacity := b.placementScoreCapacity()
	key := fmt.Sprintf("%s|%d", cacheKey(b, region), capacity)
	now := p.opts.Now()
	p.mu.Lock()
	c, ok := p.scoreCache[key]
	p.mu.Unlock()
	if ok {
		if c.val.note == "" && now.Sub(c.at) < p.opts.PlacementScoreTTL {
			return c.val
		}
		if c.val.note != "" && now.Before(c.retryAt) {
			return c.val
		}
	}
	set, retry := p.fetchPlacementScores(ctx, client, b, region, capacity)
	if ctx.Err() != nil {
		// The caller gave up; do not remember its cancellation as EC2's answer.
		return set
	}
	p.mu.Lock()
	p.scoreCache[key] = scoreEntry{at: now, retryAt: now.Add(retry), val: set}
	p.mu.Unlock()
	return set
}

func (p *Provider) fetchPlacementScores(ctx context.Context, client ec2API, b block, region string, capacity int) (scoreSet, time.Duration) {
	ids, err := p.zoneIDs(ctx, client, b, region)
	if err != nil {
		return scoreSet{note: scoreNote(err)}, p.opts.PlacementScoreRetry
	}
	set := scoreSet{scores: map[string]map[string]int{}}
	// One configuration per type: a score for a set of types says how
	// likely *some* of them are to launch, and fleetd launches one type
	// per request.
	for _, it := range b.InstanceTypes {
		in := &ec2.GetSpotPlacementScoresInput{
			InstanceTypes:          []string{it},
			RegionNames:            []string{region},
			SingleAvailabilityZone: awssdk.Bool(true),
			TargetCapacity:         awssdk.Int32(int32(capacity)),
			TargetCapacityUnitType: types.TargetCapacityUnitTypeUnits,
			MaxResults:             awssdk.Int32(100),
		}
		for range maxPages {
			// One attempt: a throttled or unserved score is not worth the
			// SDK's backoff inside an Offerings call.
			resp, err := client.GetSpotPlacementScores(ctx, in, func(o *ec2.Options) { o.RetryMaxAttempts = 1 })
			if err != nil {
				retry := p.opts.PlacementScoreRetry
				if isConfigLimit(err) {
					retry = configLimitRetry
				}
				return scoreSet{note: scoreNote(err)}, retry
			}
			for _, sc := range resp.SpotPlacementScores {
				if awssdk.ToString(sc.Region) != "" && awssdk.ToString(sc.Region) != region {
					continue
				}
				zone := ids[awssdk.ToString(sc.AvailabilityZoneId)]
				if zone == "" {
					continue
				}
				if set.scores[it] == nil {
					set.scores[it] = map[string]int{}
				}
				set.scores[it][zone] = int(awssdk.ToInt32(sc.Score))
			}
			if awssdk.ToString(resp.NextToken) == "" {
				break
			}
			in.NextToken = resp.NextToken
		}
	}
	return set, 0
}

// isConfigLimit reports EC2's answer to too many new score configurations
// in 24 hours.
func isConfigLimit(err error) bool {
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		return false
	}
	m := strings.ToLower(ae.ErrorMessage())
	return strings.Contains(m, "placement configurations") || strings.Contains(strings.ToLower(ae.ErrorCode()), "limitexceeded")
}

// scoreNote explains a failed GetSpotPlacementScores call to a user.
func scoreNote(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "UnauthorizedOperation", "AccessDenied", "AccessDeniedException":
			return "spot placement scores denied (" + ae.ErrorCode() + "): allow ec2:GetSpotPlacementScores and ec2:DescribeAvailabilityZones; placement uses interruption history only"
		}
		if isConfigLimit(err) {
			return "spot placement scores refused (" + ae.ErrorCode() + "): too many new configurations in 24 h; retrying in 24 h"
		}
		return "spot placement scores not available (" + ae.ErrorCode() + "); placement uses interruption history only"
	}
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		return fmt.Sprintf("spot placement scores not available (HTTP %d from the endpoint); placement uses interruption history only", re.HTTPStatusCode())
	}
	return "spot placement scores not available (" + err.Error() + "); placement uses interruption history only"
}
