package agent

import (
	"path/filepath"
	"testing"

	"github.com/fleetd/fleetd/agent/ckpt"
	"github.com/fleetd/fleetd/rendezvous"
)

func TestCheckpointDirEnv(t *testing.T) {
	a := rendezvous.Assignment{Round: 3, LocalWorldSize: 1, WorldSize: 1, GroupWorldSize: 1, MasterAddr: "127.0.0.1", MasterPort: 29500}
	p := workerEnvParams{Assignment: a, CheckpointDir: "/root/ckpt", Base: []string{"FLEETD_CHECKPOINT_DIR=/stale"}}
	env := envMap(workerEnv(p, 0))
	if env[EnvCheckpointDir] != "/root/ckpt" || env[EnvCheckpointURI] != "/root/ckpt" {
		t.Fatalf("without checkpoint_uri: %s=%q %s=%q", EnvCheckpointDir, env[EnvCheckpointDir], EnvCheckpointURI, env[EnvCheckpointURI])
	}
	p.Training.CheckpointURI = "s3://b/legacy"
	env = envMap(workerEnv(p, 0))
	if env[EnvCheckpointDir] != "/root/ckpt" || env[EnvCheckpointURI] != "s3://b/legacy" {
		t.Fatalf("with checkpoint_uri: %v", env)
	}
}

func TestCheckpointDirFor(t *testing.T) {
	abs, _ := filepath.Abs("ckpt")
	for _, c := range []struct {
		tc   TrainingConfig
		want string
	}{
		{TrainingConfig{Checkpoint: &CheckpointConfig{Dir: "/mnt/ckpt"}, Workdir: "/w"}, "/mnt/ckpt"},
		{TrainingConfig{Checkpoint: &CheckpointConfig{Dir: "ckpt"}, Workdir: "/w"}, "/w/ckpt"},
		{TrainingConfig{Checkpoint: &CheckpointConfig{Dir: "ckpt"}}, abs},
	} {
		if got, err := checkpointDirFor(c.tc); err != nil || got != c.want {
			t.Errorf("%+v: %q %v, want %q", c.tc.Checkpoint, got, err, c.want)
		}
	}
}

// The report queue keeps what the daemon has not taken, in order, and
// drops the oldest beyond its bound.
func TestCheckpointEventQueue(t *testing.T) {
	c := &checkpoints{}
	for i := range 3 {
		c.queue(ckpt.Event{Kind: ckpt.EventUploaded, Step: int64(i)})
	}
	evs, last := c.pending()
	c.queue(ckpt.Event{Kind: ckpt.EventUploaded, Step: 3}) // arrives while the report is on its way
	c.delivered(last)
	if evs2, _ := c.pending(); len(evs) != 3 || len(evs2) != 1 || evs2[0].Step != 3 {
		t.Fatalf("sent %v, left %v", evs, evs2)
	}
	for i := range maxQueuedEvents + 10 {
		c.queue(ckpt.Event{Step: int64(100 + i)})
	}
	evs, _ = c.pending()
	if len(evs) != maxQueuedEvents || evs[len(evs)-1].Step != 100+maxQueuedEvents+9 {
		t.Fatalf("queue of %d, last %d", len(evs), evs[len(evs)-1].Step)
	}
}
