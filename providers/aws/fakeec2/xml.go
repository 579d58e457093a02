package fakeec2

import "encoding/xml"

// Namespace is the XML namespace of every EC2 response (API version 2016-11-15).
const Namespace = "http://ec2.amazonaws.com/doc/2016-11-15/"

// The types below are the subset of the EC2 XML response shapes the fake
// serves. Element names are the EC2 wire names (camelCase, lists as
// <xxxSet><item>…</item></xxxSet>), the names the SDK's deserializers match.

// xmlHead opens every answer's body. ServeHTTP fills it in and names the
// answer's element as EC2 does, <{Action}Response xmlns="Namespace">, so a
// handler builds only the body.
type xmlHead struct {
	RequestID string `xml:"requestId"`
}

// answer is what an action handler returns: a pointer to a response type
// that embeds xmlHead.
type answer interface{ head() *xmlHead }

func (h *xmlHead) head() *xmlHead { return h }

type xmlErrorResponse struct {
	XMLName   xml.Name   `xml:"Response"`
	Errors    []xmlError `xml:"Errors>Error"`
	RequestID string     `xml:"RequestID"`
}

type xmlError struct {
	Code    string `xml:"Code"`
	Message string `xml:"Message"`
}

type xmlTag struct {
	Key   string `xml:"key"`
	Value string `xml:"value"`
}

type xmlState struct {
	Code int    `xml:"code"`
	Name string `xml:"name"`
}

type xmlPlacement struct {
	AvailabilityZone string `xml:"availabilityZone"`
	GroupName        string `xml:"groupName,omitempty"`
	Tenancy          string `xml:"tenancy"`
}

type xmlGroup struct {
	GroupID   string `xml:"groupId"`
	GroupName string `xml:"groupName,omitempty"`
}

type xmlIamProfile struct {
	Arn string `xml:"arn"`
	ID  string `xml:"id"`
}

type xmlStateReason struct {
	Code    string `xml:"code"`
	Message string `xml:"message"`
}

type xmlInstance struct {
	InstanceID            string              `xml:"instanceId"`
	ImageID               string              `xml:"imageId"`
	State                 xmlState            `xml:"instanceState"`
	PrivateDNSName        string              `xml:"privateDnsName"`
	KeyName               string              `xml:"keyName,omitempty"`
	AmiLaunchIndex        int                 `xml:"amiLaunchIndex"`
	InstanceType          string              `xml:"instanceType"`
	LaunchTime            string              `xml:"launchTime"`
	Placement             xmlPlacement        `xml:"placement"`
	SubnetID              string              `xml:"subnetId,omitempty"`
	VpcID                 string              `xml:"vpcId,omitempty"`
	PrivateIPAddress      string              `xml:"privateIpAddress,omitempty"`
	Groups                []xmlGroup          `xml:"groupSet>item"`
	StateReason           *xmlStateReason     `xml:"stateReason,omitempty"`
	Architecture          string              `xml:"architecture"`
	IamInstanceProfile    *xmlIamProfile      `xml:"iamInstanceProfile,omitempty"`
	InstanceLifecycle     string              `xml:"instanceLifecycle,omitempty"`
	SpotInstanceRequestID string              `xml:"spotInstanceRequestId,omitempty"`
	ClientToken           string              `xml:"clientToken,omitempty"`
	Tags                  []xmlTag            `xml:"tagSet>item,omitempty"`
	MetadataOptions       *xmlMetadataOptions `xml:"metadataOptions,omitempty"`
	NICs                  []xmlInstanceNIC    `xml:"networkInterfaceSet>item,omitempty"`
}

type xmlMetadataOptions struct {
	State        string `xml:"state"`
	HTTPTokens   string `xml:"httpTokens"`
	HopLimit     int    `xml:"httpPutResponseHopLimit"`
	HTTPEndpoint string `xml:"httpEndpoint"`
}

type xmlReservation struct {
	ReservationID string        `xml:"reservationId"`
	OwnerID       string        `xml:"ownerId"`
	Groups        []xmlGroup    `xml:"groupSet>item"`
	Instances     []xmlInstance `xml:"instancesSet>item"`
}

type xmlRunInstancesResponse struct {
	xmlHead
	xmlReservation
}

type xmlDescribeInstancesResponse struct {
	xmlHead
	Reservations []xmlReservation `xml:"reservationSet>item"`
	NextToken    string           `xml:"nextToken,omitempty"`
}

type xmlStateChange struct {
	InstanceID    string   `xml:"instanceId"`
	CurrentState  xmlState `xml:"currentState"`
	PreviousState xmlState `xml:"previousState"`
}

type xmlTerminateInstancesResponse struct {
	xmlHead
	Instances []xmlStateChange `xml:"instancesSet>item"`
}

type xmlGPUDevice struct {
	Name         string `xml:"name"`
	Manufacturer string `xml:"manufacturer"`
	Count        int    `xml:"count"`
	MemoryMiB    int    `xml:"memoryInfo>sizeInMiB"`
}

type xmlGPUInfo struct {
	GPUs           []xmlGPUDevice `xml:"gpus>item"`
	TotalMemoryMiB int            `xml:"totalGpuMemoryInMiB"`
}

