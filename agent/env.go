package agent

import (
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/fleetd/fleetd/rendezvous"
)

// fleetd's own worker variables, on top of torchrun's contract.
const (
	EnvFleet         = "FLEETD_FLEET"
	EnvNodeID        = "FLEETD_NODE_ID"
	EnvDrainFile     = "FLEETD_DRAIN_FILE"
	EnvCheckpointURI = "FLEETD_CHECKPOINT_URI"
	EnvRound         = "FLEETD_ROUND"
	// The checkpoint-on-notice contract (docs/agent.md).
	EnvCheckpointRequest = "FLEETD_CHECKPOINT_REQUEST" // the file that exists while the agent asks for a checkpoint
	EnvCheckpointDone    = "FLEETD_CHECKPOINT_DONE"    // per worker: where it writes the step it checkpointed
	EnvResumeStep        = "FLEETD_RESUME_STEP"        // the step this node's previous workers checkpointed
	// In-process elastic mode (docs/agent.md).
	EnvElastic     = "FLEETD_ELASTIC"      // "in-process"; unset in restart mode
	EnvElasticFile = "FLEETD_ELASTIC_FILE" // the file through which the agent hands over each new round
)

// workerEnvParams is everything a worker's environment depends on.
type workerEnvParams struct {
	Base         []string // the agent's own environment (os.Environ)
	Assignment   rendezvous.Assignment
	Training     TrainingConfig
	RestartCount int
	Fleet, Node  string
	DrainFile    string
	// ErrorFile returns TORCHELASTIC_ERROR_FILE for a local rank.
	ErrorFile func(localRank int) string
	// CheckpointRequest is FLEETD_CHECKPOINT_REQUEST (the same for every round).
	CheckpointRequest string
	// CheckpointDone returns FLEETD_CHECKPOINT_DONE for a local rank.
	CheckpointDone func(localRank int) string
	// ResumeStep, if set, becomes FLEETD_RESUME_STEP.
	ResumeStep *int64
	// ProgressFile, if set, becomes FLEETD_PROGRESS (the round's file).
	ProgressFile string
	// Ifname, if set, becomes GLOO_SOCKET_IFNAME unless already set.
	Ifname string
	// ElasticFile and HelperDir, in in-process mode: FLEETD_ELASTIC_FILE,
	// and the directory of fleetd_elastic.py, put first on PYTHONPATH.
	ElasticFile, HelperDir string
	// CheckpointDir, if set, becomes FLEETD_CHECKPOINT_DIR, and
	// FLEETD_CHECKPOINT_URI when checkpoint_uri is empty.
	CheckpointDir string
	// Network is the node's fast network: its NCCL/libfabric defaults
	// apply where nobody set them, and FLEETD_NETWORK names it.
	Network netPath
}

// workerEnv returns the environment of the worker with localRank, as
// torchrun 1.13's LocalElasticAgent builds it (reference/torchelastic.md
// §1.1): the agent's environment, then the spec's env, then the contract,
// which always wins. Sorted, one KEY=value each.
func workerEnv(p workerEnvParams, localRank int) []string {
	env := make(map[string]string, len(p.Base)+32)
	for _, kv := range p.Base {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			env[k] = v // later duplicates win, as exec does
		}
	}
	for k, v := range p.Training.Env {
		env[k] = v
	}
	a := p.Assignment
	itoa := strconv.Itoa
	set := map[string]string{
		"RANK":                         itoa(a.Rank(localRank)),
		"LOCAL_RANK":                   itoa(localRank),
		"WORLD_SIZE":                   itoa(a.WorldSize),
		"LOCAL_WORLD_SIZE":             itoa(a.LocalWorldSize),
		"GROUP_RANK":                   itoa(a.GroupRank),
		"GROUP_WORLD_SIZE":             itoa(a.GroupWorldSize),
		"ROLE_NAME":                    "default",
		"ROLE_RANK":                    itoa(a.Rank(localRank)), // one role: role ranks are the global ranks
		"ROLE_WORLD_SIZE":              itoa(a.WorldSize),
		"MASTER_ADDR":                  a.MasterAddr,
		"MASTER_PORT":                  itoa(a.MasterPort),
		"TORCHELASTIC_RESTART_COUNT":   itoa(p.RestartCount),
		"TORCHELASTIC_MAX_RESTARTS":    itoa(p.Training.MaxRestarts),
		"TORCHELASTIC_RUN_ID":          a.RunID,
		"TORCHELASTIC_USE_AGENT_STORE": "False", // worker rank 0 hosts the TCPStore; the agent has none
		"PYTHONUNBUFFERED":             "1",     // torchrun runs `python -u`; we run the command as given
		EnvFleet:                       p.Fleet,
		EnvNodeID:                      p.Node,
		EnvDrainFile:                   p.DrainFile,
		EnvCheckpointURI:               p.Training.CheckpointURI,
		EnvRound:                       itoa(a.Round),
	}
	if p.ErrorFile != nil {
		set["TORCHELASTIC_ERROR_FILE"] = p.ErrorFile(localRank)
	}
	if p.CheckpointRequest != "" {
		set[EnvCheckpointRequest] = p.CheckpointRequest
	}
	if p.CheckpointDir != "" {
		set[EnvCheckpointDir] = p.CheckpointDir
		if p.Training.CheckpointURI == "" {
			set[EnvCheckpointURI] = p.CheckpointDir
		}
	}
	if p.ProgressFile != "" {
		set[EnvProgress] = p.ProgressFile
	}
	// Per-round values the agent did not set must not leak in from its
	// own environment or the spec.
	delete(env, EnvCheckpointDone)
	delete(env, EnvResumeStep)
	delete(env, EnvElastic)
	delete(env, EnvElasticFile)
	if p.ElasticFile != "" {
		set[EnvElastic] = ElasticInProcess
		set[EnvElasticFile] = p.ElasticFile
		if p.HelperDir != "" {
			pp := p.HelperDir
			if old := env["PYTHONPATH"]; old != "" {
				pp += string(os.PathListSeparator) + old
			}
			set["PYTHONPATH"] = pp
		}
	}
	if p.CheckpointDone != nil {
		set[EnvCheckpointDone] = p.CheckpointDone(localRank)
	}
	if p.ResumeStep != nil {
		set[EnvResumeStep] = strconv.FormatInt(*p.ResumeStep, 10)
	}
	for k, v := range set {
		env[k] = v
	}
	// Defaults torchrun applies only when nobody set them.
	if _, ok := env["OMP_NUM_THREADS"]; !ok && a.LocalWorldSize > 1 {
		env["OMP_NUM_THREADS"] = "1"
	}
	for _, k := range []string{"NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING"} {
		if _, ok := env[k]; !ok {
			env[k] = "1"
		}
	}
	if _, ok := env["GLOO_SOCKET_IFNAME"]; !ok && p.Ifname != "" {
		env["GLOO_SOCKET_IFNAME"] = p.Ifname
	}
	for k, v := range networkDefaults(p.Network) {
		if _, ok := env[k]; !ok {
			env[k] = v
		}
	}
	delete(env, EnvNetwork)
	if s := p.Network.String(); s != "" {
		env[EnvNetwork] = s
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

// workerArgs substitutes torchrun's ${local_rank} macro in the command.
func workerArgs(command []string, localRank int) []string {
	out := make([]string, len(command))
	for i, s := range command {
		out[i] = strings.ReplaceAll(s, "${local_rank}", strconv.Itoa(localRank))
	}
	return out
}
