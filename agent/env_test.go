package agent

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/rendezvous"
)

func envMap(env []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

// checkEnv checks that env has want's variables and none of absent.
func checkEnv(t *testing.T, env, want map[string]string, absent []string) {
	t.Helper()
	for k, v := range want {
		if env[k] != v {
			t.Errorf("%s=%q, want %q", k, env[k], v)
		}
	}
	for _, k := range absent {
		if v, ok := env[k]; ok {
			t.Errorf("%s=%q is set, want it absent", k, v)
		}
	}
}

func TestWorkerEnv(t *testing.T) {
	assign := func(nproc int) rendezvous.Assignment {
		return rendezvous.Assignment{Round: 7, RunID: "job-abc", GroupRank: 1, GroupWorldSize: 3, RankOffset: 2 * nproc,
			LocalWorldSize: nproc, WorldSize: 3 * nproc, MasterAddr: "10.0.0.1", MasterPort: 29500}
	}
	tests := []struct {
		name      string
		base      []string
		spec      map[string]string
		nproc     int
		localRank int
		ifname    string
		resume    *int64
		want      map[string]string
		absent    []string
	}{
		{
			name: "two procs: torchrun's contract", nproc: 2, localRank: 1, base: []string{"PATH=/bin", "HOME=/root"},
			want: map[string]string{"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "2",
				"GROUP_RANK": "1", "GROUP_WORLD_SIZE": "3", "ROLE_RANK": "5", "ROLE_WORLD_SIZE": "6", "ROLE_NAME": "default",
				"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RESTART_COUNT": "2",
				"TORCHELASTIC_MAX_RESTARTS": "5", "TORCHELASTIC_RUN_ID": "job-abc", "TORCHELASTIC_USE_AGENT_STORE": "False",
				"TORCHELASTIC_ERROR_FILE": "/logs/round-7/rank-5.error.json", "OMP_NUM_THREADS": "1",
				"NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "PYTHONUNBUFFERED": "1",
				"FLEETD_FLEET": "f", "FLEETD_NODE_ID": "n", "FLEETD_DRAIN_FILE": "/work/drain.json",
				"FLEETD_CHECKPOINT_URI": "file:///ckpt", "FLEETD_ROUND": "7", "PATH": "/bin", "HOME": "/root",
				"FLEETD_CHECKPOINT_REQUEST": "/work/checkpoint-request.json", "FLEETD_CHECKPOINT_DONE": "/logs/round-7/rank-5.checkpoint",
				"FLEETD_PROGRESS": "/logs/round-7/progress.jsonl"},
			absent: []string{"GLOO_SOCKET_IFNAME", "FLEETD_RESUME_STEP"},
		},
		{
			name: "resume step after a confirmed checkpoint", nproc: 1, resume: new(int64(1200)),
			want: map[string]string{"FLEETD_RESUME_STEP": "1200", "FLEETD_CHECKPOINT_DONE": "/logs/round-7/rank-2.checkpoint"},
		},
		{
			name: "per-round checkpoint variables never come from elsewhere", nproc: 1,
			base: []string{"FLEETD_RESUME_STEP=9", "FLEETD_CHECKPOINT_REQUEST=/tmp/x", "FLEETD_PROGRESS=/tmp/z"},
			spec: map[string]string{"FLEETD_CHECKPOINT_DONE": "/tmp/y"},
			want: map[string]string{"FLEETD_CHECKPOINT_REQUEST": "/work/checkpoint-request.json", "FLEETD_CHECKPOINT_DONE": "/logs/round-7/rank-2.checkpoint",
				"FLEETD_PROGRESS": "/logs/round-7/progress.jsonl"},
			absent: []string{"FLEETD_RESUME_STEP"},
		},
		{
			name: "one proc: no OMP default", nproc: 1, localRank: 0,
			want:   map[string]string{"RANK": "2", "LOCAL_WORLD_SIZE": "1", "WORLD_SIZE": "3"},
			absent: []string{"OMP_NUM_THREADS"},
		},
		{
			name: "inherited OMP and NCCL settings are kept", nproc: 4, base: []string{"OMP_NUM_THREADS=8", "NCCL_ASYNC_ERROR_HANDLING=0"},
			want: map[string]string{"OMP_NUM_THREADS": "8", "NCCL_ASYNC_ERROR_HANDLING": "0"},
		},
		{
			name: "spec env beats the agent's, the contract beats both", nproc: 2,
			base: []string{"FOO=agent", "RANK=41", "X=1", "X=2"},
			spec: map[string]string{"FOO": "spec", "RANK": "99", "OMP_NUM_THREADS": "4", "WORLD_SIZE": "1"},
			want: map[string]string{"FOO": "spec", "RANK": "4", "WORLD_SIZE": "6", "OMP_NUM_THREADS": "4", "X": "2"},
		},
		{
			name: "gloo interface", nproc: 1, ifname: "ens5",
			want: map[string]string{"GLOO_SOCKET_IFNAME": "ens5"},
		},
		{
			name: "gloo interface set by the spec wins", nproc: 1, ifname: "ens5", spec: map[string]string{"GLOO_SOCKET_IFNAME": "eth1"},
			want: map[string]string{"GLOO_SOCKET_IFNAME": "eth1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := workerEnvParams{
				Base: tt.base, Assignment: assign(tt.nproc), RestartCount: 2, Fleet: "f", Node: "n",
				Training:  TrainingConfig{MaxRestarts: 5, CheckpointURI: "file:///ckpt", Env: tt.spec},
				DrainFile: "/work/drain.json", Ifname: tt.ifname,
				ErrorFile:         func(lr int) string { return filepath.Join("/logs/round-7", "rank-"+itoa(2*tt.nproc+lr)+".error.json") },
				CheckpointRequest: "/work/checkpoint-request.json",
				CheckpointDone:    func(lr int) string { return filepath.Join("/logs/round-7", "rank-"+itoa(2*tt.nproc+lr)+".checkpoint") },
				ResumeStep:        tt.resume,
				ProgressFile:      "/logs/round-7/progress.jsonl",
			}
			env := workerEnv(p, tt.localRank)
			if !slices.IsSorted(env) {
				t.Error("environment is not sorted")
			}
			m := envMap(env)
			if len(m) != len(env) {
				t.Errorf("duplicate keys in %v", env)
			}
			checkEnv(t, m, tt.want, tt.absent)
		})
	}
}

