package fakeec2

import (
	"encoding/base64"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

var (
	instanceIDRe = regexp.MustCompile(`^i-[0-9a-f]{8,17}$`)
	amiIDRe      = regexp.MustCompile(`^ami-[0-9a-f]{8,17}$`)
)

// page cuts items to one page: start from NextToken, size from MaxResults
// capped by the server's page size. The token is the next offset.
func (s *Server) page(p params, n int, minMax, maxMax int) (start, end int, next string, err *apiError) {
	if tok := p.get("NextToken"); tok != "" {
		v, convErr := strconv.Atoi(strings.TrimPrefix(tok, "fake-"))
		if convErr != nil || !strings.HasPrefix(tok, "fake-") || v < 0 || v > n {
			return 0, 0, "", &apiError{Code: "InvalidNextToken", Message: "The specified NextToken is not valid."}
		}
		start = v
	}
	size := maxMax
	if mr, ok, convErr := p.intParam("MaxResults"); convErr != nil {
		return 0, 0, "", &apiError{Code: "InvalidParameterValue", Message: "MaxResults must be an integer."}
	} else if ok {
		if mr < minMax || mr > maxMax {
			return 0, 0, "", &apiError{Code: "InvalidParameterValue", Message: fmt.Sprintf("Value (%d) for parameter maxResults is invalid. Expecting a value between %d and %d.", mr, minMax, maxMax)}
		}
		size = mr
	}
	if s.pageSize > 0 && s.pageSize < size {
		size = s.pageSize
	}
	end = min(start+size, n)
	if end < n {
		next = "fake-" + strconv.Itoa(end)
	}
	return start, end, next, nil
}

// ---- DescribeInstanceTypes ----

func (s *Server) describeInstanceTypes(_ *region, p params) (answer, *apiError) {
	names := p.list("InstanceType")
	if len(names) == 0 {
		names = s.typeNames()
	}
	var missing []string
	for _, n := range names {
		if _, ok := s.types[n]; !ok {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return nil, &apiError{Code: "InvalidInstanceType", Message: fmt.Sprintf("The following supplied instance types do not exist: [%s]", strings.Join(missing, ", "))}
	}
	start, end, next, err := s.page(p, len(names), 5, 100)
	if err != nil {
		return nil, err
	}
	resp := &xmlDescribeInstanceTypesResponse{NextToken: next}
	for _, n := range names[start:end] {
		t := s.types[n]
		info := xmlInstanceTypeInfo{
			InstanceType: t.Name, CurrentGeneration: true, SupportedUsageClasses: []string{"on-demand", "spot"},
			DefaultVCPUs: t.VCPUs, MemoryMiB: t.MemoryMiB, Architectures: []string{"x86_64"},
		}
		if t.Arch != "" {
			info.Architectures = []string{t.Arch}
		}
		info.NetworkInfo = networkInfo(t)
		if t.GPUs > 0 {
			info.GPUInfo = &xmlGPUInfo{
				GPUs:           []xmlGPUDevice{{Name: t.GPUName, Manufacturer: t.GPUManufacturer, Count: t.GPUs, MemoryMiB: t.GPUMemoryMiB}},
				TotalMemoryMiB: t.GPUs * t.GPUMemoryMiB,
			}
		}
		resp.InstanceTypes = append(resp.InstanceTypes, info)
	}
	return resp, nil
}

// ---- DescribeSpotPriceHistory ----

func (s *Server) describeSpotPriceHistory(r *region, p params) (answer, *apiError) {
	types := p.list("InstanceType")
	products := p.list("ProductDescription")
	zone := p.get("AvailabilityZone")
	var start, endT time.Time
	if v := p.get("StartTime"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return nil, &apiError{Code: "InvalidParameterValue", Message: "Invalid StartTime: " + v}
		}
		start = t
	}
	if v := p.get("EndTime"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return nil, &apiError{Code: "InvalidParameterValue", Message: "Invalid EndTime: " + v}
		}
		endT = t
	}
	for _, f := range p.filters() {
		switch f.Name {
		case "instance-type":
			types = append(types, f.Values...)
		case "product-description":
			products = append(products, f.Values...)
		case "availability-zone":
			if len(f.Values) > 0 {
				zone = f.Values[0]
			}
		default:
			return nil, invalidFilter(f.Name)
		}
	}
	match := func(sp spotPrice) bool {
		return (len(types) == 0 || slices.Contains(types, sp.typ)) &&
			(len(products) == 0 || slices.Contains(products, sp.product)) &&
			(zone == "" || zone == sp.zone)
	}
	// EC2 returns, for each (type, zone, product), the price in effect at
	// StartTime (the latest entry not after it) and every later change.
	latestBefore := map[string]int{}
	var picked []spotPrice
	for i, sp := range r.prices {
		if !match(sp) || (!endT.IsZero() && sp.at.After(endT)) {
			continue
		}
		if start.IsZero() || sp.at.After(start) {
			picked = append(picked, sp)
			continue
		}
		k := sp.typ + "|" + sp.zone + "|" + sp.product
		if j, ok := latestBefore[k]; !ok || r.prices[j].at.Before(sp.at) {
			latestBefore[k] = i
		}
	}
	for _, i := range latestBefore {
		picked = append(picked, r.prices[i])
	}
	// Newest first, as EC2 lists them; ties in a stable order.
	slices.SortStableFunc(picked, func(a, b spotPrice) int {
		if c := b.at.Compare(a.at); c != 0 {
			return c
		}
		return strings.Compare(a.typ+a.zone+a.product, b.typ+b.zone+b.product)
	})
	from, to, next, err := s.page(p, len(picked), 5, 1000)
	if err != nil {
		return nil, err
	}
	resp := &xmlDescribeSpotPriceHistoryResponse{NextToken: next}
	for _, sp := range picked[from:to] {
		resp.Prices = append(resp.Prices, xmlSpotPrice{
			InstanceType: sp.typ, ProductDescription: sp.product, SpotPrice: strconv.FormatFloat(sp.price, 'f', 6, 64),
			Timestamp: timestamp(sp.at), AvailabilityZone: sp.zone,
		})
	}
	return resp, nil
}

