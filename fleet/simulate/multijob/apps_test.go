package multijob

import (
	"math"
	"os"
	"path/filepath"
	"testing"
)

// bundled is the copy of Pollux's measurements in the repository.
var bundled = filepath.Join("..", "..", "..", "configs", "pollux")

func loadBundled(t *testing.T) map[string]*App {
	t.Helper()
	apps, err := LoadApps(filepath.Join(bundled, "traces"))
	if err != nil {
		t.Fatal(err)
	}
	return apps
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

func TestAppModelsMatchTheMeasurements(t *testing.T) {
	apps := loadBundled(t)
	if len(apps) != 6 {
		t.Fatalf("loaded %d applications, want the 6 of the reference", len(apps))
	}
	cifar := apps["cifar10"]
	phi1 := 128 * 5.066593295150894 / 8.947307535897329
	phiLast := 128 * 0.2656905672841092 / 0.0008797251757316566
	phi1024 := 128 * 6.740279795719679 / 8.978532644212862
	phi2048 := 128 * 5.4859538034431825 / 10.73321269096998
	for _, tc := range []struct {
		name      string
		got, want float64
	}{
		// placements.csv, placement 1 (one GPU), local batch 32 and 45.
		{"measured single GPU", cifar.StepTime(1, 1, 32), 0.0427886962890625},
		{"between two batches: linear", cifar.StepTime(1, 1, 38.5), (0.0427886962890625 + 0.05048525333404541) / 2},
		// placements.csv, placement 44 (2 nodes, 8 GPUs), batch 91.
		{"measured placement", cifar.StepTime(2, 8, 91), 0.21253495216369628},
		// 14 and 23 are both 2 nodes with 5 GPUs: their mean.
		{"placements of one shape averaged", cifar.StepTime(2, 5, 91), (0.1735734224319458 + 0.1652078151702881) / 2},
		// scalability.csv: 6 nodes, 6 replicas, batch 32.
		{"scalability row", cifar.StepTime(6, 6, 32), 0.14090566635131835},
		{"below the smallest batch: as the smallest", cifar.StepTime(1, 1, 8), 0.0427886962890625},
		// above the largest (1024) two micro-batches of 1024 and one sync.
		{"accumulation", cifar.StepTime(1, 1, 2048), 2*(cifar.StepTime(1, 1, 1024)-cifar.sync(1, 1)) + cifar.sync(1, 1)},
		// validation-128.csv: the smallest batch is the reference.
		{"reference batch", cifar.M0, 128},
		{"target epochs: the reference file's rows", float64(cifar.Epochs), 100},
		{"epoch size", cifar.EpochSize, 39063.0 / 100},
		{"noise scale, first epoch", cifar.Phi(0, 128), phi1},
		{"noise scale, past the end", cifar.Phi(1e9, 128), phiLast},
		{"below the smallest batch: its file", cifar.Phi(0, 64), phi1},
		// validation-1024.csv, first row.
		{"noise scale at a measured batch", cifar.Phi(0, 1024), phi1024},
		// halfway (in log) between 1024 and 2048.
		{"noise scale between batches: linear in log", cifar.Phi(0, 1024*math.Sqrt2), (phi1024 + phi2048) / 2},
		{"efficiency at M0", cifar.Efficiency(128, 0), 1},
		{"efficiency at 1024, first epoch", cifar.Efficiency(1024, 0), (phi1024 + 128) / (phi1024 + 1024)},
		{"throughput: samples per step time", cifar.Throughput(1, 4, 64), 64 / 0.05983335971832275},
		{"goodput at M0 in steps of M0 per second", cifar.Goodput(1, 4, 128, 0), 128 / cifar.StepTime(1, 1, 128) / 128},
		{"bert target", float64(apps["bert"].Epochs), 2},
		{"ncf target", float64(apps["ncf"].Epochs), 10},
		{"yolov3 reference batch", apps["yolov3"].M0, 8},
	} {
		if !near(tc.got, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}

func TestUnmeasuredPlacementsAreComputePlusSync(t *testing.T) {
	cifar := loadBundled(t)["cifar10"]
	// 5 nodes are measured nowhere: single-GPU compute at the batch plus
	// the multi-node sync interpolated between the replica counts
	// measured around 18.
	got := cifar.StepTime(5, 18, 64)
	want := cifar.StepTime(1, 1, 64) + interp(cifar.syncMulti, 18)
	if !near(got, want) || got <= cifar.StepTime(1, 1, 64) {
		t.Fatalf("5 nodes, 18 GPUs: %v, want %v (compute plus a positive sync)", got, want)
	}
	// More GPUs at a fixed global batch are faster until sync dominates.
	if a, b := cifar.Throughput(1, 4, 2048), cifar.Throughput(8, 4, 2048); b <= a {
		t.Fatalf("2048 on 8 GPUs %v samples/s, on 1 %v: want faster", b, a)
	}
}

func TestLoadAppErrors(t *testing.T) {
	for _, tc := range []struct{ name, dir string }{
		{"missing", filepath.Join(bundled, "nope")},
		{"not an app", filepath.Join(bundled, "workloads")},
	} {
		if _, err := LoadApp(tc.dir); err == nil {
			t.Errorf("%s: loaded", tc.name)
		}
	}
}

// TestYoloLimit: yolov3's limits.csv (8 samples per GPU, measured to 16)
// leaves a requested batch at its measured step time and makes a batch
// an adapting policy chose accumulate above 8 per GPU.
func TestYoloLimit(t *testing.T) {
	y := loadBundled(t)["yolov3"]
	if y.MaxLocal != 16 || y.AdaptLocal != 8 {
		t.Fatalf("yolov3 per-GPU batches: measured to %g, adapting micro-batch %g; want 16, 8", y.MaxLocal, y.AdaptLocal)
	}
	ad := y.Adapting()
	if got, want := ad.StepTime(1, 1, 16), 2*y.StepTime(1, 1, 8); !near(got, want) {
		t.Errorf("adapting step at 16 per GPU %g, want two micro-batches of 8 (%g)", got, want)
	}
	if y.StepTime(1, 1, 16) >= ad.StepTime(1, 1, 16) {
		t.Errorf("a requested 16 per GPU (%g s) should run at its measured step time, below two of 8 (%g s)", y.StepTime(1, 1, 16), ad.StepTime(1, 1, 16))
	}
	if c := loadBundled(t)["cifar10"]; c.Adapting() != c {
		t.Error("an application without limits.csv changed when adapting")
	}
	// A limit below every measured batch, or two rows, is refused.
	for _, body := range []string{"max_local_bsz\n1\n", "max_local_bsz\n8\n8\n"} {
		dir := t.TempDir()
		for _, f := range []string{"placements.csv", "scalability.csv", "validation-8.csv"} {
			b, err := os.ReadFile(filepath.Join(bundled, "traces", "yolov3", f))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "limits.csv"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadApp(dir); err == nil {
			t.Errorf("limits.csv %q: loaded", body)
		}
	}
}