func TestWorkerArgsSubstituteLocalRank(t *testing.T) {
	got := workerArgs([]string{"python3", "train.py", "--local-rank=${local_rank}", "--out", "/o/${local_rank}/x"}, 3)
	want := []string{"python3", "train.py", "--local-rank=3", "--out", "/o/3/x"}
	if !slices.Equal(got, want) {
		t.Fatalf("workerArgs = %v, want %v", got, want)
	}
}

func TestParseStepAndRootCause(t *testing.T) {
	for line, want := range map[string]int64{
		`{"event":"step","step":42,"world_size":2}`: 42,
		`{"event":"resume","step":41}`:              -1,
		`{"event":"step"}`:                          -1,
		`step 42`:                                   -1,
		`{"event":"step","step":`:                   -1,
	} {
		got, ok := parseStep(line)
		if (want < 0) == ok || (ok && got != want) {
			t.Errorf("parseStep(%q) = %d, %v; want %d", line, got, ok, want)
		}
	}
	dir := t.TempDir()
	for name, tc := range map[string]struct{ body, want string }{
		"record": {`{"message":{"message":"RuntimeError: boom","extraInfo":{"timestamp":"1"}},"errorCode":1}`, "RuntimeError: boom"},
		"plain":  {`{"message":"Signal 9 (SIGKILL) received by PID 12"}`, "Signal 9 (SIGKILL) received by PID 12"},
		"broken": {`{"message":`, ""},
	} {
		f := filepath.Join(dir, name+".json")
		if err := os.WriteFile(f, []byte(tc.body), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := rootCause(f); got != tc.want {
			t.Errorf("rootCause(%s) = %q, want %q", name, got, tc.want)
		}
	}
	if got := rootCause(filepath.Join(dir, "missing.json")); got != "" {
		t.Errorf("rootCause of a missing file = %q", got)
	}
}

func TestReadCheckpointDone(t *testing.T) {
	dir := t.TempDir()
	for body, want := range map[string]int64{
		"1200\n":                        1200,
		"0":                             0,
		`{"step": 42, "path": "/ckpt"}`: 42,
		"-3":                            -1,
		"12.5":                          -1,
		`{"step": "7"}`:                 -1,
		`{}`:                            -1,
		"":                              -1,
		"step 7":                        -1,
	} {
		f := filepath.Join(dir, "marker")
		if err := os.WriteFile(f, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		got, ok := readCheckpointDone(f)
		if (want < 0) == ok || (ok && got != want) {
			t.Errorf("readCheckpointDone(%q) = %d, %v; want %d", body, got, ok, want)
		}
	}
	if _, ok := readCheckpointDone(filepath.Join(dir, "missing")); ok {
		t.Error("a missing marker reads as a checkpoint")
	}
	// The set's step is the lowest of its workers' markers; missing ones are skipped.
	set := &workerSet{}
	for i, body := range []string{"30", "", "29"} {
		w := &worker{doneFile: filepath.Join(dir, "w"+itoa(i))}
		if body != "" {
			if err := os.WriteFile(w.doneFile, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		set.workers = append(set.workers, w)
	}
	if step, n := set.checkpointed(); step != 29 || n != 2 {
		t.Errorf("checkpointed() = %d, %d; want 29, 2", step, n)
	}
}

func TestCheckpointBound(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	e := &elastic{a: &agent{opts: Options{NoticeMargin: 5 * time.Second, RestartGrace: 10 * time.Second}}}
	for _, tt := range []struct {
		name     string
		grace    time.Duration
		deadline time.Time
		want     time.Duration
	}{
		{"no deadline known: drain_grace, not RestartGrace", 90 * time.Second, time.Time{}, 90 * time.Second},
		{"default drain_grace", 0, time.Time{}, defaultDrainGrace},
		{"AWS 2 min notice: drain_grace first", 90 * time.Second, now.Add(2 * time.Minute), 90 * time.Second},
		{"GCE 30 s notice: the deadline first", 90 * time.Second, now.Add(30 * time.Second), 25 * time.Second},
		{"deadline almost there: a second anyway", 90 * time.Second, now.Add(3 * time.Second), minCheckpointGrace},
		{"deadline passed", 90 * time.Second, now.Add(-time.Minute), minCheckpointGrace},
	} {
		e.training = TrainingConfig{DrainGrace: tt.grace}
		if got := e.checkpointBound(tt.deadline, now); got != tt.want {
			t.Errorf("%s: bound %v, want %v", tt.name, got, tt.want)
		}
	}
}
