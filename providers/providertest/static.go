package providertest

import (
	"context"
	"fmt"

	"github.com/fleetd/fleetd/providers"
)

// Static hands a daemon in-process providers by name: the provider source
// of tests and benchmarks that run no plugin manager.
type Static map[string]providers.Provider

// Get returns the provider registered as name.
func (s Static) Get(ctx context.Context, name string) (providers.Provider, error) {
	p, ok := s[name]
	if !ok {
		return nil, fmt.Errorf("no provider %q", name)
	}
	return p, nil
}
