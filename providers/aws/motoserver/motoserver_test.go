package motoserver_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/smithy-go"

	"github.com/fleetd/fleetd/internal/testutil"
	"github.com/fleetd/fleetd/providers/aws/motoserver"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if err := motoserver.CloseShared(); err != nil {
		println(err.Error())
		code = 1
	}
	os.Exit(code)
}

func ctxT(t *testing.T) context.Context { return testutil.Context(t, 30*time.Second) }

func apiCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// TestStartFailures checks the errors of a missing or broken moto_server,
// with stand-ins on PATH.
func TestStartFailures(t *testing.T) {
	tests := []struct {
		name   string
		script string // "" : no moto_server on PATH at all
		want   []string
		is     error
	}{
		{name: "missing", want: []string{"moto_server not on PATH", ".ci/run"}, is: exec.ErrNotFound},
		{name: "exits", script: "#!/bin/sh\necho 'ModuleNotFoundError: No module named flask' >&2\nexit 1\n",
			want: []string{"exited before it answered", "No module named flask"}},
		{name: "port taken", script: "#!/bin/sh\necho 'OSError: [Errno 98] Address already in use' >&2\nexit 1\n",
			want: []string{"Address already in use"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.script != "" {
				if err := os.WriteFile(filepath.Join(dir, motoserver.Binary), []byte(tc.script), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			t.Setenv("PATH", dir)
			start := time.Now()
			s, err := motoserver.Start(ctxT(t))
			if err == nil {
				s.Close()
				t.Fatal("Start succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("error %v is not %v", err, tc.is)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("failing Start took %v", d)
			}
		})
	}
}

// TestSetupNetwork builds a world per region and launches into it.
func TestSetupNetwork(t *testing.T) {
	s := motoserver.Shared(t)
	ctx := ctxT(t)
	profile, err := s.CreateInstanceProfile(ctx, "fleetd-node")
	if err != nil {
		t.Fatal(err)
	}
	if again, err := s.CreateInstanceProfile(ctx, "fleetd-node"); err != nil || again != profile {
		t.Errorf("CreateInstanceProfile again = %q, %v; want %q", again, err, profile)
	}
	tests := []struct {
		region string
		zones  []string
	}{
		{"us-east-1", []string{"us-east-1a", "us-east-1b"}},
		{"us-west-2", []string{"us-west-2a"}},
	}
	for _, tc := range tests {
		t.Run(tc.region, func(t *testing.T) {
			n, err := s.SetupNetwork(ctx, tc.region, tc.zones)
			if err != nil {
				t.Fatal(err)
			}
			c := s.EC2(tc.region)
			for _, z := range tc.zones {
				out, err := c.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{SubnetIds: []string{n.Subnets[z]}})
				if err != nil || len(out.Subnets) != 1 {
					t.Fatalf("DescribeSubnets %s: %v", n.Subnets[z], err)
				}
				if got := awssdk.ToString(out.Subnets[0].AvailabilityZone); got != z {
					t.Errorf("subnet %s in %s, want %s", n.Subnets[z], got, z)
				}
				if got := awssdk.ToString(out.Subnets[0].VpcId); got != n.VPC {
					t.Errorf("subnet %s in VPC %s, want %s", n.Subnets[z], got, n.VPC)
				}
			}
			run, err := c.RunInstances(ctx, &ec2.RunInstancesInput{
				ImageId: awssdk.String(n.Image), InstanceType: "g5.xlarge", MinCount: awssdk.Int32(1), MaxCount: awssdk.Int32(1),
				SubnetId: awssdk.String(n.Subnets[tc.zones[0]]), SecurityGroupIds: []string{n.SecurityGroup},
				IamInstanceProfile: &ec2types.IamInstanceProfileSpecification{Name: awssdk.String("fleetd-node")},
			})
			if err != nil {
				t.Fatalf("RunInstances into the new network: %v", err)
			}
			id := awssdk.ToString(run.Instances[0].InstanceId)
			if _, err := c.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{id}}); err != nil {
				t.Errorf("TerminateInstances %s: %v", id, err)
			}
		})
	}
	if _, err := s.SQS("us-east-1").CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: awssdk.String("fleetd-motoserver-test")}); err != nil {
		t.Errorf("SQS CreateQueue: %v", err)
	}
}

// TestOwnServer runs the checks that need a server of their own (IAM
// enforcement is global), then checks that Close leaves no process, port
// or temp dir behind.
func TestOwnServer(t *testing.T) {
	if os.Getenv(motoserver.NoMotoEnv) == "1" {
		t.Skip("FLEETD_NO_MOTO=1")
	}
	s, err := motoserver.Start(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pid := s.Pid()
	t.Run("IAMEnforcement", func(t *testing.T) { testIAMEnforcement(t, s) })

	u, _ := url.Parse(s.URL())
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := syscall.Kill(-pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("process group %d after Close: kill 0 = %v, want ESRCH", pid, err)
	}
	if c, err := net.DialTimeout("tcp", u.Host, time.Second); err == nil {
		c.Close()
		t.Errorf("%s still accepts connections after Close", u.Host)
	}
	if !strings.Contains(s.LogTail(), "no log") {
		t.Errorf("log survived Close: %q", s.LogTail())
	}
}

// testIAMEnforcement pins how moto answers calls an IAM policy denies.
func testIAMEnforcement(t *testing.T, s *motoserver.Server) {
	ctx := ctxT(t)
	creds, err := s.CreateUser(ctx, "describe-only", `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"ec2:Describe*","Resource":"*"}]}`)
	if err != nil {
		t.Fatal(err)
	}
	image, err := s.Image(ctx, "us-east-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.EnforceIAM(ctx, 0); err != nil {
		t.Fatal(err)
	}
	user := s.Config("us-east-1")
	user.Credentials = credentials.StaticCredentialsProvider{Value: creds}
	uc := ec2.NewFromConfig(user, func(o *ec2.Options) { o.RetryMaxAttempts = 1 })
	run := &ec2.RunInstancesInput{ImageId: awssdk.String(image), InstanceType: "g5.xlarge", MinCount: awssdk.Int32(1), MaxCount: awssdk.Int32(1)}

	tests := []struct {
		name string
		call func() error
		want string // error code, "" for success
	}{
		{"allowed", func() error { _, err := uc.DescribeInstances(ctx, &ec2.DescribeInstancesInput{}); return err }, ""},
		{"denied", func() error { _, err := uc.RunInstances(ctx, run); return err }, "AccessDenied"},
		{"denied dry run", func() error {
			in := *run
			in.DryRun = awssdk.Bool(true)
			_, err := uc.RunInstances(ctx, &in)
			return err
		}, "AccessDenied"},
		{"allowed dry run", func() error {
			_, err := uc.DescribeInstances(ctx, &ec2.DescribeInstancesInput{DryRun: awssdk.Bool(true)})
			return err
		}, "DryRunOperation"},
		{"unknown key", func() error {
			_, err := s.EC2("us-east-1").DescribeInstances(ctx, &ec2.DescribeInstancesInput{})
			return err
		}, "AuthFailure"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if got := apiCode(err); got != tc.want {
				t.Errorf("code %q (%v), want %q", got, err, tc.want)
			}
		})
	}
	if err := s.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.EC2("us-east-1").DescribeInstances(ctx, &ec2.DescribeInstancesInput{}); err != nil {
		t.Errorf("after Reset the static key is refused: %v", err)
	}
}
