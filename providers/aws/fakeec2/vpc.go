package fakeec2

import (
	"fmt"
	"slices"
	"strings"
)

// DefaultVPC is the id of every region's default VPC and of the VPC a
// subnet added by AddSubnet belongs to.
const DefaultVPC = "vpc-0fa4e000"

// AddSubnetInVPC registers a subnet in zone that belongs to VPC vpc.
func (s *Server) AddSubnetInVPC(id, zone, vpc string) {
	s.AddSubnet(id, zone)
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.regionOfZoneLocked(zone)
	if r.subnetVPC == nil {
		r.subnetVPC = map[string]string{}
	}
	r.subnetVPC[id] = vpc
}

// RemoveDefaultVPC leaves region without a default VPC, as an account
// that deleted it: DescribeVpcs with isDefault=true answers no VPC.
func (s *Server) RemoveDefaultVPC(regionName string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.regionLocked(regionName); r != nil {
		r.noDefaultVPC = true
	}
}

// vpcOf is the VPC subnet id belongs to.
func (r *region) vpcOf(id string) string {
	if v, ok := r.subnetVPC[id]; ok {
		return v
	}
	return DefaultVPC
}

type xmlVpc struct {
	VpcID     string `xml:"vpcId"`
	State     string `xml:"state"`
	CidrBlock string `xml:"cidrBlock"`
	IsDefault bool   `xml:"isDefault"`
	OwnerID   string `xml:"ownerId"`
}

type xmlDescribeVpcsResponse struct {
	xmlHead
	Vpcs []xmlVpc `xml:"vpcSet>item"`
}

// describeVpcs answers the region's VPCs: its default one (unless
// removed) and those of its subnets, narrowed by VpcId.N and the filters
// vpc-id and isDefault, as EC2 does.
func (s *Server) describeVpcs(r *region, p params) (answer, *apiError) {
	var all []xmlVpc
	if !r.noDefaultVPC {
		all = append(all, xmlVpc{VpcID: DefaultVPC, State: "available", CidrBlock: "172.31.0.0/16", IsDefault: true, OwnerID: s.opts.OwnerID})
	}
	for _, v := range r.subnetVPC {
		if !slices.ContainsFunc(all, func(x xmlVpc) bool { return x.VpcID == v }) {
			all = append(all, xmlVpc{VpcID: v, State: "available", CidrBlock: "10.0.0.0/16", OwnerID: s.opts.OwnerID})
		}
	}
	slices.SortFunc(all, func(a, b xmlVpc) int { return strings.Compare(a.VpcID, b.VpcID) })
	ids := p.list("VpcId")
	for _, id := range ids {
		if !slices.ContainsFunc(all, func(x xmlVpc) bool { return x.VpcID == id }) {
			return nil, &apiError{Code: "InvalidVpcID.NotFound", Message: fmt.Sprintf("The vpc ID '%s' does not exist", id)}
		}
	}
	resp := &xmlDescribeVpcsResponse{}
	for _, v := range all {
		if len(ids) > 0 && !slices.Contains(ids, v.VpcID) {
			continue
		}
		keep := true
		for _, f := range p.filters() {
			switch f.Name {
			case "isDefault", "is-default":
				keep = keep && slices.Contains(f.Values, fmt.Sprint(v.IsDefault))
			case "vpc-id":
				keep = keep && slices.Contains(f.Values, v.VpcID)
			default:
				return nil, invalidFilter(f.Name)
			}
		}
		if keep {
			resp.Vpcs = append(resp.Vpcs, v)
		}
	}
	return resp, nil
}
