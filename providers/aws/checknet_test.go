package aws_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/aws"
)

// TestCheckNetwork: `fleetd check` rows of a fleet on the fast network
// (golden), and the self-referencing security-group rule EFA needs
// failing until the group has it.
func TestCheckNetwork(t *testing.T) {
	fake, url := newFake(t)
	p := aws.New(testOptions())
	cfg := config(t, "bert", with(baseBlock(url), "instance_types", []string{"p5.48xlarge", "g5.xlarge"}, "regions", []string{"us-east-1"}))
	netRows := func(opts providers.CheckOptions) []providers.CheckResult {
		rs, err := p.Check(ctxT(t), cfg, opts)
		if err != nil {
			t.Fatal(err)
		}
		var out []providers.CheckResult
		for _, r := range rs {
			if strings.Contains(r.Check, "EFA") || strings.Contains(r.Check, "PlacementGroup") || strings.Contains(r.Check, "fast network") || strings.Contains(r.Check, "IPv4") {
				out = append(out, r)
			}
		}
		return out
	}
	if rs := netRows(providers.CheckOptions{}); len(rs) != 0 {
		t.Errorf("network rows without CheckOptions.Network: %+v", rs)
	}
	rs := netRows(providers.CheckOptions{Network: true})
	if got := failedRows(rs); len(got) != 1 || got[0] != "EFA security group rule@us-east-1" {
		t.Errorf("failed rows %v, want only the security group rule", got)
	}
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&b, "%-8s %-32s %-10s %s\n", r.Status, r.Check, r.Scope, r.Detail)
		if r.Fix != "" {
			fmt.Fprintf(&b, "         fix: %s\n", r.Fix)
		}
	}
	golden(t, "check_network.golden", b.String())

	fake.AllowSelf("us-east-1", "sg-0123456789abcdef0")
	if got := failedRows(netRows(providers.CheckOptions{Network: true})); len(got) != 0 {
		t.Errorf("failed rows with the self rule: %v", got)
	}
	fake.Deny("CreatePlacementGroup")
	if got := failedRows(netRows(providers.CheckOptions{Network: true})); len(got) != 1 || got[0] != "permission ec2:CreatePlacementGroup@us-east-1" {
		t.Errorf("failed rows with CreatePlacementGroup denied: %v", got)
	}
}
