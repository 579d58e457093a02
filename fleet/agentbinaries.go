package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/bootstrap"
	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/providers"
)

// Agent binaries per platform. Nodes download their agent from the daemon
// (GET /v1/agent/binary?arch=…), pinned by sha256 in their user-data; the
// daemon serves one binary per architecture, found at start in the agent
// directories (bootstrap.IndexAgents), its own executable counting for its
// own platform. Offerings whose architecture has no binary are left out of
// placement, and a fleet none of whose offerings can be served is refused
// at plan and apply, before a node boots into a failing download.

// nodeStores reports whether a fleet's agents open the checkpoint store
// with the node's own credentials or stage a bucket, which needs the
// node-store agent build.
func nodeStores(fl *spec.Fleet) bool {
	return fl != nil && (fl.Training.Checkpoint != nil && fl.Training.Checkpoint.Access == spec.CheckpointAccessNode || stagesBucket(fl))
}

// stagesBucket: a data block copies a bucket to the nodes, which the slim
// agent cannot read (no s3/gcs driver).
func stagesBucket(fl *spec.Fleet) bool {
	for _, d := range fl.Training.Data {
		if src, err := spec.ParseDataSource(d.Source); err == nil && src.Bucket() && d.Mode == spec.DataStage {
			return true
		}
	}
	return false
}

// agentDirs are the directories searched for agent binaries: agent_dir
// when set; else next to the daemon's executable (bin/ after `make
// agents`, /usr/local/bin after an install) and <data_dir>/agents.
func (c *Config) agentDirs(exe string) []string {
	if c.AgentDir != "" {
		return []string{c.AgentDir}
	}
	var dirs []string
	if exe != "" {
		dirs = append(dirs, filepath.Dir(exe))
	}
	if c.DataDir != "" {
		dirs = append(dirs, filepath.Join(c.DataDir, "agents"))
	}
	return dirs
}

// agentBinaries are the agent binaries nodes download, by architecture,
// and the rules that follow from them: offerings of an architecture
// without one are not servable, and plans say so.
type agentBinaries struct {
	*bootstrap.AgentIndex
	log       *slog.Logger
	providers ProviderSource
}

// indexAgents finds the agent binaries and logs what the daemon serves.
func indexAgents(cfg Config, log *slog.Logger, ps ProviderSource) *agentBinaries {
	d := &agentBinaries{log: log, providers: ps}
	exe, err := os.Executable()
	if err != nil {
		d.log.Warn("agent binaries: cannot locate the daemon executable", "err", err)
		exe = ""
	} else if p, err := filepath.EvalSymlinks(exe); err == nil {
		exe = p
	}
	d.AgentIndex = bootstrap.IndexAgents(cfg.agentDirs(exe), exe)
	for _, s := range d.Skipped {
		d.log.Warn("agent binary skipped", "why", s)
	}
	for _, b := range d.All() {
		d.log.Info("agent binary", "platform", "linux/"+b.Arch, "flavor", b.Flavor, "path", b.Path, "sha256", b.SHA256, "size", b.Size, "self", b.Self)
	}
	for _, b := range d.Binaries() {
		if b.Flavor == bootstrap.FlavorFull {
			// Nothing breaks, but every node pulls the whole daemon.
			d.log.Warn("no slim agent: nodes download the full fleetd binary", "platform", "linux/"+b.Arch, "size", b.Size,
				"fix", bootstrap.AgentFix(b.Arch, d.Dirs))
		}
	}
	for _, arch := range bootstrap.AgentArches {
		if _, ok := d.Lookup(arch); !ok {
			d.log.Info("no agent binary: fleets on this architecture are refused", "platform", "linux/"+arch, "looked_in", d.Dirs,
				"fix", bootstrap.AgentFix(arch, d.Dirs))
		}
	}
	return d
}

// downloadsAgent reports whether a provider's nodes download the agent
// from the daemon: real VMs do; local nodes run this very binary and sim
// nodes run nothing.
func downloadsAgent(provider string) bool { return provider != "local" && provider != "sim" }

