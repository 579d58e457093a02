package providertest

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/fleetd/fleetd/plugins"
	"github.com/fleetd/fleetd/providers"
	"github.com/hashicorp/go-hclog"
)

// PluginEnv names the provider a re-executed test binary serves. A test
// package that runs providers over the real plugin path calls
// ServePluginIfRequested first thing in its TestMain:
//
//	func TestMain(m *testing.M) {
//		providertest.ServePluginIfRequested(map[string]func() providers.Provider{
//			providertest.MemName: func() providers.Provider { return providertest.NewMemProvider() },
//		})
//		os.Exit(m.Run())
//	}
const PluginEnv = "FLEETD_TEST_PLUGIN"

// ServePluginIfRequested serves the provider named by $FLEETD_TEST_PLUGIN
// as a plugin and exits the process; without the variable it returns.
func ServePluginIfRequested(registry map[string]func() providers.Provider) {
	name, ok := os.LookupEnv(PluginEnv)
	if !ok {
		return
	}
	newProvider, ok := registry[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "%s=%q: this test binary serves no such provider\n", PluginEnv, name)
		os.Exit(2)
	}
	plugins.Serve(newProvider())
	os.Exit(0)
}

// NewPluginManager returns a plugins.Manager whose built-in providers
// (names) are served by re-executing the running test binary, which must
// call ServePluginIfRequested from TestMain. The manager is closed when the
// test ends. Extra options (PluginDir, Checksums) may be set by modify.
func NewPluginManager(t testing.TB, names []string, modify func(*plugins.ManagerOptions)) *plugins.Manager {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("locate the test binary: %v", err)
	}
	opts := plugins.ManagerOptions{
		SelfExe: exe,
		// -test.run=^$ keeps a child that somehow missed the variable
		// from running the tests again (and again).
		SelfArgs: func(string) []string { return []string{"-test.run=^$"} },
		Builtins: names,
		Env:      func(name string) []string { return []string{PluginEnv + "=" + name} },
		Logger: hclog.New(&hclog.LoggerOptions{
			Name: "plugins", Level: hclog.Warn, Output: t.Output(),
		}),
		StartTimeout: 30 * time.Second,
	}
	if modify != nil {
		modify(&opts)
	}
	m := plugins.NewManager(opts)
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// RunOverGRPC runs the conformance suite against provider name served by a
// real plugin subprocess (a re-executed test binary, see
// ServePluginIfRequested), through plugins.Manager, go-plugin and gRPC:
// exactly the path the daemon uses. cfg returns the config for each subtest.
func RunOverGRPC(t *testing.T, name string, cfg func(t *testing.T) providers.Config, opts Options) {
	t.Helper()
	Run(t, func(t *testing.T) (providers.Provider, providers.Config) {
		m := NewPluginManager(t, []string{name}, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		p, err := m.Get(ctx, name)
		if err != nil {
			t.Fatalf("start plugin %q: %v", name, err)
		}
		return p, cfg(t)
	}, opts)
}
