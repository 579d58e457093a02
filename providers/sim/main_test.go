package sim

import (
	"os"
	"testing"

	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/providertest"
)

func TestMain(m *testing.M) {
	providertest.ServePluginIfRequested(map[string]func() providers.Provider{
		Name: func() providers.Provider { return New(Options{}) },
	})
	os.Exit(m.Run())
}
