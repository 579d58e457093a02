package placement

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

// withData is fleet(minN, maxN) reading ds.
func withData(minN, maxN int, ds ...spec.Data) *spec.Fleet {
	f := fleet(minN, maxN)
	f.Training.Data = ds
	return f
}

// s3Corpus is 2 TB in S3 us-east-1, streamed, one epoch a day.
var s3Corpus = spec.Data{Source: "s3://corpus/tokens", MountPath: "/data", Mode: spec.DataStream, SizeGB: 2000, EpochTime: 24 * time.Hour, Region: "us-east-1"}

// TestDataEgressDecidesMove: a job next to its 2 TB S3 dataset moves to a
// cheaper GCP zone only when the spot saving beats reading the data
// across clouds ($180 per epoch at $0.09/GB, $7.50/h at one epoch a day,
// $0.469 per GPU-hour over 2 × 8 GPUs).
func TestDataEgressDecidesMove(t *testing.T) {
	aws := off("aws", "us-east-1a", "p4d", providers.Spot, 16.00, 4) // $2.00/GPU-h
	cases := []struct {
		name     string
		gcpPrice float64 // per node-hour, 8 GPUs
		data     bool
		migrate  bool
	}{
		{"without data the discount wins", 12.00, false, true},       // $1.50 ≤ 0.85 × $2.00
		{"egress per hour exceeds the saving", 12.00, true, false},   // $1.50 + $0.469 > $1.70
		{"a larger saving beats the egress", 8.00, true, true},       // $1.00 + $0.469 ≤ $1.70
		{"same price, data decides: stay", 16.00 * 0.8, true, false}, // $1.60 + $0.469
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			gcp := off("gcp", "us-central1-a", "a2", providers.Spot, c.gcpPrice, 4)
			f := fleet(1, 2)
			if c.data {
				f = withData(1, 2, s3Corpus)
			}
			ch := Choose(ChooseInput{Fleet: f, Offerings: []providers.Offering{aws, gcp}, Now: t0, Nodes: []providers.Offering{aws},
				Need: 1, Target: 2, Capacity: SpotOnly("test"), AtBoundary: true})
			if ch.Migrate != c.migrate {
				t.Fatalf("migrate %v (%s), want %v", ch.Migrate, ch.Reason, c.migrate)
			}
		})
	}

	d := DataCostFor(withData(1, 2, s3Corpus))
	gcp := off("gcp", "us-central1-a", "a2", providers.Spot, 12.00, 4)
	es := d.Estimate(gcp)
	if len(es) != 1 || es[0].PerGB != 0.09 || es[0].EpochUSD != 180 || math.Abs(es[0].HourUSD-7.5) > 1e-9 || math.Abs(es[0].PerGPUHour-7.5/16) > 1e-12 {
		t.Fatalf("estimate from GCP %+v", es)
	}
	if got := d.PerGPUHour(aws); got != 0 {
		t.Fatalf("reading S3 us-east-1 from us-east-1a costs %g, want 0", got)
	}
	if west := off("aws", "us-west-2a", "p4d", providers.Spot, 16, 4); math.Abs(d.PerGPUHour(west)-2000*0.02/24/16) > 1e-12 {
		t.Fatalf("inter-region read %g", d.PerGPUHour(west))
	}
}

func TestDataStageCost(t *testing.T) {
	staged := s3Corpus
	staged.Mode = spec.DataStage
	f := withData(1, 2, staged)
	f.Work = 10 * time.Hour
	gcp := off("gcp", "us-central1-a", "a2", providers.Spot, 12.00, 4)
	es := DataCostFor(f).Estimate(gcp)
	// Each node copies 2 TB once: $180, over 10 h and 8 GPUs.
	if len(es) != 1 || es[0].StageUSD != 180 || es[0].EpochUSD != 0 || math.Abs(es[0].PerGPUHour-180.0/80) > 1e-12 {
		t.Fatalf("stage estimate %+v", es)
	}
	// Two nodes: a replacement copies from its zone's survivor, 2000 GB
	// at 2.5 GB/s, paid at $12/h over 8 GPUs, no transfer charge.
	if !es[0].StagePeer || es[0].StageSeconds != 800 {
		t.Fatalf("stage time %+v", es[0])
	}
	if got, want := DataCostFor(f).ChangeoverUSD(gcp), 12.0*800/3600/8; math.Abs(got-want) > 1e-12 {
		t.Fatalf("changeover with a peer %g, want %g", got, want)
	}
	// One node: no survivor, the bucket again at 1 GB/s and its egress.
	single := withData(1, 1, staged)
	single.Work = 10 * time.Hour
	if got, want := DataCostFor(single).ChangeoverUSD(gcp), 12.0*2000/3600/8+180.0/8; math.Abs(got-want) > 1e-12 {
		t.Fatalf("changeover without a peer %g, want %g", got, want)
	}
	// It enters the score through the interruption rate.
	m := DefaultModel()
	c0 := m.EvaluateIn(gcp, state.OfferingRecord{}, spec.StrategyLowestPrice, Outlook{})
	if c0.Rate <= 0 {
		t.Fatalf("spot offering without an interruption rate: %+v", c0)
	}
	d := DataCostFor(f)
	c := d.apply(c0)
	if want := c0.Score + d.PerGPUHour(gcp) + c0.Rate*d.ChangeoverUSD(gcp); math.Abs(c.Score-want) > 1e-12 || c.DataCost <= d.PerGPUHour(gcp) {
		t.Fatalf("score %g (data %g), want %g", c.Score, c.DataCost, want)
	}
}