// ---- DescribeAvailabilityZones ----

func (s *Server) describeAvailabilityZones(r *region, _ params) (answer, *apiError) {
	resp := &xmlDescribeAvailabilityZonesResponse{}
	for _, z := range r.zones {
		resp.Zones = append(resp.Zones, xmlAvailabilityZone{ZoneName: z, ZoneID: r.zoneID(z), State: "available", RegionName: r.name, ZoneType: "availability-zone"})
	}
	return resp, nil
}

// ---- RunInstances ----

func (s *Server) runInstances(r *region, p params) (answer, *apiError) {
	token := p.get("ClientToken")
	if len(token) > 64 {
		return nil, &apiError{Code: "InvalidParameterValue", Message: "Value for parameter ClientToken is invalid: it must be at most 64 ASCII characters."}
	}
	canonical := p.canonical()
	if token != "" {
		if rec, ok := r.tokens[token]; ok {
			if rec.canonical != canonical {
				return nil, &apiError{Code: "IdempotentParameterMismatch", Message: "The client token you have provided is associated with a resource that is already deleted or has different parameters. Please use a different client token."}
			}
			return s.reservationResponse(r, rec.reservation, rec.ids), nil
		}
	}

	imageID := p.get("ImageId")
	switch {
	case imageID == "":
		return nil, &apiError{Code: "MissingParameter", Message: "The request must contain the parameter ImageId"}
	case !amiIDRe.MatchString(imageID):
		return nil, &apiError{Code: "InvalidAMIID.Malformed", Message: fmt.Sprintf("Invalid id: \"%s\" (expecting \"ami-...\")", imageID)}
	case r.noImages[imageID]:
		return nil, &apiError{Code: "InvalidAMIID.NotFound", Message: fmt.Sprintf("The image id '[%s]' does not exist", imageID)}
	}
	typ := p.get("InstanceType")
	it, ok := s.types[typ]
	if !ok {
		return nil, &apiError{Code: "InvalidParameterValue", Message: fmt.Sprintf("Invalid value '%s' for InstanceType.", typ)}
	}
	minCount, _, err1 := p.intParam("MinCount")
	maxCount, _, err2 := p.intParam("MaxCount")
	if err1 != nil || err2 != nil || minCount < 1 || maxCount < minCount {
		return nil, &apiError{Code: "InvalidParameterValue", Message: "MinCount and MaxCount must be integers with 1 <= MinCount <= MaxCount."}
	}

	nics, nerr := s.launchNICs(r, p, it)
	if nerr != nil {
		return nil, nerr
	}
	zone := p.get("Placement.AvailabilityZone")
	subnet := p.get("SubnetId")
	if len(nics) > 0 {
		subnet = nics[0].subnet // the primary interface's subnet is the instance's
		for _, x := range nics {
			if x.card == 0 && x.device == 0 {
				subnet = x.subnet
			}
		}
	}
	if subnet != "" {
		sz, ok := r.subnets[subnet]
		if !ok {
			return nil, &apiError{Code: "InvalidSubnetID.NotFound", Message: fmt.Sprintf("The subnet ID '%s' does not exist", subnet)}
		}
		if zone != "" && zone != sz {
			return nil, &apiError{Code: "InvalidParameterCombination", Message: fmt.Sprintf("The specified Availability Zone (%s) does not match the Availability Zone of subnet %s (%s).", zone, subnet, sz)}
		}
		zone = sz
	}
	if zone == "" {
		zone = r.zones[0]
	}
	if !slices.Contains(r.zones, zone) {
		return nil, &apiError{Code: "InvalidParameterValue", Message: fmt.Sprintf("Invalid availability zone: [%s]", zone)}
	}
	if !r.offers(zone, typ) {
		return nil, &apiError{Code: "Unsupported", Message: fmt.Sprintf("Your requested instance type (%s) is not supported in your requested Availability Zone (%s).", typ, zone)}
	}
	groups := p.list("SecurityGroupId")
	for _, x := range nics {
		if x.card == 0 && x.device == 0 {
			groups = x.groups
		}
	}
	for _, g := range groups {
		if !strings.HasPrefix(g, "sg-") {
			return nil, &apiError{Code: "InvalidGroupId.Malformed", Message: fmt.Sprintf("Invalid id: \"%s\" (expecting \"sg-...\")", g)}
		}
		if !r.groups[g] {
			return nil, &apiError{Code: "InvalidGroup.NotFound", Message: fmt.Sprintf("The security group '%s' does not exist", g)}
		}
	}
	// Metadata options as EC2 records them, with its defaults.
	metaTokens, metaEndpoint, metaHops := "optional", "enabled", 1
	if v := p.get("MetadataOptions.HttpTokens"); v != "" {
		metaTokens = v
	}
	if v := p.get("MetadataOptions.HttpEndpoint"); v != "" {
		metaEndpoint = v
	}
	if v, ok, err := p.intParam("MetadataOptions.HttpPutResponseHopLimit"); err == nil && ok {
		metaHops = v
	}
	var userData []byte
	if ud := p.get("UserData"); ud != "" {
		b, err := base64.StdEncoding.DecodeString(ud)
		if err != nil {
			return nil, &apiError{Code: "InvalidParameterValue", Message: "Invalid BASE64 encoding of user data."}
		}
		userData = b
	}
	market := MarketOnDemand
	switch mt := p.get("InstanceMarketOptions.MarketType"); mt {
	case "":
	case "spot":
		market = MarketSpot
		if it := p.get("InstanceMarketOptions.SpotOptions.SpotInstanceType"); it != "" && it != "one-time" && it != "persistent" {
			return nil, &apiError{Code: "InvalidParameterValue", Message: fmt.Sprintf("Invalid value '%s' for SpotInstanceType.", it)}
		}
		if ib := p.get("InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior"); ib != "" && ib != "terminate" && ib != "stop" && ib != "hibernate" {
			return nil, &apiError{Code: "InvalidParameterValue", Message: fmt.Sprintf("Invalid value '%s' for InstanceInterruptionBehavior.", ib)}
		}
	default:
		return nil, &apiError{Code: "InvalidParameterValue", Message: fmt.Sprintf("Invalid value '%s' for MarketType.", mt)}
	}
	tags := map[string]string{}
	spotTags := map[string]string{}
	for _, ts := range p.tagSpecs() {
		switch ts.ResourceType {
		case "instance":
			for k, v := range ts.Tags {
				tags[k] = v
			}
		case "spot-instances-request":
			for k, v := range ts.Tags {
				spotTags[k] = v
			}
		case "volume", "network-interface":
		default:
			return nil, &apiError{Code: "InvalidParameterValue", Message: fmt.Sprintf("'%s' is not a valid taggable resource type for this operation.", ts.ResourceType)}
		}
	}
	for k := range tags {
		if strings.HasPrefix(strings.ToLower(k), "aws:") {
			return nil, &apiError{Code: "InvalidParameterValue", Message: "Tag keys starting with 'aws:' are reserved for internal use"}
		}
	}

	// Capacity, then quota: a full zone answers ICE before limits are checked.
	count := maxCount
	if left, ok := r.capacity[zone+"|"+typ]; ok {
		if left < minCount {
			var others []string
			for _, z := range r.zones {
				if z != zone {
					others = append(others, z)
				}
			}
			return nil, &apiError{Code: "InsufficientInstanceCapacity", Message: fmt.Sprintf(
				"We currently do not have sufficient %s capacity in the Availability Zone you requested (%s). Our system will be working on provisioning additional capacity. You can currently get %s capacity by not specifying an Availability Zone in your request or choosing %s.",
				typ, zone, typ, strings.Join(others, ", "))}
		}
		count = min(count, left)
	}
	if limit, ok := r.quota[market]; ok {
		used := 0
		for _, in := range r.inst {
			if in.market == market && in.state != "terminated" && in.state != "shutting-down" {
				used += s.types[in.typ].VCPUs
			}
		}
		if used+minCount*it.VCPUs > limit {
			if market == MarketSpot {
				return nil, &apiError{Code: "MaxSpotInstanceCountExceeded", Message: fmt.Sprintf("Max spot instance count exceeded (vCPU limit %d, in use %d).", limit, used)}
			}
			return nil, &apiError{Code: "VcpuLimitExceeded", Message: fmt.Sprintf("You have requested more vCPU capacity than your current vCPU limit of %d allows for the instance bucket that the specified instance type belongs to. Please visit http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this limit.", limit)}
		}
		count = min(count, max(minCount, (limit-used)/max(it.VCPUs, 1)))
	}
	pg, gerr := s.launchGroup(r, p, typ, zone, minCount)
	if gerr != nil {
		return nil, gerr
	}
	if pg != nil {
		if left, capped := s.groupCap[pg.name]; capped {
			count = min(count, left)
		}
	}
	if market == MarketSpot {
		if mp := p.get("InstanceMarketOptions.SpotOptions.MaxPrice"); mp != "" {
			maxPrice, err := strconv.ParseFloat(mp, 64)
			if err != nil {
				return nil, &apiError{Code: "InvalidParameterValue", Message: "Invalid MaxPrice: " + mp}
			}
			if cur := currentSpotPrice(r, zone, typ); maxPrice < cur {
				return nil, &apiError{Code: "SpotMaxPriceTooLow", Message: fmt.Sprintf("Your Spot request price of %s is lower than the minimum required Spot request fulfillment price of %.4f.", mp, cur)}
			}
		}
	}

	now := s.now().UTC()
	resID := s.nextIDLocked("r", 17)
	var ids []string
	for range count {
		id := s.nextIDLocked("i", 17)
		in := &instance{
			id: id, reservation: resID, imageID: imageID, typ: typ, zone: zone, subnet: subnet,
			keyName: p.get("KeyName"), profile: firstNonEmpty(p.get("IamInstanceProfile.Name"), p.get("IamInstanceProfile.Arn")),
			token: token, market: market, groups: groups, tags: cloneTags(tags), userData: userData,
			metaTokens: metaTokens, metaEndpoint: metaEndpoint, metaHops: metaHops,
			state: "pending", launched: now, stateAt: now, hidden: s.hideNext,
			privateIP: fmt.Sprintf("10.0.%d.%d", (s.seq/250)%250, s.seq%250+1),
		}
		if pg != nil {
			in.pgroup = pg.name
			pg.zone = zone
		}
		for _, x := range nics {
			x.id = s.nextIDLocked("eni", 17)
			in.nics = append(in.nics, x)
		}
		if market == MarketSpot {
			sr := &spotRequest{
				id: s.nextIDLocked("sir", 8), instanceID: id, zone: zone, typ: typ, state: "active",
				code: "fulfilled", message: "Your Spot request is fulfilled.", created: now, updated: now, tags: cloneTags(spotTags),
			}
			r.spot[sr.id] = sr
			r.spotIDs = append(r.spotIDs, sr.id)
			in.sir = sr.id
		}
		r.inst[id] = in
		r.order = append(r.order, id)
		ids = append(ids, id)
	}
	if left, ok := r.capacity[zone+"|"+typ]; ok {
		r.capacity[zone+"|"+typ] = left - count
	}
	if pg != nil {
		if left, capped := s.groupCap[pg.name]; capped {
			s.groupCap[pg.name] = left - count
		}
	}
	if token != "" {
		r.tokens[token] = &tokenRecord{canonical: canonical, reservation: resID, ids: ids}
	}
	return s.reservationResponse(r, resID, ids), nil
}

