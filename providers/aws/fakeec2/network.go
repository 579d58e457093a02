package fakeec2

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
)

// The fast-network parts of EC2: DescribeInstanceTypes' NetworkInfo (EFA,
// network cards), placement groups (CreatePlacementGroup,
// DescribePlacementGroups, DeletePlacementGroup; Placement.GroupName on
// RunInstances) and multi-interface launches (NetworkInterface.N with
// InterfaceType efa / efa-only, NetworkCardIndex, DeviceIndex), with the
// rules EC2 enforces on them. Shapes follow botocore's ec2 service model.

type placementGroup struct {
	name, id, strategy, state string
	tags                      map[string]string
	// zone is where the group's first instance landed: a cluster group
	// lives in one zone.
	zone string
}

// nic is one network interface of a launch request.
type nic struct {
	id, subnet, typ string
	device, card    int
	groups          []string
	publicIP        string // AssociatePublicIpAddress as sent ("" unset)
}

// SetGroupCapacity caps how many more instances placement group name (in
// any region) can take; a launch beyond it fails with
// InsufficientInstanceCapacity, as a full cluster group does. n < 0 removes
// the cap.
func (s *Server) SetGroupCapacity(name string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.groupCap == nil {
		s.groupCap = map[string]int{}
	}
	if n < 0 {
		delete(s.groupCap, name)
		return
	}
	s.groupCap[name] = n
}

// AllowSelf adds the rules EFA needs to security group id of region: all
// traffic in from and out to the group itself.
func (s *Server) AllowSelf(regionName, groupID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.regionLocked(regionName)
	r.groups[groupID] = true
	if r.selfRule == nil {
		r.selfRule = map[string]bool{}
	}
	r.selfRule[groupID] = true
}

// PlacementGroup is a placement group as a test sees it.
type PlacementGroup struct {
	Region, Name, Strategy, State, Zone string
	Tags                                map[string]string
}

// PlacementGroups returns every placement group of every region.
func (s *Server) PlacementGroups() []PlacementGroup {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []PlacementGroup
	for _, rn := range slices.Sorted(maps.Keys(s.regions)) {
		r := s.regions[rn]
		for _, n := range slices.Sorted(maps.Keys(r.pgroups)) {
			g := r.pgroups[n]
			out = append(out, PlacementGroup{Region: rn, Name: g.name, Strategy: g.strategy, State: g.state, Zone: g.zone, Tags: cloneTags(g.tags)})
		}
	}
	return out
}

// networkInfo is t's DescribeInstanceTypes NetworkInfo.
func networkInfo(t InstanceType) *xmlNetworkInfo {
	cards := max(t.NetworkCards, 1)
	perf, gbps := "Up to 10 Gigabit", 10.0
	if t.CardGbps > 0 {
		gbps = t.CardGbps
		perf = strconv.FormatFloat(gbps*float64(cards), 'f', -1, 64) + " Gigabit"
	}
	ni := &xmlNetworkInfo{NetworkPerformance: perf, MaxCards: cards, EnaSupport: "required", EfaSupported: t.EFAInterfaces > 0}
	for i := range cards {
		ni.Cards = append(ni.Cards, xmlNetworkCardInfo{Index: i, NetworkPerformance: strconv.FormatFloat(gbps, 'f', -1, 64) + " Gigabit", MaxInterfaces: 2, BaselineGbps: gbps, PeakGbps: gbps})
		ni.MaxInterfaces += 2
	}
	if t.EFAInterfaces > 0 {
		n := t.EFAInterfaces
		ni.MaximumEfaInterface = &n
	}
	return ni
}

// ---- placement groups ----

var groupStrategies = []string{"cluster", "spread", "partition"}

func (s *Server) createPlacementGroup(r *region, p params) (answer, *apiError) {
	name, strategy := p.get("GroupName"), p.get("Strategy")
	switch {
	case name == "":
		return nil, &apiError{Code: "MissingParameter", Message: "The request must contain the parameter GroupName"}
	case len(name) > 255:
		return nil, &apiError{Code: "InvalidParameterValue", Message: "Placement group names are at most 255 characters."}
	case !slices.Contains(groupStrategies, strategy):
		return nil, &apiError{Code: "InvalidParameterValue", Message: fmt.Sprintf("Value (%s) for parameter strategy is invalid.", strategy)}
	}
	if _, ok := r.pgroups[name]; ok {
		return nil, &apiError{Code: "InvalidPlacementGroup.Duplicate", Message: fmt.Sprintf("The Placement Group '%s' already exists.", name)}
	}
	g := &placementGroup{name: name, id: s.nextIDLocked("pg", 17), strategy: strategy, state: "available", tags: map[string]string{}}
	for _, ts := range p.tagSpecs() {
		if ts.ResourceType != "placement-group" {
			return nil, &apiError{Code: "InvalidParameterValue", Message: fmt.Sprintf("'%s' is not a valid taggable resource type for this operation.", ts.ResourceType)}
		}
		for k, v := range ts.Tags {
			g.tags[k] = v
		}
	}
	if r.pgroups == nil {
		r.pgroups = map[string]*placementGroup{}
	}
	r.pgroups[name] = g
	return &xmlCreatePlacementGroupResponse{Group: s.xmlGroup(r, g)}, nil
}

