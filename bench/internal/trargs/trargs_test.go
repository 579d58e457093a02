package trargs

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// keepAliveCheck builds a real c10d rendezvous handler through torch's own
// registry (hosting its TCP store), after the launcher's patch for the
// --rdzv_conf given (none: "-"), and prints the keep-alive it got.
const keepAliveCheck = `
import importlib.util, socket, sys
spec = importlib.util.spec_from_file_location("launcher", sys.argv[1])
launcher = importlib.util.module_from_spec(spec)
spec.loader.exec_module(launcher)
if sys.argv[2] != "-":
    launcher.patch(["--nnodes=2:3", "--rdzv_conf=" + sys.argv[2], "train.py"])
from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry
import torch.distributed.elastic.rendezvous.registry  # registers c10d
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
h = rendezvous_handler_registry.create_handler(RendezvousParameters("c10d", "127.0.0.1:%d" % port, "t", 1, 1, is_host="1"))
print(h._settings.keep_alive_interval.total_seconds(), h._settings.keep_alive_max_attempt)
`

// TestKeepAliveLauncher: torch 1.13 ignores keep_alive_* in --rdzv_conf
// (5 s, 3 beats); through bench/torchrun_keepalive.py they take effect.
func TestKeepAliveLauncher(t *testing.T) {
	py := "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import torch.distributed.elastic").Run(); err != nil {
		t.Skipf("%s cannot import torch (apt-get install python3-torch; .ci/run installs it): %v", py, err)
	}
	launcher, err := filepath.Abs(filepath.Join("..", "..", "torchrun_keepalive.py"))
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(t.TempDir(), "check.py")
	if err := os.WriteFile(script, []byte(keepAliveCheck), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ conf, want string }{
		{"-", "5.0 3"}, // torch 1.13's hard-coded values
		{"is_host=1", "5.0 3"},
		{"is_host=1,last_call_timeout=5,keep_alive_interval=2,keep_alive_max_attempt=5", "2.0 5"},
		{"keep_alive_interval=0.5", "0.5 3"},
	} {
		out, err := exec.Command(py, script, launcher, tc.conf).Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Fatalf("%s: %v\n%s", tc.conf, err, stderr)
		}
		if got := strings.TrimSpace(string(out)); got != tc.want {
			t.Errorf("--rdzv_conf=%s: keep-alive %q, want %q", tc.conf, got, tc.want)
		}
	}
}
