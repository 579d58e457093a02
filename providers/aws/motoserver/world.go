package motoserver

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
)

// Static test credentials the helpers sign with. Any key works while IAM
// enforcement is off; moto maps every key to account AccountID.
const (
	AccessKeyID     = "AKIAFLEETDMOTO000001"
	SecretAccessKey = "fleetd-moto-secret"
	AccountID       = "123456789012"
)

// Config is an SDK configuration for region that reaches this server with
// the static test credentials, whatever the caller's environment holds.
// Build other clients from it, or replace Credentials (e.g. with an IAM
// user's key from CreateUser) for permission tests.
func (s *Server) Config(region string) awssdk.Config {
	return awssdk.Config{
		Region:       region,
		Credentials:  credentials.NewStaticCredentialsProvider(AccessKeyID, SecretAccessKey, ""),
		BaseEndpoint: awssdk.String(s.url),
	}
}

// EC2 returns an EC2 client for region.
func (s *Server) EC2(region string) *ec2.Client { return ec2.NewFromConfig(s.Config(region)) }

// SQS returns an SQS client for region.
func (s *Server) SQS(region string) *sqs.Client { return sqs.NewFromConfig(s.Config(region)) }

// Network is an AWS world in one region made by SetupNetwork.
type Network struct {
	Region        string
	VPC           string
	Subnets       map[string]string // zone → subnet id
	SecurityGroup string
	// Image is an AMI moto knows in the region (one of its bundled Amazon
	// Linux 2 x86_64 images), so RunInstances accepts it.
	Image string
}

// SetupNetwork creates a VPC (10.0.0.0/16) in region with one /24 subnet
// per zone and a security group, and picks an AMI moto knows there. Each
// call makes a new VPC, so tests sharing a server do not collide.
func (s *Server) SetupNetwork(ctx context.Context, region string, zones []string) (Network, error) {
	if len(zones) > 255 {
		return Network{}, fmt.Errorf("moto: %d zones, at most 255 subnets fit 10.0.0.0/16", len(zones))
	}
	c := s.EC2(region)
	n := Network{Region: region, Subnets: map[string]string{}}
	vpc, err := c.CreateVpc(ctx, &ec2.CreateVpcInput{CidrBlock: awssdk.String("10.0.0.0/16")})
	if err != nil {
		return Network{}, fmt.Errorf("moto: CreateVpc in %s: %w", region, err)
	}
	n.VPC = awssdk.ToString(vpc.Vpc.VpcId)
	for i, z := range zones {
		sn, err := c.CreateSubnet(ctx, &ec2.CreateSubnetInput{
			VpcId: vpc.Vpc.VpcId, AvailabilityZone: awssdk.String(z), CidrBlock: awssdk.String(fmt.Sprintf("10.0.%d.0/24", i)),
		})
		if err != nil {
			return Network{}, fmt.Errorf("moto: CreateSubnet in %s: %w", z, err)
		}
		n.Subnets[z] = awssdk.ToString(sn.Subnet.SubnetId)
	}
	sg, err := c.CreateSecurityGroup(ctx, &ec2.CreateSecurityGroupInput{
		GroupName: awssdk.String("fleetd-nodes-" + n.VPC), Description: awssdk.String("fleetd test nodes"), VpcId: vpc.Vpc.VpcId,
	})
	if err != nil {
		return Network{}, fmt.Errorf("moto: CreateSecurityGroup in %s: %w", region, err)
	}
	n.SecurityGroup = awssdk.ToString(sg.GroupId)
	if n.Image, err = s.Image(ctx, region); err != nil {
		return Network{}, err
	}
	return n, nil
}

// Image returns the id of an Amazon Linux 2 x86_64 AMI moto ships for
// region (the newest, so the choice is stable).
func (s *Server) Image(ctx context.Context, region string) (string, error) {
	resp, err := s.EC2(region).DescribeImages(ctx, &ec2.DescribeImagesInput{
		Owners: []string{"amazon"},
		Filters: []types.Filter{
			{Name: awssdk.String("name"), Values: []string{"amzn2-ami-hvm-*"}},
			{Name: awssdk.String("architecture"), Values: []string{"x86_64"}},
		},
	})
	if err != nil {
		return "", fmt.Errorf("moto: DescribeImages in %s: %w", region, err)
	}
	imgs := resp.Images
	if len(imgs) == 0 {
		return "", fmt.Errorf("moto: no Amazon Linux 2 x86_64 image in %s", region)
	}
	slices.SortFunc(imgs, func(a, b types.Image) int {
		if c := strings.Compare(awssdk.ToString(b.CreationDate), awssdk.ToString(a.CreationDate)); c != 0 {
			return c
		}
		return strings.Compare(awssdk.ToString(a.ImageId), awssdk.ToString(b.ImageId))
	})
	return awssdk.ToString(imgs[0].ImageId), nil
}