func (s *Server) xmlGroup(r *region, g *placementGroup) xmlPlacementGroup {
	x := xmlPlacementGroup{GroupName: g.name, State: g.state, Strategy: g.strategy, GroupID: g.id,
		GroupArn: "arn:aws:ec2:" + r.name + ":" + s.opts.OwnerID + ":placement-group/" + g.name}
	x.Tags = xmlTags(g.tags)
	return x
}

func (s *Server) describePlacementGroups(r *region, p params) (answer, *apiError) {
	names := p.list("GroupName")
	for _, n := range names {
		if _, ok := r.pgroups[n]; !ok {
			return nil, &apiError{Code: "InvalidPlacementGroup.Unknown", Message: fmt.Sprintf("The Placement Group '%s' is unknown.", n)}
		}
	}
	var groups []*placementGroup
	for _, n := range slices.Sorted(maps.Keys(r.pgroups)) {
		if len(names) == 0 || slices.Contains(names, n) {
			groups = append(groups, r.pgroups[n])
		}
	}
	matched, err := filtered(groups, p.filters(), groupFilterValues)
	if err != nil {
		return nil, err
	}
	resp := &xmlDescribePlacementGroupsResponse{}
	for _, g := range matched {
		resp.Groups = append(resp.Groups, s.xmlGroup(r, g))
	}
	return resp, nil
}

// groupFilterValues answers DescribePlacementGroups' filters on a group.
func groupFilterValues(g *placementGroup, name string) ([]string, bool) {
	switch name {
	case "group-name":
		return []string{g.name}, true
	case "strategy":
		return []string{g.strategy}, true
	case "state":
		return []string{g.state}, true
	}
	return tagValues(g.tags, name)
}

func (s *Server) deletePlacementGroup(r *region, p params) (answer, *apiError) {
	name := p.get("GroupName")
	if _, ok := r.pgroups[name]; !ok {
		return nil, &apiError{Code: "InvalidPlacementGroup.Unknown", Message: fmt.Sprintf("The Placement Group '%s' is unknown.", name)}
	}
	for _, in := range r.inst {
		if in.pgroup == name && in.state != "terminated" {
			return nil, &apiError{Code: "InvalidPlacementGroup.InUse", Message: fmt.Sprintf("The placement group '%s' is in use and may not be deleted.", name)}
		}
	}
	delete(r.pgroups, name)
	return &xmlReturnResponse{Return: true}, nil
}

// ---- RunInstances: interfaces and group ----