func currentSpotPrice(r *region, zone, typ string) float64 {
	var best spotPrice
	for _, sp := range r.prices {
		if sp.zone == zone && sp.typ == typ && sp.product == "Linux/UNIX" && !sp.at.Before(best.at) {
			best = sp
		}
	}
	return best.price
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

func cloneTags(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (s *Server) reservationResponse(r *region, resID string, ids []string) *xmlRunInstancesResponse {
	resp := &xmlRunInstancesResponse{}
	resp.ReservationID = resID
	resp.OwnerID = s.opts.OwnerID
	for i, id := range ids {
		x := s.xmlInstance(r.inst[id])
		x.AmiLaunchIndex = i
		resp.Instances = append(resp.Instances, x)
	}
	return resp
}

func (s *Server) xmlInstance(in *instance) xmlInstance {
	x := xmlInstance{
		InstanceID: in.id, ImageID: in.imageID, State: xmlStateOf(in.state),
		PrivateDNSName: "ip-" + strings.ReplaceAll(in.privateIP, ".", "-") + ".ec2.internal",
		KeyName:        in.keyName, InstanceType: in.typ, LaunchTime: timestamp(in.launched),
		Placement: xmlPlacement{AvailabilityZone: in.zone, GroupName: in.pgroup, Tenancy: "default"},
		SubnetID:  in.subnet, PrivateIPAddress: in.privateIP, Architecture: "x86_64",
		SpotInstanceRequestID: in.sir, ClientToken: in.token,
		MetadataOptions: &xmlMetadataOptions{State: "applied", HTTPTokens: in.metaTokens, HopLimit: in.metaHops, HTTPEndpoint: in.metaEndpoint},
	}
	if in.subnet != "" {
		x.VpcID = "vpc-0fa1e0000000000"
	}
	for _, n := range in.nics {
		xn := xmlInstanceNIC{ID: n.id, SubnetID: n.subnet, InterfaceType: n.typ, DeviceIndex: n.device, CardIndex: n.card}
		if n.card == 0 && n.device == 0 {
			xn.PrivateIP = in.privateIP
		}
		x.NICs = append(x.NICs, xn)
	}
	if in.market == MarketSpot {
		x.InstanceLifecycle = "spot"
	}
	for _, g := range in.groups {
		x.Groups = append(x.Groups, xmlGroup{GroupID: g})
	}
	if in.profile != "" {
		arn := in.profile
		if !strings.HasPrefix(arn, "arn:") {
			arn = "arn:aws:iam::" + s.opts.OwnerID + ":instance-profile/" + in.profile
		}
		x.IamInstanceProfile = &xmlIamProfile{Arn: arn, ID: "AIPA" + strings.ToUpper(in.id[2:])}
	}
	if in.reason != "" {
		x.StateReason = &xmlStateReason{Code: in.reason, Message: in.reason}
	}
	x.Tags = xmlTags(in.tags)
	return x
}

// xmlTags is a tagSet, in key order.
func xmlTags(m map[string]string) []xmlTag {
	var out []xmlTag
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, xmlTag{Key: k, Value: m[k]})
	}
	return out
}