// CreateInstanceProfile creates an IAM instance profile (moto checks
// RunInstances' IamInstanceProfile against IAM) and returns its ARN; one
// that exists already is fine.
func (s *Server) CreateInstanceProfile(ctx context.Context, name string) (string, error) {
	var out struct {
		Arn string `xml:"CreateInstanceProfileResult>InstanceProfile>Arn"`
	}
	err := s.iam(ctx, url.Values{"Action": {"CreateInstanceProfile"}, "InstanceProfileName": {name}}, &out)
	var ae *APIError
	if errors.As(err, &ae) && ae.Code == "EntityAlreadyExists" {
		var got struct {
			Arn string `xml:"GetInstanceProfileResult>InstanceProfile>Arn"`
		}
		if err := s.iam(ctx, url.Values{"Action": {"GetInstanceProfile"}, "InstanceProfileName": {name}}, &got); err != nil {
			return "", err
		}
		return got.Arn, nil
	}
	if err != nil {
		return "", err
	}
	return out.Arn, nil
}

// CreateUser creates an IAM user with an inline policy (a JSON policy
// document) and an access key, and returns the key: sign with it after
// EnforceIAM to test what the policy allows.
func (s *Server) CreateUser(ctx context.Context, name, policy string) (awssdk.Credentials, error) {
	if err := s.iam(ctx, url.Values{"Action": {"CreateUser"}, "UserName": {name}}, nil); err != nil {
		return awssdk.Credentials{}, err
	}
	if err := s.iam(ctx, url.Values{"Action": {"PutUserPolicy"}, "UserName": {name}, "PolicyName": {name}, "PolicyDocument": {policy}}, nil); err != nil {
		return awssdk.Credentials{}, err
	}
	var key struct {
		ID     string `xml:"CreateAccessKeyResult>AccessKey>AccessKeyId"`
		Secret string `xml:"CreateAccessKeyResult>AccessKey>SecretAccessKey"`
	}
	if err := s.iam(ctx, url.Values{"Action": {"CreateAccessKey"}, "UserName": {name}}, &key); err != nil {
		return awssdk.Credentials{}, err
	}
	return awssdk.Credentials{AccessKeyID: key.ID, SecretAccessKey: key.Secret, Source: "moto IAM user " + name}, nil
}

// iam calls one IAM Query action (the SDK's IAM client is not a
// dependency of fleetd) and decodes the answer into out, if not nil.
func (s *Server) iam(ctx context.Context, form url.Values, out any) error {
	form.Set("Version", "2010-05-08")
	body, err := s.Query(ctx, "iam", "us-east-1", form)
	if err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	if err := xml.Unmarshal(body, out); err != nil {
		return fmt.Errorf("moto: iam %s: decode: %w", form.Get("Action"), err)
	}
	return nil
}

// APIError is an error answer of Query.
type APIError struct {
	Action     string
	StatusCode int
	Code       string
	Message    string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("moto: %s: HTTP %d %s: %s", e.Action, e.StatusCode, e.Code, e.Message)
}

// Query sends one AWS Query-protocol request (form-encoded POST) for
// service in region, signed with SigV4 and the static test credentials
// (moto routes on the signature's service), and returns the response body;
// an error answer is an *APIError.
func (s *Server) Query(ctx context.Context, service, region string, form url.Values) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	payload := form.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/", strings.NewReader(payload))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded; charset=utf-8")
	sum := sha256.Sum256([]byte(payload))
	creds := awssdk.Credentials{AccessKeyID: AccessKeyID, SecretAccessKey: SecretAccessKey}
	if err := v4.NewSigner().SignHTTP(ctx, creds, req, hex.EncodeToString(sum[:]), service, region, time.Now()); err != nil {
		return nil, fmt.Errorf("moto: sign %s: %w", form.Get("Action"), err)
	}
	resp, err := adminClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("moto: %s %s: %w", service, form.Get("Action"), err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("moto: %s %s: %w", service, form.Get("Action"), err)
	}
	if resp.StatusCode/100 != 2 {
		ae := &APIError{Action: service + " " + form.Get("Action"), StatusCode: resp.StatusCode}
		ae.Code, ae.Message = errorFields(body)
		return nil, ae
	}
	return body, nil
}

// errorFields finds the first Code and Message elements of an XML error
// answer (IAM nests them in ErrorResponse>Error, EC2 in Response>Errors>Error).
func errorFields(body []byte) (code, msg string) {
	dec := xml.NewDecoder(bytes.NewReader(body))
	for {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		se, ok := tok.(xml.StartElement)
		if !ok || (se.Name.Local != "Code" && se.Name.Local != "Message") {
			continue
		}
		var v string
		if dec.DecodeElement(&v, &se) != nil {
			break
		}
		if se.Name.Local == "Code" && code == "" {
			code = v
		} else if se.Name.Local == "Message" && msg == "" {
			msg = v
		}
	}
	if code == "" {
		msg = strings.TrimSpace(string(body))
		if len(msg) > 300 {
			msg = msg[:300] + "…"
		}
	}
	return code, msg
}
