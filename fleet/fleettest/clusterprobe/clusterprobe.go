// Package clusterprobe asks the servers of an HA cluster on loopback (by
// API URL) who leads, for cmd/fleetd's HA tests and bench/ha, which poll it
// while servers start and die. It imports only fleet/api: bench/ha is a
// program and must not link fleettest's daemon and test helpers.
package clusterprobe

import (
	"context"
	"sync"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
)

// Probe keeps one client per server and token: one connection pool per
// server, not one per question.
type Probe struct {
	Timeout time.Duration // of one question
	clients sync.Map      // "url token" → *api.Client
}

// Info asks the server at url about the cluster.
func (p *Probe) Info(ctx context.Context, url, token string) (api.ClusterInfo, error) {
	key := url + " " + token
	c, ok := p.clients.Load(key)
	if !ok {
		cl, err := api.NewClient(url, api.ClientOptions{Token: token, Timeout: p.Timeout})
		if err != nil {
			return api.ClusterInfo{}, err
		}
		c, _ = p.clients.LoadOrStore(key, cl)
	}
	return c.(*api.Client).Cluster(ctx)
}

// AllAnswer reports whether every server answers GET /v1/cluster.
func (p *Probe) AllAnswer(ctx context.Context, token string, urls ...string) bool {
	for _, u := range urls {
		if _, err := p.Info(ctx, u, token); err != nil {
			return false
		}
	}
	return true
}

// Leader is the leader the first server that knows one names, "" while
// none does.
func (p *Probe) Leader(ctx context.Context, token string, urls ...string) string {
	for _, u := range urls {
		if info, err := p.Info(ctx, u, token); err == nil && info.Leader != "" {
			return info.Leader
		}
	}
	return ""
}