// ---- DescribeInstances ----

func (s *Server) describeInstances(r *region, p params) (answer, *apiError) {
	defer s.tickHiddenLocked(r)
	now := s.now().UTC()
	ids := p.list("InstanceId")
	if len(ids) > 0 && p.has("MaxResults") {
		return nil, &apiError{Code: "InvalidParameterCombination", Message: "The parameter instancesSet cannot be used with the parameter maxResults"}
	}
	var cands []*instance
	if len(ids) > 0 {
		var missing []string
		for _, id := range ids {
			if !instanceIDRe.MatchString(id) {
				return nil, &apiError{Code: "InvalidInstanceID.Malformed", Message: fmt.Sprintf("Invalid id: \"%s\"", id)}
			}
			in, ok := r.inst[id]
			if !ok || in.hidden > 0 || expired(in, now) {
				missing = append(missing, id)
				continue
			}
			cands = append(cands, in)
		}
		if len(missing) > 0 {
			return nil, &apiError{Code: "InvalidInstanceID.NotFound", Message: fmt.Sprintf("The instance IDs '%s' do not exist", strings.Join(missing, ", "))}
		}
	} else {
		for _, id := range r.order {
			if in := r.inst[id]; in.hidden == 0 && !expired(in, now) {
				cands = append(cands, in)
			}
		}
	}
	for _, in := range cands {
		observeLocked(in, now)
	}
	matched, err := filtered(cands, p.filters(), instanceFilterValues)
	if err != nil {
		return nil, err
	}
	start, end, next, err := s.page(p, len(matched), 5, 1000)
	if err != nil {
		return nil, err
	}
	resp := &xmlDescribeInstancesResponse{NextToken: next}
	byRes := map[string]int{}
	for _, in := range matched[start:end] {
		i, ok := byRes[in.reservation]
		if !ok {
			i = len(resp.Reservations)
			byRes[in.reservation] = i
			resp.Reservations = append(resp.Reservations, xmlReservation{ReservationID: in.reservation, OwnerID: s.opts.OwnerID})
		}
		resp.Reservations[i].Instances = append(resp.Reservations[i].Instances, s.xmlInstance(in))
	}
	return resp, nil
}

