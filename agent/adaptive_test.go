package agent

import (
	"bufio"
	"encoding/json"
	"math"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestAdaptiveBatch runs agent/testdata/adaptive_batch.py with real
// PyTorch: a linear regression trained through world sizes 1, 4 and 2 in
// real gloo groups by fleetd_elastic.AdaptiveBatch (64 samples per GPU,
// at most 16 per micro-batch, global batch within [32, 192], square-root
// LR scaling from 0.02 at 32). The script asserts the rule on every rank;
// this test checks what rank 0 reports per phase and that the model
// still converges.
func TestAdaptiveBatch(t *testing.T) {
	py := torchPython(t)
	out, err := exec.Command(py, filepath.Join("testdata", "adaptive_batch.py"), ".", t.TempDir()).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	type phase struct {
		World    int      `json:"world_size"`
		Batch    int      `json:"batch"`
		Local    int      `json:"local"`
		Accum    int      `json:"accum"`
		LR       float64  `json:"lr"`
		Noise    *float64 `json:"noise_scale"`
		Dominant bool     `json:"noise_dominated"`
		Loss     float64  `json:"loss"`
		Initial  float64  `json:"initial_loss"`
		What     string   `json:"what"`
	}
	var phases []phase
	var initial float64
	events := 0
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		var p phase
		if json.Unmarshal(sc.Bytes(), &p) != nil {
			continue
		}
		switch {
		case p.Initial > 0:
			initial = p.Initial
		case p.What == "adaptive_batch":
			events++
		case p.World > 0:
			phases = append(phases, p)
		}
	}
	want := []struct{ world, batch, local, accum int }{{1, 64, 64, 4}, {4, 192, 48, 3}, {2, 128, 64, 4}}
	if len(phases) != len(want) || events < len(want) {
		t.Fatalf("%d phases, %d adaptive_batch events, want %d:\n%s", len(phases), events, len(want), out)
	}
	for i, w := range want {
		p := phases[i]
		lr := 0.02 * math.Sqrt(float64(w.batch)/32)
		if p.World != w.world || p.Batch != w.batch || p.Local != w.local || p.Accum != w.accum || math.Abs(p.LR-lr) > 1e-9 {
			t.Errorf("phase %d: %+v, want world %d, batch %d (%d per rank in %d micro-batches), lr %.4f", i, p, w.world, w.batch, w.local, w.accum, lr)
		}
	}
	if p := phases[0]; p.Noise == nil || !(*p.Noise > 0) || p.Dominant {
		t.Errorf("after the first phase: no finite noise scale measured: %+v", p)
	}
	if last := phases[len(phases)-1].Loss; !(initial > 0) || !(last < 0.05*initial) || last > 0.5 {
		t.Errorf("loss %.3f from %.3f: the model did not converge through the world size changes (noise floor 0.25)", last, initial)
	}
}
