// Package devcluster writes the daemon configurations of the fleetd clusters
// that cmd/fleetd's HA tests and bench/ha start on loopback. It is not a
// test helper package (bench/ha is a program), so it does not import testing.
package devcluster

import (
	"fmt"
	"strings"
	"time"
)

// DaemonConfig is the daemon.hcl of a server whose API is at url
// ("http://127.0.0.1:N") with its data in dataDir; body (a cluster block,
// log_level, ...) follows.
func DaemonConfig(url, dataDir, body string) string {
	return fmt.Sprintf(`
listen        = %q
advertise_url = %q
data_dir      = %q
%s`, strings.TrimPrefix(url, "http://"), url, dataDir, body)
}

// EmbeddedEtcd returns, by server name, the cluster blocks of servers that
// each run a member of one embedded etcd cluster on loopback, its peer
// and client ports taken from addr (which returns a free "127.0.0.1:N").
func EmbeddedEtcd(names []string, addr func() string, sessionTTL time.Duration) map[string]string {
	peers, clients := map[string]string{}, make([]string, len(names))
	var initial, endpoints []string
	for i, n := range names {
		peers[n], clients[i] = "http://"+addr(), "http://"+addr()
		initial = append(initial, fmt.Sprintf("%s = %q", n, peers[n]))
		endpoints = append(endpoints, fmt.Sprintf("%q", clients[i]))
	}
	blocks := map[string]string{}
	for i, n := range names {
		blocks[n] = fmt.Sprintf(`cluster {
  session_ttl = %q
  embedded_etcd {
    name             = %q
    listen_peer      = %q
    listen_client    = %q
    initial_cluster  = { %s }
    client_endpoints = [%s]
  }
}
`, sessionTTL.String(), n, peers[n], clients[i], strings.Join(initial, ", "), strings.Join(endpoints, ", "))
	}
	return blocks
}
