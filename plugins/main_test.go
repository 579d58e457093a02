package plugins_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/fleetd/fleetd/plugins"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/providertest"
	"github.com/hashicorp/go-hclog"
)

// daemonEnv makes the re-executed test binary act as a daemon that starts
// the mem plugin, prints the plugin's pid and waits to be killed.
const daemonEnv = "FLEETD_TEST_FAKE_DAEMON"

func TestMain(m *testing.M) {
	providertest.ServePluginIfRequested(map[string]func() providers.Provider{
		providertest.MemName: func() providers.Provider { return providertest.NewMemProvider() },
	})
	if os.Getenv(daemonEnv) != "" {
		os.Exit(fakeDaemon())
	}
	code := m.Run()
	if extBuildDir != "" {
		_ = os.RemoveAll(extBuildDir)
	}
	os.Exit(code)
}

func fakeDaemon() int {
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	m := plugins.NewManager(plugins.ManagerOptions{
		SelfExe:  exe,
		SelfArgs: func(string) []string { return []string{"-test.run=^$"} },
		Builtins: []string{providertest.MemName},
		Env:      func(name string) []string { return []string{providertest.PluginEnv + "=" + name} },
		Logger:   hclog.NewNullLogger(),
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := m.Get(ctx, providertest.MemName); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("%d\n", m.PIDs()[providertest.MemName])
	// The test SIGKILLs us; the timeout only stops a stray daemon.
	time.Sleep(60 * time.Second)
	return 1
}
