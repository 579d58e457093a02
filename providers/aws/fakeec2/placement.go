package fakeec2

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// The catalogue calls: which types each zone offers
// (DescribeInstanceTypeOfferings), zone ids (DescribeAvailabilityZones) and
// spot placement scores (GetSpotPlacementScores).

type xmlInstanceTypeOffering struct {
	InstanceType string `xml:"instanceType"`
	LocationType string `xml:"locationType"`
	Location     string `xml:"location"`
}

type xmlDescribeInstanceTypeOfferingsResponse struct {
	xmlHead
	Offerings []xmlInstanceTypeOffering `xml:"instanceTypeOfferingSet>item"`
	NextToken string                    `xml:"nextToken,omitempty"`
}

type xmlSpotPlacementScore struct {
	Region             string `xml:"region"`
	AvailabilityZoneID string `xml:"availabilityZoneId"`
	Score              int    `xml:"score"`
}

type xmlGetSpotPlacementScoresResponse struct {
	xmlHead
	Scores    []xmlSpotPlacementScore `xml:"spotPlacementScoreSet>item"`
	NextToken string                  `xml:"nextToken,omitempty"`
}

// RemoveOffering makes zone not offer instanceType: DescribeInstanceTypeOfferings
// leaves it out and RunInstances answers Unsupported, as EC2 does for a
// type a zone lacks.
func (s *Server) RemoveOffering(zone, instanceType string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.mustZoneLocked(zone)
	r.notOffered[zone+"|"+instanceType] = true
}

// RemoveSpotPrices deletes every spot price of instanceType in zone, as for
// a type EC2 publishes no spot price for there (it may still run on demand).
func (s *Server) RemoveSpotPrices(zone, instanceType string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.mustZoneLocked(zone)
	r.prices = slices.DeleteFunc(r.prices, func(sp spotPrice) bool { return sp.zone == zone && sp.typ == instanceType })
}

// SetSpotPriceProduct records a spot price under an explicit product
// description (e.g. "Linux/UNIX (Amazon VPC)").
func (s *Server) SetSpotPriceProduct(zone, instanceType, product string, price float64, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.mustZoneLocked(zone)
	r.prices = append(r.prices, spotPrice{zone: zone, typ: instanceType, product: product, price: price, at: at.UTC()})
}

// SetPlacementScore fixes the spot placement score of (zone, type), 1–10.
// Without it a zone scores 9, or 2 when its capacity (SetCapacity) is below
// the requested target capacity.
func (s *Server) SetPlacementScore(zone, instanceType string, score int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.mustZoneLocked(zone)
	r.scores[zone+"|"+instanceType] = score
}

func (s *Server) mustZoneLocked(zone string) *region {
	r := s.regionOfZoneLocked(zone)
	if r == nil {
		panic("fakeec2: unknown zone " + zone)
	}
	return r
}

func (r *region) offers(zone, typ string) bool { return !r.notOffered[zone+"|"+typ] }

// zoneID is the zone's id. Ids are numbered in the reverse order of the
// names, since EC2 maps names to ids differently per account and a client
// must not assume "a" is az1.
func (r *region) zoneID(zone string) string {
	i := slices.Index(r.zones, zone)
	return fmt.Sprintf("%s-az%d", regionAbbrev(r.name), len(r.zones)-i)
}

// regionAbbrev shortens a region name the way zone ids do: "us-east-1" →
// "use1", "eu-central-1" → "euc1".
func regionAbbrev(region string) string {
	parts := strings.Split(region, "-")
	if len(parts) < 2 {
		return region
	}
	out := parts[0]
	for _, p := range parts[1 : len(parts)-1] {
		if p != "" {
			out += p[:1]
		}
	}
	return out + parts[len(parts)-1]
}

func (s *Server) describeInstanceTypeOfferings(r *region, p params) (answer, *apiError) {
	if lt := p.get("LocationType"); lt != "" && lt != "availability-zone" && lt != "region" {
		return nil, &apiError{Code: "InvalidParameterValue", Message: fmt.Sprintf("Value (%s) for parameter locationType is invalid.", lt)}
	}
	var want []string
	for _, f := range p.filters() {
		switch f.Name {
		case "instance-type":
			want = append(want, f.Values...)
		case "location":
		default:
			return nil, invalidFilter(f.Name)
		}
	}
	var offs []xmlInstanceTypeOffering
	for _, name := range s.typeNames() {
		if len(want) > 0 && !slices.Contains(want, name) {
			continue
		}
		if p.get("LocationType") == "availability-zone" {
			for _, z := range r.zones {
				if r.offers(z, name) {
					offs = append(offs, xmlInstanceTypeOffering{InstanceType: name, LocationType: "availability-zone", Location: z})
				}
			}
			continue
		}
		offs = append(offs, xmlInstanceTypeOffering{InstanceType: name, LocationType: "region", Location: r.name})
	}
	from, to, next, err := s.page(p, len(offs), 5, 1000)
	if err != nil {
		return nil, err
	}
	return &xmlDescribeInstanceTypeOfferingsResponse{Offerings: offs[from:to], NextToken: next}, nil
}

func (s *Server) getSpotPlacementScores(_ *region, p params) (answer, *apiError) {
	types := p.list("InstanceType")
	if len(types) == 0 {
		return nil, &apiError{Code: "MissingParameter", Message: "The request must contain the parameter InstanceType or InstanceRequirementsWithMetadata."}
	}
	target, ok, convErr := p.intParam("TargetCapacity")
	if convErr != nil || !ok || target < 1 {
		return nil, &apiError{Code: "InvalidParameterValue", Message: "TargetCapacity must be an integer of at least 1."}
	}
	single := p.get("SingleAvailabilityZone") == "true"
	regions := p.list("RegionName")
	if len(regions) == 0 {
		for name := range s.opts.Regions {
			regions = append(regions, name)
		}
	}
	slices.Sort(regions)
	var out []xmlSpotPlacementScore
	for _, name := range regions {
		r := s.regionLocked(name)
		if r == nil {
			continue
		}
		best := 0
		for _, z := range r.zones {
			sc := 0
			for _, t := range types {
				if !r.offers(z, t) {
					continue
				}
				v, set := r.scores[z+"|"+t]
				if !set {
					v = 9
					if c, limited := r.capacity[z+"|"+t]; limited && c < target {
						v = 2
					}
				}
				sc = max(sc, v)
			}
			if sc == 0 {
				continue
			}
			if single {
				out = append(out, xmlSpotPlacementScore{Region: name, AvailabilityZoneID: r.zoneID(z), Score: sc})
			}
			best = max(best, sc)
		}
		if !single && best > 0 {
			out = append(out, xmlSpotPlacementScore{Region: name, Score: best})
		}
	}
	from, to, next, err := s.page(p, len(out), 10, 1000)
	if err != nil {
		return nil, err
	}
	return &xmlGetSpotPlacementScoresResponse{Scores: out[from:to], NextToken: next}, nil
}
