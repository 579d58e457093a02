package fakeec2

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// The preflight calls (`fleetd check`): DryRun on the mutating calls,
// DescribeImages, DescribeSubnets, DescribeSecurityGroups, and Service
// Quotas' GetServiceQuota (JSON protocol, on the same endpoint).

// Deny makes every call of action (DryRun or not) fail with
// UnauthorizedOperation, as for an IAM policy without it.
func (s *Server) Deny(action string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.denied == nil {
		s.denied = map[string]bool{}
	}
	s.denied[action] = true
}

// AddSecurityGroup creates a security group in region. Like EC2 (and
// moto), the fake knows only groups that exist: RunInstances and
// DescribeSecurityGroups answer InvalidGroup.NotFound for any other id,
// including another region's.
func (s *Server) AddSecurityGroup(regionName, groupID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.regionLocked(regionName).groups[groupID] = true
}

// RemoveSecurityGroup deletes a security group of region.
func (s *Server) RemoveSecurityGroup(regionName, groupID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.regionLocked(regionName).groups, groupID)
}

// dryRunnable are the actions whose DryRun the fake answers after its
// permission check, without doing anything.
var dryRunnable = map[string]bool{"RunInstances": true, "CreateTags": true, "TerminateInstances": true, "CreatePlacementGroup": true, "DeletePlacementGroup": true}

// preflightLocked applies Deny and DryRun to a request before dispatch.
// It returns a non-nil error when the request is answered here.
func (s *Server) preflightLocked(r *region, action string, p params) *apiError {
	if s.denied[action] {
		return &apiError{Code: "UnauthorizedOperation", Message: fmt.Sprintf("You are not authorized to perform this operation. User: arn:aws:iam::%s:user/fleetd is not authorized to perform: ec2:%s because no identity-based policy allows the ec2:%s action", s.opts.OwnerID, action, action)}
	}
	if p.get("DryRun") != "true" || !dryRunnable[action] {
		return nil
	}
	if action == "RunInstances" {
		// EC2 validates the request's parameters before it answers a dry run.
		if img := p.get("ImageId"); !amiIDRe.MatchString(img) || r.noImages[img] {
			return &apiError{Code: "InvalidAMIID.NotFound", Message: fmt.Sprintf("The image id '[%s]' does not exist", img)}
		}
		if sn := p.get("SubnetId"); sn != "" {
			if _, ok := r.subnets[sn]; !ok {
				return &apiError{Code: "InvalidSubnetID.NotFound", Message: fmt.Sprintf("The subnet ID '%s' does not exist", sn)}
			}
		}
	}
	return &apiError{Code: "DryRunOperation", Message: "Request would have succeeded, but DryRun flag is set."}
}

type xmlImage struct {
	ImageID      string `xml:"imageId"`
	Name         string `xml:"name"`
	State        string `xml:"imageState"`
	Architecture string `xml:"architecture"`
}

type xmlDescribeImagesResponse struct {
	xmlHead
	Images []xmlImage `xml:"imagesSet>item"`
}

func (s *Server) describeImages(r *region, p params) (answer, *apiError) {
	resp := &xmlDescribeImagesResponse{}
	for _, id := range p.list("ImageId") {
		if !amiIDRe.MatchString(id) {
			return nil, &apiError{Code: "InvalidAMIID.Malformed", Message: fmt.Sprintf("Invalid id: \"%s\"", id)}
		}
		if r.noImages[id] {
			return nil, &apiError{Code: "InvalidAMIID.NotFound", Message: fmt.Sprintf("The image id '[%s]' does not exist", id)}
		}
		resp.Images = append(resp.Images, xmlImage{ImageID: id, Name: "fake-dlami-" + id, State: "available", Architecture: "x86_64"})
	}
	return resp, nil
}

type xmlSubnet struct {
	SubnetID         string `xml:"subnetId"`
	State            string `xml:"state"`
	VpcID            string `xml:"vpcId"`
	AvailabilityZone string `xml:"availabilityZone"`
	AvailableIPs     int    `xml:"availableIpAddressCount"`
}

type xmlDescribeSubnetsResponse struct {
	xmlHead
	Subnets []xmlSubnet `xml:"subnetSet>item"`
}

func (s *Server) describeSubnets(r *region, p params) (answer, *apiError) {
	resp := &xmlDescribeSubnetsResponse{}
	for _, id := range p.list("SubnetId") {
		zone, ok := r.subnets[id]
		if !ok {
			return nil, &apiError{Code: "InvalidSubnetID.NotFound", Message: fmt.Sprintf("The subnet ID '%s' does not exist", id)}
		}
		resp.Subnets = append(resp.Subnets, xmlSubnet{SubnetID: id, State: "available", VpcID: r.vpcOf(id), AvailabilityZone: zone, AvailableIPs: 250})
	}
	return resp, nil
}

type xmlSecurityGroup struct {
	GroupID   string `xml:"groupId"`
	GroupName string `xml:"groupName"`
	VpcID     string `xml:"vpcId"`
	OwnerID   string `xml:"ownerId"`
	// Rules as botocore's IpPermission: ipPermissions (ingress) and
	// ipPermissionsEgress, each with ipProtocol and groups (UserIdGroupPair).
	Ingress []xmlIPPermission `xml:"ipPermissions>item"`
	Egress  []xmlIPPermission `xml:"ipPermissionsEgress>item"`
}

