package agent

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

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
				"FLEETD_CHECKPOINT_URI": "file:///ckpt", "FLEETD_ROUND": "7", "PATH": "/bin", "HOME": "/root"},
			absent: []string{"GLOO_SOCKET_IFNAME"},
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
				ErrorFile: func(lr int) string { return filepath.Join("/logs/round-7", "rank-"+itoa(2*tt.nproc+lr)+".error.json") },
			}
			env := workerEnv(p, tt.localRank)
			if !slices.IsSorted(env) {
				t.Error("environment is not sorted")
			}
			m := envMap(env)
			if len(m) != len(env) {
				t.Errorf("duplicate keys in %v", env)
			}
			for k, v := range tt.want {
				if m[k] != v {
					t.Errorf("%s=%q, want %q", k, m[k], v)
				}
			}
			for _, k := range tt.absent {
				if v, ok := m[k]; ok {
					t.Errorf("%s=%q is set, want it absent", k, v)
				}
			}
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