// expired: EC2 forgets terminated instances about an hour after they end.
func expired(in *instance, now time.Time) bool {
	return in.state == "terminated" && now.Sub(in.stateAt) > time.Hour
}

// tickHiddenLocked counts one call against every hidden instance.
func (s *Server) tickHiddenLocked(r *region) {
	for _, in := range r.inst {
		if in.hidden > 0 {
			in.hidden--
		}
	}
}

// instanceFilterValues answers DescribeInstances' filters on an instance.
func instanceFilterValues(in *instance, name string) ([]string, bool) {
	switch name {
	case "instance-state-name":
		return []string{in.state}, true
	case "instance-id":
		return []string{in.id}, true
	case "instance-type":
		return []string{in.typ}, true
	case "availability-zone":
		return []string{in.zone}, true
	case "instance-lifecycle":
		if in.market == MarketSpot {
			return []string{"spot"}, true
		}
		return nil, true
	case "client-token":
		return []string{in.token}, true
	}
	return tagValues(in.tags, name)
}

// anyMatch: a filter matches when any value matches; EC2 values may use
// * and ? wildcards.
func anyMatch(have, want []string) bool {
	for _, h := range have {
		for _, w := range want {
			if wildcard(w, h) {
				return true
			}
		}
	}
	return false
}