// noAgentFor is the reason o cannot be served an agent ("" when it can).
func (d *agentBinaries) noAgentFor(o providers.Offering) string {
	if !downloadsAgent(o.Provider) {
		return ""
	}
	if _, ok := d.Lookup(o.Arch); ok {
		return ""
	}
	return "no agent binary for " + bootstrap.NormalizeArch(o.Arch)
}

// servableOfferings drops the offerings whose nodes could not be handed
// an agent, so placement never picks them; excluded counts them by reason.
func (d *agentBinaries) servableOfferings(offs []providers.Offering) (kept []providers.Offering, excluded map[string]int) {
	for i, o := range offs {
		why := d.noAgentFor(o)
		if why == "" {
			if excluded != nil {
				kept = append(kept, o)
			}
			continue
		}
		if excluded == nil {
			excluded = map[string]int{}
			kept = append(make([]providers.Offering, 0, len(offs)), offs[:i]...)
		}
		excluded[why]++
	}
	if excluded == nil {
		return offs, nil
	}
	return kept, excluded
}

// excludedNotes renders servableOfferings' counts for a plan.
func excludedNotes(excluded map[string]int) []string {
	var out []string
	for why, n := range excluded {
		out = append(out, fmt.Sprintf("%d offering(s) left out: %s (build it with `make release` and copy it into the agent directory)", n, why))
	}
	sort.Strings(out)
	return out
}

// markNoAgent marks ranked offerings that cannot be served an agent as
// excluded (the offerings view), keeping the launchable ones first.
func (d *agentBinaries) markNoAgent(rs []placement.Ranked) []placement.Ranked {
	changed := false
	for i := range rs {
		if rs[i].Excluded != "" {
			continue
		}
		if why := d.noAgentFor(rs[i].Offering); why != "" {
			rs[i].Excluded, changed = why, true
		}
	}
	if changed {
		sort.SliceStable(rs, func(i, j int) bool { return rs[i].Excluded == "" && rs[j].Excluded != "" })
	}
	return rs
}

// checkAgentBinaries refuses (Plan, Apply) the first fleet of file none of
// whose candidate offerings (those its node constraints admit, from the
// providers whose nodes download the agent) runs on an architecture the
// daemon has an agent for. A fleet with some servable offerings passes:
// placement leaves the others out. Providers that cannot list offerings
// now are not judged here; plan notes and check report them.
func (d *agentBinaries) checkAgentBinaries(ctx context.Context, file *spec.File) error {
	if d.providers == nil {
		return nil
	}
	for _, fl := range file.Fleets {
		arches := map[string][]string{} // arch → instance types
		servable := false
		for _, pb := range fl.Providers {
			if !downloadsAgent(pb.Name) {
				servable = true
				continue
			}
			p, err := d.providers.Get(ctx, pb.Name)
			if err != nil {
				continue
			}
			octx, cancel := context.WithTimeout(ctx, 30*time.Second)
			offs, err := p.Offerings(octx, providers.Config{Fleet: fl.Name, Raw: pb.Config})
			cancel()
			if err != nil {
				continue
			}
			for _, o := range offs {
				if placement.Exclusion(fl, o) != "" {
					continue
				}
				if d.noAgentFor(o) == "" {
					servable = true
					break
				}
				arch := bootstrap.NormalizeArch(o.Arch)
				if len(arches[arch]) < 3 && !slices.Contains(arches[arch], o.InstanceType) {
					arches[arch] = append(arches[arch], o.InstanceType)
				}
			}
		}
		if servable || len(arches) == 0 {
			continue
		}
		e := &api.NoAgentError{Fleet: fl.Name, Have: d.Arches(), Looked: d.Dirs}
		for arch := range arches {
			e.Arches = append(e.Arches, arch)
		}
		sort.Strings(e.Arches)
		for _, arch := range e.Arches {
			e.Offerings = append(e.Offerings, arches[arch]...)
		}
		e.Fix = bootstrap.AgentFix(e.Arches[0], d.Dirs)
		return e
	}
	return nil
}