// launchNICs validates a launch's NetworkInterface.N list against the
// type's network cards and EFA limit. It returns nil for a launch without
// one (the instance-level SubnetId/SecurityGroupId apply).
func (s *Server) launchNICs(r *region, p params, t InstanceType) ([]nic, *apiError) {
	n := p.count("NetworkInterface")
	if n == 0 {
		return nil, nil
	}
	if p.get("SubnetId") != "" || len(p.list("SecurityGroupId")) > 0 {
		return nil, &apiError{Code: "InvalidParameterCombination", Message: "Network interfaces and an instance-level subnet ID or security groups may not be specified on the same request"}
	}
	cards := max(t.NetworkCards, 1)
	var out []nic
	seen := map[[2]int]bool{}
	efa, zone := 0, ""
	for i := 1; i <= n; i++ {
		pre := "NetworkInterface." + strconv.Itoa(i) + "."
		dev, _, err1 := p.intParam(pre + "DeviceIndex")
		card, _, err2 := p.intParam(pre + "NetworkCardIndex")
		if err1 != nil || err2 != nil {
			return nil, &apiError{Code: "InvalidParameterValue", Message: "DeviceIndex and NetworkCardIndex must be integers."}
		}
		x := nic{subnet: p.get(pre + "SubnetId"), typ: p.get(pre + "InterfaceType"), device: dev, card: card,
			groups: p.list(pre + "SecurityGroupId"), publicIP: p.get(pre + "AssociatePublicIpAddress")}
		if x.typ == "" {
			x.typ = "interface"
		}
		switch {
		case !p.has(pre + "DeviceIndex"):
			return nil, &apiError{Code: "InvalidParameterValue", Message: fmt.Sprintf("Each network interface requires a device index (NetworkInterface.%d).", i)}
		case card < 0 || card >= cards:
			return nil, &apiError{Code: "InvalidParameterValue", Message: fmt.Sprintf("Network card index %d is not valid for instance type %s (it has %d network cards).", card, t.Name, cards)}
		case seen[[2]int{card, dev}]:
			return nil, &apiError{Code: "InvalidParameterValue", Message: fmt.Sprintf("Each network interface requires a unique device index (network card %d, device %d).", card, dev)}
		case !slices.Contains([]string{"interface", "efa", "efa-only"}, x.typ):
			return nil, &apiError{Code: "InvalidParameterValue", Message: fmt.Sprintf("Value (%s) for parameter InterfaceType is invalid.", x.typ)}
		case x.typ != "interface" && t.EFAInterfaces == 0:
			return nil, &apiError{Code: "InvalidParameterCombination", Message: fmt.Sprintf("The instance type '%s' does not support Elastic Fabric Adapter (EFA).", t.Name)}
		case x.subnet == "":
			return nil, &apiError{Code: "MissingParameter", Message: fmt.Sprintf("The request must contain the parameter NetworkInterface.%d.SubnetId", i)}
		}
		seen[[2]int{card, dev}] = true
		if x.typ != "interface" {
			efa++
		}
		sz, ok := r.subnets[x.subnet]
		if !ok {
			return nil, &apiError{Code: "InvalidSubnetID.NotFound", Message: fmt.Sprintf("The subnet ID '%s' does not exist", x.subnet)}
		}
		if zone != "" && sz != zone {
			return nil, &apiError{Code: "InvalidParameterCombination", Message: "The network interfaces of an instance must all be in one Availability Zone."}
		}
		zone = sz
		for _, g := range x.groups {
			if !r.groups[g] {
				return nil, &apiError{Code: "InvalidGroup.NotFound", Message: fmt.Sprintf("The security group '%s' does not exist", g)}
			}
		}
		out = append(out, x)
	}
	if !seen[[2]int{0, 0}] {
		return nil, &apiError{Code: "InvalidParameterValue", Message: "A primary network interface (network card 0, device index 0) is required."}
	}
	for _, x := range out {
		if x.card == 0 && x.device == 0 && x.typ == "efa-only" {
			return nil, &apiError{Code: "InvalidParameterValue", Message: "An EFA-only network interface cannot be the primary network interface."}
		}
		if x.publicIP == "true" && len(out) > 1 {
			return nil, &apiError{Code: "InvalidParameterCombination", Message: "The associatePublicIPAddress parameter cannot be specified when launching with multiple network interfaces."}
		}
	}
	if efa > t.EFAInterfaces {
		return nil, &apiError{Code: "InvalidParameterValue", Message: fmt.Sprintf("You can attach at most %d EFA interfaces to %s, got %d.", t.EFAInterfaces, t.Name, efa)}
	}
	return out, nil
}

// launchGroup checks Placement.GroupName of a launch of count..minCount
// instances of typ into zone and returns the group ("" for none).
func (s *Server) launchGroup(r *region, p params, typ, zone string, minCount int) (*placementGroup, *apiError) {
	name := p.get("Placement.GroupName")
	if name == "" {
		return nil, nil
	}
	g, ok := r.pgroups[name]
	if !ok {
		return nil, &apiError{Code: "InvalidPlacementGroup.Unknown", Message: fmt.Sprintf("The Placement Group '%s' is unknown.", name)}
	}
	if g.strategy == "cluster" && g.zone != "" && g.zone != zone {
		return nil, &apiError{Code: "InvalidParameterCombination", Message: fmt.Sprintf("The cluster placement group '%s' is in %s; instances cannot be launched into it in %s.", name, g.zone, zone)}
	}
	if left, capped := s.groupCap[name]; capped && left < minCount {
		return nil, &apiError{Code: "InsufficientInstanceCapacity", Message: fmt.Sprintf(
			"We currently do not have sufficient %s capacity in the placement group you requested (%s). Our system will be working on provisioning additional capacity. You can currently get %s capacity by not specifying a placement group in your request.", typ, name, typ)}
	}
	return g, nil
}
