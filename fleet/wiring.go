package fleet

import (
	"context"
	"errors"
	"fmt"

	"github.com/fleetd/fleetd/fleet/bootstrap"
	"github.com/fleetd/fleetd/fleet/controller"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

// The controller's handles on the rest of the daemon: one tiny shim per
// interface it declares (fleet/controller).

// newController builds the fleets' controller over the daemon's parts.
func (d *Daemon) newController() *controller.Controller {
	return controller.New(controller.Options{
		Store:      d.store,
		Providers:  fleetProviders{d},
		Specs:      fleetSpecs{d},
		Rendezvous: d.rdzv.rzPort,
		Recorder:   d.stats,
		Boot:       nodeBoot{d},
		Servable: func(offs []providers.Offering) []providers.Offering {
			kept, _ := d.agents.servableOfferings(offs)
			return kept
		},
		MoveCost: d.moveCost,
		Destroyed: func(fleet string) {
			d.agentAPI.ForgetCheckpoints(fleet)
			d.agentAPI.ForgetStaging(fleet)
		},
		AfterPass:   d.scanStrays,
		DaemonID:    d.daemonID,
		StartedAt:   d.started,
		Now:         d.now,
		Logger:      d.log,
		Tick:        d.opts.Tick,
		Params:      d.params,
		Autoscale:   d.autoscaleParams,
		ProjectsNow: d.projects.Config,
		Allocation:  d.opts.Allocation,
	})
}

// fleetSpecs decodes fleets' stored specs (cached by source).
type fleetSpecs struct{ d *Daemon }

func (s fleetSpecs) Spec(f state.Fleet) (*spec.Fleet, error) { return s.d.fleetSpec(f) }

// fleetProviders hands out a fleet's providers with their config.
type fleetProviders struct{ d *Daemon }

func (p fleetProviders) Provider(ctx context.Context, f state.Fleet, name string) (providers.Provider, providers.Config, error) {
	return p.d.providerFor(ctx, f, name)
}

// providerFor returns the fleet's provider and its config.
func (d *Daemon) providerFor(ctx context.Context, f state.Fleet, name string) (providers.Provider, providers.Config, error) {
	if d.opts.Providers == nil {
		return nil, providers.Config{}, errors.New("no providers configured")
	}
	fl, err := d.fleetSpec(f)
	if err != nil {
		return nil, providers.Config{}, err
	}
	pb, ok := fl.Provider(name)
	if !ok {
		return nil, providers.Config{}, fmt.Errorf("fleet %s has no provider %q block", f.Name, name)
	}
	p, err := d.opts.Providers.Get(ctx, name)
	if err != nil {
		return nil, providers.Config{}, fmt.Errorf("provider %s: %w", name, err)
	}
	return p, providers.Config{Fleet: f.Name, Raw: pb.Config}, nil
}

// nodeBoot renders nodes' #cloud-config documents.
type nodeBoot struct{ d *Daemon }

// metadataKind is the metadata service an agent watches on a provider.
func metadataKind(provider string) string {
	switch provider {
	case "aws", "local":
		return "aws-imds"
	case "gcp":
		return "gce"
	}
	return "none"
}

// UserData renders a node's #cloud-config document.
func (b nodeBoot) UserData(fleetName string, fl *spec.Fleet, n state.Node) (string, error) {
	d := b.d
	in := bootstrap.Input{
		Agent: bootstrap.AgentConfig{Fleet: fleetName, NodeID: n.ID, DaemonURL: d.URL(), DaemonURLs: d.otherServers(), Token: d.NodeToken(fleetName, n.ID),
			Metadata: bootstrap.MetadataConfig{Kind: metadataKind(n.Offering.Provider)}},
		Setup: fl.Training.Setup,
	}
	var err error
	if in.Mounts, err = bootstrap.MountsFor(fl.Training.Data); err != nil {
		return "", err
	}
	if d.ca != nil {
		in.Agent.CAFingerprint = "sha256:" + d.ca.Fingerprint
		in.CACertPEM = d.ca.CertPEM
	}
	// Real VMs download the agent built for their architecture from the
	// daemon; local nodes run this very binary already.
	if downloadsAgent(n.Offering.Provider) {
		if in.AgentURL, in.AgentSHA256, err = d.agents.AgentDownload(d.URL(), fleetName, n.ID, n.Offering.Arch, nodeStores(fl)); err != nil {
			return "", err
		}
	}
	return bootstrap.Render(in)
}