type xmlIPPermission struct {
	Protocol string         `xml:"ipProtocol"`
	Groups   []xmlGroupPair `xml:"groups>item,omitempty"`
	Ranges   []xmlIPRange   `xml:"ipRanges>item,omitempty"`
}

type xmlGroupPair struct {
	GroupID string `xml:"groupId"`
	UserID  string `xml:"userId"`
}

type xmlIPRange struct {
	CIDR string `xml:"cidrIp"`
}

type xmlDescribeSecurityGroupsResponse struct {
	xmlHead
	Groups []xmlSecurityGroup `xml:"securityGroupInfo>item"`
}

func (s *Server) describeSecurityGroups(r *region, p params) (answer, *apiError) {
	resp := &xmlDescribeSecurityGroupsResponse{}
	for _, id := range p.list("GroupId") {
		if !strings.HasPrefix(id, "sg-") {
			return nil, &apiError{Code: "InvalidGroupId.Malformed", Message: fmt.Sprintf("Invalid id: \"%s\" (expecting \"sg-...\")", id)}
		}
		if !r.groups[id] {
			return nil, &apiError{Code: "InvalidGroup.NotFound", Message: fmt.Sprintf("The security group '%s' does not exist", id)}
		}
		sg := xmlSecurityGroup{GroupID: id, GroupName: "fleetd-" + id, VpcID: "vpc-0fa4e000", OwnerID: s.opts.OwnerID,
			// A new group's default: all traffic out to anywhere, nothing in.
			Egress: []xmlIPPermission{{Protocol: "-1", Ranges: []xmlIPRange{{CIDR: "0.0.0.0/0"}}}}}
		if r.selfRule[id] {
			self := xmlIPPermission{Protocol: "-1", Groups: []xmlGroupPair{{GroupID: id, UserID: s.opts.OwnerID}}}
			sg.Ingress = append(sg.Ingress, self)
			sg.Egress = append(sg.Egress, self)
		}
		resp.Groups = append(resp.Groups, sg)
	}
	return resp, nil
}

// quotaNames are the EC2 vCPU quota codes the fake knows, by market.
var quotaNames = map[string]struct{ market, name string }{
	"L-1216C47A": {MarketOnDemand, "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"},
	"L-DB2E81BA": {MarketOnDemand, "Running On-Demand G and VT instances"},
	"L-417A185B": {MarketOnDemand, "Running On-Demand P instances"},
	"L-34B43A08": {MarketSpot, "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests"},
	"L-3819A6DF": {MarketSpot, "All G and VT Spot Instance Requests"},
	"L-7212CCBC": {MarketSpot, "All P Spot Instance Requests"},
}

// DefaultQuotaVCPUs is what GetServiceQuota reports for a market without
// SetVCPUQuota.
const DefaultQuotaVCPUs = 4096

// serveServiceQuotas answers a Service Quotas JSON 1.1 request
// (X-Amz-Target: ServiceQuotasV20190624.GetServiceQuota) from the fake's
// vCPU quotas, so a quota set with SetVCPUQuota is what a preflight sees.
func (s *Server) serveServiceQuotas(w http.ResponseWriter, req *http.Request, target string) {
	fail := func(status int, typ, msg string) {
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(map[string]string{"__type": typ, "message": msg})
	}
	region := ""
	if i := strings.Index(req.Header.Get("Authorization"), "Credential="); i >= 0 {
		scope := strings.Split(strings.SplitN(req.Header.Get("Authorization")[i+len("Credential="):], ",", 2)[0], "/")
		if len(scope) == 5 {
			region = scope[2]
		}
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	if err != nil {
		fail(http.StatusBadRequest, "IllegalArgumentException", err.Error())
		return
	}
	var in struct{ ServiceCode, QuotaCode string }
	if err := json.Unmarshal(body, &in); err != nil {
		fail(http.StatusBadRequest, "IllegalArgumentException", err.Error())
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	action := strings.TrimPrefix(target, "ServiceQuotasV20190624.")
	s.calls["servicequotas:"+action]++
	if s.denied["servicequotas:"+action] {
		fail(http.StatusBadRequest, "AccessDeniedException", "User is not authorized to perform: servicequotas:"+action)
		return
	}
	if action != "GetServiceQuota" {
		fail(http.StatusBadRequest, "UnknownOperationException", "unknown operation "+action)
		return
	}
	q, ok := quotaNames[in.QuotaCode]
	r := s.regionLocked(region)
	if in.ServiceCode != "ec2" || !ok || r == nil {
		fail(http.StatusBadRequest, "NoSuchResourceException", fmt.Sprintf("The request failed because the specified quota %s/%s does not exist.", in.ServiceCode, in.QuotaCode))
		return
	}
	v, set := r.quota[q.market]
	if !set {
		v = DefaultQuotaVCPUs
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	_ = json.NewEncoder(w).Encode(map[string]any{"Quota": map[string]any{
		"ServiceCode": "ec2", "QuotaCode": in.QuotaCode, "QuotaName": q.name, "Value": float64(v), "Unit": "None", "Adjustable": true,
	}})
}
