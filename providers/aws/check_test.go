package aws_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/aws"
	"github.com/fleetd/fleetd/providers/aws/fakeec2"
	"github.com/fleetd/fleetd/providers/aws/fakesqs"
)

// rowKey names a check row for comparisons.
func rowKey(r providers.CheckResult) string { return r.Check + "@" + r.Scope }

func failedRows(rs []providers.CheckResult) []string {
	var out []string
	for _, r := range rs {
		if r.Status == providers.CheckFailed {
			out = append(out, rowKey(r))
		}
	}
	return out
}

func TestCheck(t *testing.T) {
	cases := []struct {
		name   string
		quick  bool
		setup  func(f *fakeec2.Server, q *fakesqs.Server)
		block  func(b map[string]any) map[string]any
		failed []string // rows that must fail, exactly
		fixes  []string // substrings of their fixes, in order
	}{
		{name: "all good"},
		{name: "wrong AMI", setup: func(f *fakeec2.Server, _ *fakesqs.Server) { f.RemoveImage("us-west-2", "ami-0fedcba9876543210") },
			failed: []string{"image@us-west-2"}, fixes: []string{`image_per_region["us-west-2"]`}},
		{name: "missing subnet", block: func(b map[string]any) map[string]any {
			return with(b, "subnets", map[string]string{"us-east-1a": "subnet-0aaa1111", "us-east-1b": "subnet-0dead000", "us-west-2a": "subnet-0ccc3333"})
		}, failed: []string{"subnet@us-east-1b"}, fixes: []string{`subnets["us-east-1b"]`}},
		{name: "subnet in another zone", block: func(b map[string]any) map[string]any {
			return with(b, "subnets", map[string]string{"us-east-1a": "subnet-0bbb2222", "us-west-2a": "subnet-0ccc3333"})
		}, failed: []string{"subnet@us-east-1a"}, fixes: []string{`subnets["us-east-1b"]`}},
		{name: "denied RunInstances", setup: func(f *fakeec2.Server, _ *fakesqs.Server) { f.Deny("RunInstances") },
			failed: []string{"permission ec2:RunInstances@us-east-1", "permission ec2:RunInstances@us-west-2"},
			fixes:  []string{"allow ec2:RunInstances", "iam:PassRole"}},
		{name: "missing security group", setup: func(f *fakeec2.Server, _ *fakesqs.Server) {
			f.RemoveSecurityGroup("us-east-1", "sg-0123456789abcdef0")
		}, failed: []string{"security group@us-east-1"}, fixes: []string{"security_groups_per_region[\"us-east-1\"]"}},
		{name: "spot quota too low", setup: func(f *fakeec2.Server, _ *fakesqs.Server) { f.SetVCPUQuota("us-west-2", fakeec2.MarketSpot, 96) },
			failed: []string{"vCPU quota spot P@us-west-2"}, fixes: []string{"--quota-code L-7212CCBC --desired-value 384"}},
		{name: "type offered nowhere usable", setup: func(f *fakeec2.Server, _ *fakesqs.Server) {
			for _, z := range []string{"us-east-1a", "us-east-1b", "us-west-2a"} {
				f.RemoveOffering(z, "g5.xlarge")
			}
		}, failed: []string{"instance type@g5.xlarge"}, fixes: []string{"describe-instance-type-offerings"}},
		{name: "queue missing", block: func(b map[string]any) map[string]any { return with(b, "interruption_queue", "nope") },
			failed: []string{"interruption queue@us-east-1", "interruption queue@us-west-2"}, fixes: []string{"EventBridge", "EventBridge"}},
		{name: "quick skips the sweeps", quick: true, setup: func(f *fakeec2.Server, _ *fakesqs.Server) {
			f.SetVCPUQuota("us-west-2", fakeec2.MarketSpot, 0)
			f.Deny("CreateTags")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fake, url := newFake(t)
			q, qsURL := fakesqs.StartT(t, "fleetd-interruptions")
			if tc.setup != nil {
				tc.setup(fake, q)
			}
			b := with(baseBlock(url), "service_quotas_endpoint", url, "sqs_endpoint", qsURL, "interruption_queue", "fleetd-interruptions")
			if tc.block != nil {
				b = tc.block(b)
			}
			rs, err := aws.New(testOptions()).Check(ctxT(t), config(t, "f", b), providers.CheckOptions{Quick: tc.quick, TargetNodes: 4})
			if err != nil {
				t.Fatal(err)
			}
			got := failedRows(rs)
			if fmt.Sprint(got) != fmt.Sprint(tc.failed) {
				t.Errorf("failed rows %v, want %v\n%s", got, tc.failed, dumpRows(rs))
			}
			i := 0
			for _, r := range rs {
				if r.Status != providers.CheckFailed {
					continue
				}
				if r.Fix == "" {
					t.Errorf("row %s failed without a fix", rowKey(r))
				}
				if i < len(tc.fixes) && !strings.Contains(r.Fix, tc.fixes[i]) {
					t.Errorf("row %s fix %q, want it to mention %q", rowKey(r), r.Fix, tc.fixes[i])
				}
				i++
			}
			if fake.Calls("RunInstances") != 2 || len(fake.Live()) != 0 {
				t.Errorf("RunInstances calls %d (want one dry run per region), live instances %d (want 0)", fake.Calls("RunInstances"), len(fake.Live()))
			}
			for _, r := range rs {
				if tc.quick && (strings.HasPrefix(r.Check, "vCPU quota") || r.Check == "interruption queue" || r.Check == "permission ec2:CreateTags") {
					t.Errorf("quick check ran %s", rowKey(r))
				}
			}
			if tc.name == "all good" {
				for _, want := range []string{"credentials@", "image@us-east-1", "subnet@us-east-1a", "security group@us-west-2",
					"permission ec2:TerminateInstances@us-west-2", "vCPU quota spot G and VT@us-east-1", "instance type@p4d.24xlarge",
					"interruption queue@us-west-2", "spot placement scores@us-east-1"} {
					if !strings.Contains(dumpRows(rs), want) {
						t.Errorf("no row %s in\n%s", want, dumpRows(rs))
					}
				}
				if !strings.Contains(rs[0].Detail, "EnvConfigCredentials") {
					t.Errorf("credentials row %+v does not name the source", rs[0])
				}
			}
		})
	}
}

func dumpRows(rs []providers.CheckResult) string {
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&b, "%-8s %s: %s | %s\n", r.Status, rowKey(r), r.Detail, r.Fix)
	}
	return b.String()
}
