package aws_test

import (
	"testing"

	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/aws"
)

// TestOfferingsArch: offerings carry the CPU architecture EC2 reports in
// DescribeInstanceTypes (processorInfo.supportedArchitectures) under Go's
// name, so each node is handed the agent built for it.
func TestOfferingsArch(t *testing.T) {
	_, url := newFake(t)
	p := aws.New(testOptions())
	block := with(baseBlock(url), "instance_types", []string{"g5g.xlarge", "g4dn.xlarge"})
	offs, err := p.Offerings(ctxT(t), config(t, "f", block))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"g5g.xlarge": "arm64", "g4dn.xlarge": "amd64"}
	seen := map[string]bool{}
	for _, o := range offs {
		seen[o.InstanceType] = true
		if o.Arch != want[o.InstanceType] {
			t.Errorf("%s %s in %s: arch %q, want %q", o.InstanceType, o.CapacityType, o.Zone, o.Arch, want[o.InstanceType])
		}
	}
	if !seen["g5g.xlarge"] || !seen["g4dn.xlarge"] {
		t.Fatalf("offerings %v lack a type", seen)
	}
	g5g := find(t, offs, "us-east-1a", "g5g.xlarge", providers.Spot)
	if g5g.GPUs != 1 || g5g.GPUType != "T4g" || g5g.VCPUs != 4 {
		t.Errorf("g5g.xlarge shape %+v", g5g)
	}
}
