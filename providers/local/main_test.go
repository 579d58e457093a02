package local_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleetd/agent"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/local"
	"github.com/fleetd/fleetd/providers/providertest"
)

// TestMain lets the test binary stand in for the fleetd binary: the
// provider re-executes it as `local-node` (the node supervisor), which
// re-executes it as `agent`, and the plugin manager re-executes it as the
// local provider plugin (FLEETD_TEST_PLUGIN=local). Both run the real code; only the flag parsing
// of cmd/fleetd is repeated here, so these tests do not depend on the rest
// of cmd/fleetd building.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case local.NodeCommand:
			os.Exit(fakeMain(os.Args[2:], runNode))
		case "agent":
			os.Exit(fakeMain(os.Args[2:], runAgent))
		case "test-pgroup-tree":
			// A process with a child in a process group of its own.
			child := exec.Command(os.Args[0], "test-sleep")
			child.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := child.Start(); err != nil {
				os.Exit(1)
			}
			fmt.Println(child.Process.Pid)
			go func() { _ = child.Wait() }()
			time.Sleep(30 * time.Second)
			os.Exit(0)
		case "test-sleep":
			time.Sleep(30 * time.Second)
			os.Exit(0)
		case launcherCommand:
			if err := launchOne(os.Args[2]); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			os.Exit(0)
		}
	}
	providertest.ServePluginIfRequested(map[string]func() providers.Provider{
		local.Name: func() providers.Provider { return local.New(local.Options{StopGrace: 2 * time.Second}) },
	})
	os.Exit(m.Run())
}

func fakeMain(args []string, body func(ctx context.Context, args []string) error) int {
	signal.Ignore(syscall.SIGHUP)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := body(ctx, args); err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		return 1
	}
	return 0
}

func runNode(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet(local.NodeCommand, flag.ContinueOnError)
	dir := fs.String("dir", "", "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	return local.RunNode(ctx, *dir)
}

func runAgent(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	cfgPath := fs.String("config", agent.DefaultConfigPath, "")
	root := fs.String("root", "", "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := agent.LoadConfig(*cfgPath)
	if err != nil {
		return err
	}
	return agent.Run(ctx, agent.Options{
		Config: cfg, Root: *root,
		MetadataURL: os.Getenv(agent.EnvMetadataURL), NodeAddr: os.Getenv(agent.EnvNodeAddr),
		Stderr: os.Stderr,
	})
}

// runLauncher runs this test binary as a short-lived process that creates
// one node over stateDir and exits, printing the instance id.
func runLauncher(t *testing.T, exe, stateDir string) (string, error) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), exe, launcherCommand, stateDir)
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr), err
	}
	return string(out), err
}

const launcherCommand = "test-launch-one-node"

func launchOne(stateDir string) error {
	p := local.New(local.Options{StateDir: stateDir, StopGrace: 2 * time.Second})
	insts, err := p.Create(context.Background(), providers.Config{Fleet: "test", Raw: json.RawMessage(`{}`)}, providers.LaunchRequest{
		Offering: providers.Offering{Provider: "local", Region: "local", Zone: "local-a", InstanceType: "local.gpu1", CapacityType: providers.Spot},
		Count:    1,
	})
	if err != nil {
		return err
	}
	fmt.Println(insts[0].ID)
	return nil
}