func wildcard(pattern, s string) bool {
	if !strings.ContainsAny(pattern, "*?") {
		return pattern == s
	}
	var b strings.Builder
	b.WriteString("^")
	for _, c := range pattern {
		switch c {
		case '*':
			b.WriteString(".*")
		case '?':
			b.WriteString(".")
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	b.WriteString("$")
	ok, _ := regexp.MatchString(b.String(), s)
	return ok
}

// ---- TerminateInstances ----

func (s *Server) terminateInstances(r *region, p params) (answer, *apiError) {
	defer s.tickHiddenLocked(r)
	now := s.now().UTC()
	ids := p.list("InstanceId")
	if len(ids) == 0 {
		return nil, &apiError{Code: "MissingParameter", Message: "The request must contain the parameter InstanceId"}
	}
	var missing []string
	for _, id := range ids {
		if !instanceIDRe.MatchString(id) {
			return nil, &apiError{Code: "InvalidInstanceID.Malformed", Message: fmt.Sprintf("Invalid id: \"%s\"", id)}
		}
		if in, ok := r.inst[id]; !ok || in.hidden > 0 || expired(in, now) {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		return nil, &apiError{Code: "InvalidInstanceID.NotFound", Message: fmt.Sprintf("The instance IDs '%s' do not exist", strings.Join(missing, ", "))}
	}
	resp := &xmlTerminateInstancesResponse{}
	for _, id := range ids {
		in := r.inst[id]
		observeLocked(in, now)
		prev := in.state
		s.terminateLocked(r, in, "Client.UserInitiatedShutdown", now)
		if in.terminatedBy == "" {
			in.terminatedBy = s.lastKey["TerminateInstances"] // set by ServeHTTP for this call
		}
		resp.Instances = append(resp.Instances, xmlStateChange{InstanceID: id, CurrentState: xmlStateOf(in.state), PreviousState: xmlStateOf(prev)})
	}
	return resp, nil
}

// ---- DescribeSpotInstanceRequests ----

func (s *Server) describeSpotInstanceRequests(r *region, p params) (answer, *apiError) {
	ids := p.list("SpotInstanceRequestId")
	var cands []*spotRequest
	if len(ids) > 0 {
		for _, id := range ids {
			sr, ok := r.spot[id]
			if !ok {
				return nil, &apiError{Code: "InvalidSpotInstanceRequestID.NotFound", Message: fmt.Sprintf("The spot instance request ID '%s' does not exist", id)}
			}
			cands = append(cands, sr)
		}
	} else {
		for _, id := range r.spotIDs {
			cands = append(cands, r.spot[id])
		}
	}
	matched, err := filtered(cands, p.filters(), spotRequestFilterValues)
	if err != nil {
		return nil, err
	}
	start, end, next, err := s.page(p, len(matched), 5, 1000)
	if err != nil {
		return nil, err
	}
	resp := &xmlDescribeSpotInstanceRequestsResponse{NextToken: next}
	for _, sr := range matched[start:end] {
		x := xmlSpotRequest{
			SpotInstanceRequestID: sr.id, SpotPrice: strconv.FormatFloat(currentSpotPrice(r, sr.zone, sr.typ)*3, 'f', 6, 64),
			Type: "one-time", State: sr.state,
			Status:     xmlSpotStatus{Code: sr.code, UpdateTime: timestamp(sr.updated), Message: sr.message},
			InstanceID: sr.instanceID, CreateTime: timestamp(sr.created), ProductDescription: "Linux/UNIX",
			LaunchedAvailabilityZone: sr.zone, InstanceInterruptionBehavior: "terminate",
		}
		for k, v := range sr.tags {
			x.Tags = append(x.Tags, xmlTag{Key: k, Value: v})
		}
		resp.Requests = append(resp.Requests, x)
	}
	return resp, nil
}

// spotRequestFilterValues answers DescribeSpotInstanceRequests' filters on
// a request. Of the tag filters the fake knows tag:<key> only.
func spotRequestFilterValues(sr *spotRequest, name string) ([]string, bool) {
	switch name {
	case "instance-id":
		return []string{sr.instanceID}, true
	case "spot-instance-request-id":
		return []string{sr.id}, true
	case "state":
		return []string{sr.state}, true
	case "status-code":
		return []string{sr.code}, true
	}
	if strings.HasPrefix(name, "tag:") {
		return tagValues(sr.tags, name)
	}
	return nil, false
}
