package examples

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestTrainerStepDirs: with FLEETD_CHECKPOINT_DIR as its checkpoint dir,
// train.py writes the layout the agent uploads (docs/checkpoints.md):
// complete step-N/ directories, COMPLETE inside, no temporary directory
// left; a later round of two ranks resumes from the newest complete one
// and ignores one without COMPLETE (still being written, or a restore
// cut short).
func TestTrainerStepDirs(t *testing.T) {
	py, train := stdPython(t), script(t, "trainer/train.py")
	dir := t.TempDir()
	r := round{world: 1, port: freePort(t), ckpt: dir, runID: "steps-1", extraEnv: []string{"FLEETD_CHECKPOINT_DIR=" + dir},
		extraArgs: []string{"--steps", "60", "--step-time", "0", "--ckpt-every", "20"}}
	p := r.start(t, py, train)[0]
	if code := p.wait(t, 60*time.Second); code != 0 {
		p.dump(t)
		t.Fatalf("exit %d", code)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := []string{"DONE", "step-20", "step-40", "step-60"}; !slices.Equal(names, want) {
		t.Fatalf("checkpoint dir holds %v, want %v", names, want)
	}
	for _, s := range names[1:] {
		for _, f := range []string{"checkpoint.json", "COMPLETE"} {
			if _, err := os.Stat(filepath.Join(dir, s, f)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A new round (the job goes on to 100 steps): a step-80 without
	// COMPLETE is not a checkpoint.
	if err := os.Remove(filepath.Join(dir, "DONE")); err != nil {
		t.Fatal(err)
	}
	half := filepath.Join(dir, "step-80")
	if err := os.MkdirAll(half, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(half, "checkpoint.json"), []byte("{trunc"), 0o644); err != nil {
		t.Fatal(err)
	}
	r2 := r
	r2.world, r2.port, r2.runID = 2, freePort(t), "steps-2"
	r2.extraArgs = []string{"--steps", "100", "--step-time", "0", "--ckpt-every", "20"}
	ps := r2.start(t, py, train)
	for _, p := range ps {
		if code := p.wait(t, 60*time.Second); code != 0 {
			p.dump(t)
			t.Fatalf("%s: exit %d", p.name, code)
		}
	}
	if ev := ps[0].last(t, "resume"); ev.Step != 60 {
		t.Fatalf("resumed at step %d, want 60 (the newest complete step dir)", ev.Step)
	}
	if ev := ps[0].last(t, "checkpoint"); ev.Step != 100 {
		t.Fatalf("last checkpoint at step %d", ev.Step)
	}
	for _, s := range []string{"step-80", "step-100"} {
		if _, err := os.Stat(filepath.Join(dir, s, "COMPLETE")); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}