// TestFileSystemPinsPlacement: an FSx file system excludes other clouds
// and regions with a reason, prices other zones of its region by
// cross-zone transfer, and excludes them with zone_policy = "required".
func TestFileSystemPinsPlacement(t *testing.T) {
	fsx := spec.Data{Source: "fsx://fs-0123456789abcdef0", MountPath: "/fsx", Mode: spec.DataMount, SizeGB: 1200,
		Region: "us-east-1", Zone: "us-east-1a", ZonePolicy: spec.ZonePrefer}
	a := off("aws", "us-east-1a", "p4d", providers.Spot, 16.00, 4)
	b := off("aws", "us-east-1b", "p4d", providers.Spot, 14.00, 4) // $0.25/GPU-h cheaper
	west := off("aws", "us-west-2a", "p4d", providers.Spot, 8.00, 4)
	gcp := off("gcp", "us-central1-a", "a2", providers.Spot, 6.00, 4)
	offs := []providers.Offering{a, b, west, gcp}

	f := withData(2, 2, fsx)
	for _, tc := range []struct {
		o    providers.Offering
		want string
	}{
		{a, ""}, {b, ""},
		{west, "data fsx://fs-0123456789abcdef0 is a file system in region us-east-1; nodes in us-west-2 cannot mount it"},
		{gcp, "is a file system in aws us-east-1; gcp nodes cannot mount it"},
	} {
		if got := Exclusion(f, tc.o); (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: exclusion %q, want %q", tc.o.Key(), got, tc.want)
		}
	}
	ranked := RankIn(f, offs, nil, Outlook{Now: t0}, Model{})
	if ranked[0].Offering != a || ranked[1].Offering != b || ranked[2].Excluded == "" || ranked[3].Excluded == "" {
		t.Fatalf("ranking %+v", ranked)
	}
	// 1200 GB per hour-long epoch across zones: $24/h over 16 GPUs.
	if want := 1200 * 0.02 / 16; math.Abs(ranked[1].DataCost-want) > 1e-12 || ranked[0].DataCost != 0 {
		t.Fatalf("data cost %g and %g, want 0 and %g", ranked[0].DataCost, ranked[1].DataCost, want)
	}
	if !strings.Contains(Explain(ranked[1].Candidate), "data =") {
		t.Errorf("explanation lacks the data cost: %s", Explain(ranked[1].Candidate))
	}

	ch := Choose(ChooseInput{Fleet: f, Offerings: offs, Now: t0, Need: 2, Target: 2, Capacity: SpotOnly("test"), AtBoundary: true})
	if len(ch.Launch) != 2 || ch.Launch[0].Zone != "us-east-1a" {
		t.Fatalf("prefer: launch %v (%s), want the file system's zone", keys(ch.Launch), ch.Reason)
	}

	fsx.ZonePolicy = spec.ZoneRequired
	f = withData(2, 2, fsx)
	if got := Exclusion(f, b); !strings.Contains(got, `is in zone us-east-1a, zone_policy = "required"`) {
		t.Fatalf("required zone: exclusion of %s %q", b.Key(), got)
	}
	ch = Choose(ChooseInput{Fleet: f, Offerings: []providers.Offering{b, west, gcp}, Now: t0, Need: 2, Target: 2, Capacity: SpotOnly("test"), AtBoundary: true})
	if ch.Group != "" || !strings.Contains(ch.Reason, "no offering fits the fleet") || !strings.Contains(ch.Reason, "cannot mount it") {
		t.Fatalf("only unreachable offerings: %+v", ch)
	}
}