type xmlInstanceTypeInfo struct {
	InstanceType          string          `xml:"instanceType"`
	CurrentGeneration     bool            `xml:"currentGeneration"`
	SupportedUsageClasses []string        `xml:"supportedUsageClasses>item"`
	DefaultVCPUs          int             `xml:"vCpuInfo>defaultVCpus"`
	MemoryMiB             int             `xml:"memoryInfo>sizeInMiB"`
	Architectures         []string        `xml:"processorInfo>supportedArchitectures>item"`
	GPUInfo               *xmlGPUInfo     `xml:"gpuInfo,omitempty"`
	NetworkInfo           *xmlNetworkInfo `xml:"networkInfo,omitempty"`
}

// xmlNetworkInfo is DescribeInstanceTypes' NetworkInfo (botocore ec2
// model: networkPerformance, maximumNetworkInterfaces, maximumNetworkCards,
// defaultNetworkCardIndex, networkCards, efaSupported, efaInfo).
type xmlNetworkInfo struct {
	NetworkPerformance  string               `xml:"networkPerformance"`
	MaxInterfaces       int                  `xml:"maximumNetworkInterfaces"`
	MaxCards            int                  `xml:"maximumNetworkCards"`
	DefaultCardIndex    int                  `xml:"defaultNetworkCardIndex"`
	Cards               []xmlNetworkCardInfo `xml:"networkCards>item"`
	EnaSupport          string               `xml:"enaSupport"`
	EfaSupported        bool                 `xml:"efaSupported"`
	MaximumEfaInterface *int                 `xml:"efaInfo>maximumEfaInterfaces,omitempty"`
}

type xmlNetworkCardInfo struct {
	Index              int     `xml:"networkCardIndex"`
	NetworkPerformance string  `xml:"networkPerformance"`
	MaxInterfaces      int     `xml:"maximumNetworkInterfaces"`
	BaselineGbps       float64 `xml:"baselineBandwidthInGbps"`
	PeakGbps           float64 `xml:"peakBandwidthInGbps"`
}

type xmlPlacementGroup struct {
	GroupName string   `xml:"groupName"`
	State     string   `xml:"state"`
	Strategy  string   `xml:"strategy"`
	GroupID   string   `xml:"groupId"`
	GroupArn  string   `xml:"groupArn"`
	Tags      []xmlTag `xml:"tagSet>item,omitempty"`
}

type xmlCreatePlacementGroupResponse struct {
	xmlHead
	Group xmlPlacementGroup `xml:"placementGroup"`
}

type xmlDescribePlacementGroupsResponse struct {
	xmlHead
	Groups []xmlPlacementGroup `xml:"placementGroupSet>item"`
}

type xmlReturnResponse struct {
	xmlHead
	Return bool `xml:"return"`
}

// xmlInstanceNIC is one of an instance's networkInterfaceSet items.
type xmlInstanceNIC struct {
	ID            string `xml:"networkInterfaceId"`
	SubnetID      string `xml:"subnetId"`
	InterfaceType string `xml:"interfaceType"`
	PrivateIP     string `xml:"privateIpAddress,omitempty"`
	DeviceIndex   int    `xml:"attachment>deviceIndex"`
	CardIndex     int    `xml:"attachment>networkCardIndex"`
}

type xmlDescribeInstanceTypesResponse struct {
	xmlHead
	InstanceTypes []xmlInstanceTypeInfo `xml:"instanceTypeSet>item"`
	NextToken     string                `xml:"nextToken,omitempty"`
}

type xmlSpotPrice struct {
	InstanceType       string `xml:"instanceType"`
	ProductDescription string `xml:"productDescription"`
	SpotPrice          string `xml:"spotPrice"`
	Timestamp          string `xml:"timestamp"`
	AvailabilityZone   string `xml:"availabilityZone"`
}

type xmlDescribeSpotPriceHistoryResponse struct {
	xmlHead
	Prices    []xmlSpotPrice `xml:"spotPriceHistorySet>item"`
	NextToken string         `xml:"nextToken,omitempty"`
}

type xmlSpotStatus struct {
	Code       string `xml:"code"`
	UpdateTime string `xml:"updateTime"`
	Message    string `xml:"message"`
}

type xmlSpotRequest struct {
	SpotInstanceRequestID        string        `xml:"spotInstanceRequestId"`
	SpotPrice                    string        `xml:"spotPrice"`
	Type                         string        `xml:"type"`
	State                        string        `xml:"state"`
	Status                       xmlSpotStatus `xml:"status"`
	InstanceID                   string        `xml:"instanceId,omitempty"`
	CreateTime                   string        `xml:"createTime"`
	ProductDescription           string        `xml:"productDescription"`
	LaunchedAvailabilityZone     string        `xml:"launchedAvailabilityZone"`
	InstanceInterruptionBehavior string        `xml:"instanceInterruptionBehavior"`
	Tags                         []xmlTag      `xml:"tagSet>item,omitempty"`
}

type xmlDescribeSpotInstanceRequestsResponse struct {
	xmlHead
	Requests  []xmlSpotRequest `xml:"spotInstanceRequestSet>item"`
	NextToken string           `xml:"nextToken,omitempty"`
}

type xmlAvailabilityZone struct {
	ZoneName   string `xml:"zoneName"`
	ZoneID     string `xml:"zoneId"`
	State      string `xml:"zoneState"`
	RegionName string `xml:"regionName"`
	ZoneType   string `xml:"zoneType"`
}

type xmlDescribeAvailabilityZonesResponse struct {
	xmlHead
	Zones []xmlAvailabilityZone `xml:"availabilityZoneInfo>item"`
}