func TestDataNotes(t *testing.T) {
	gcp := off("gcp", "us-central1-a", "a2", providers.Spot, 12.00, 4)
	gcp.Region = "us-central1"
	aws := off("aws", "us-east-1a", "p4d", providers.Spot, 16.00, 4)
	nfs := spec.Data{Source: "file:///scratch", MountPath: "/scratch", Mode: spec.DataMount, SizeGB: 5}
	f := withData(1, 2, s3Corpus, nfs)
	notes := DataNotes(f, []providers.Offering{gcp, gcp})
	if len(notes) != 2 {
		t.Fatalf("notes %q", notes)
	}
	for _, w := range []string{"data s3://corpus/tokens (stream, 2000 GB) is in aws:us-east-1", "from gcp:us-central1-a costs $180.00 per epoch ($0.090/GB, aws->*)", "$7.50 per hour at one epoch per 24h0m0s", "$0.469 per GPU-hour"} {
		if !strings.Contains(notes[0], w) {
			t.Errorf("note lacks %q: %s", w, notes[0])
		}
	}
	if !strings.Contains(notes[1], "data file:///scratch (mount, 5 GB); reading it from") || !strings.Contains(notes[1], "is free") {
		t.Errorf("local note: %s", notes[1])
	}
	if n := DataNotes(f, []providers.Offering{aws}); !strings.Contains(n[0], "is free") {
		t.Errorf("same-region note: %s", n[0])
	}
	// The GCP zone is $0.50/GPU-h cheaper; reading the data from there
	// adds $180 a day over 2 × 8 GPUs.
	tr := DataTradeoff(f, []providers.Offering{aws, gcp}, []providers.Offering{aws, aws})
	if want := "data: gcp/us-central1/us-central1-a/a2/spot is $0.500/GPU-h cheaper than aws/us-east-1/us-east-1a/p4d/spot, but reading the data from there adds $0.469 per GPU-hour"; tr != want {
		t.Errorf("tradeoff %q, want %q", tr, want)
	}
	if tr := DataTradeoff(f, []providers.Offering{aws, gcp}, []providers.Offering{gcp, gcp}); tr != "" {
		t.Errorf("the cheapest offering launched, tradeoff %q", tr)
	}
	if DataNotes(fleet(1, 2), []providers.Offering{aws}) != nil {
		t.Error("notes without data")
	}
}

// TestFileSystemPinsNetwork: a file system with a network excludes
// offerings whose nodes land in another VPC, keeps those of its VPC and
// those whose VPC the provider does not report (noted in the plan).
func TestFileSystemPinsNetwork(t *testing.T) {
	fsx := spec.Data{Source: "fsx://fs-1", MountPath: "/fsx", Mode: spec.DataMount, SizeGB: 100,
		Region: "us-east-1", ZonePolicy: spec.ZonePrefer, Network: "vpc-a"}
	filestore := spec.Data{Source: "filestore://10.0.0.2/share", MountPath: "/fs", Mode: spec.DataMount, SizeGB: 100,
		Region: "us-central1", ZonePolicy: spec.ZonePrefer, Network: "training"}
	inVPC := func(o providers.Offering, vpc string) providers.Offering { o.VPC = vpc; return o }
	awsA := off("aws", "us-east-1a", "p4d", providers.Spot, 16, 4)
	gcpA := off("gcp", "us-central1-a", "a2", providers.Spot, 12, 4)
	gcpA.Region = "us-central1"
	cases := []struct {
		name string
		data spec.Data
		o    providers.Offering
		want string // "" when not excluded
		note string // in DataNotes when the offering launches; "" for none about the network
	}{
		{"same vpc", fsx, inVPC(awsA, "vpc-a"), "", ""},
		{"other vpc", fsx, inVPC(awsA, "vpc-b"), "data fsx://fs-1 is in network vpc-a; nodes in us-east-1a land in vpc-b", ""},
		{"unknown vpc", fsx, awsA, "", "data fsx://fs-1 is in network vpc-a; aws does not say which network its nodes in us-east-1a land in"},
		{"no network in the spec", spec.Data{Source: fsx.Source, MountPath: "/fsx", Mode: spec.DataMount, SizeGB: 1, Region: "us-east-1"}, inVPC(awsA, "vpc-b"), "", ""},
		{"gcp network", filestore, inVPC(gcpA, "training"), "", ""},
		{"gcp default network", filestore, inVPC(gcpA, "default"), "data filestore://10.0.0.2/share is in network training; nodes in us-central1-a land in default", ""},
		{"region before network", fsx, inVPC(off("aws", "us-west-2a", "p4d", providers.Spot, 16, 4), "vpc-b"), "is a file system in region us-east-1; nodes in us-west-2 cannot mount it", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := withData(1, 1, tc.data)
			got := Exclusion(f, tc.o)
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("exclusion %q, want %q", got, tc.want)
			}
			if got != "" {
				return
			}
			notes := DataNotes(f, []providers.Offering{tc.o})
			found := ""
			for _, n := range notes {
				if strings.Contains(n, "which network") {
					found = n
				}
			}
			if (tc.note == "") != (found == "") || !strings.Contains(found, tc.note) {
				t.Errorf("network note %q, want %q (notes %q)", found, tc.note, notes)
			}
		})
	}
}
