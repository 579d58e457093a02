# fleetd daemon configuration (fleetd serve -config configs/daemon.hcl).
# Every attribute is optional; the values below are the defaults unless noted.

listen   = "127.0.0.1:7777"      # API address; loopback unless you mean to expose it

# advertise_url is the URL the agents on nodes (and the other servers of a
# cluster) reach the daemon at; it goes into every node's cloud-init
# user-data. Default: derived from listen, so with the loopback default only
# the local and sim providers' nodes (processes on this machine) can reach
# it: `fleetd serve` warns at start, and refuses to plan or apply fleets on
# aws, gcp or external providers until it is set. For cloud nodes, listen on
# the network the VMs share with this host and advertise an address they can
# route to (a private IP or DNS name; with tls {} its host is added to the
# server certificate):
# listen        = "0.0.0.0:7777"
# advertise_url = "https://10.0.1.5:7777"

data_dir = "/var/lib/fleetd"      # state.db, token, CA; created 0700
# token_file = "/var/lib/fleetd/token"   # admin token, generated 0600 on first start
plugin_dir   = "/usr/lib/fleetd/plugins" # external providers: fleetd-provider-NAME
# Agent binaries nodes download, by their offering's architecture: fleetd-linux-amd64 and
# fleetd-linux-arm64 (`make release` builds both into dist/). Unset: the directory of this
# executable, then <data_dir>/agents; the daemon's own executable serves its own platform.
# A fleet whose instance types all need a missing one is refused at plan.
# agent_dir = "/usr/local/lib/fleetd/agents"
orphan_grace = "5m"               # instances tagged for us but unknown are terminated after this
log_level    = "info"

# TLS with a CA the daemon generates on first start (data_dir/ca.pem);
# agents pin its fingerprint, the CLI uses FLEETD_CA_FINGERPRINT or -ca-cert.
tls {
  hosts = ["fleetd.internal"]     # extra names for the server certificate
}

# The goodput autoscaler (docs/autoscale.md) sizes fleets without
# desired_nodes by the throughput their workers report; these are its defaults:
# autoscale {
#   measure_for         = "1m"  # throughput measured before a new size is judged
#   min_interval        = "3m"  # least time between two size changes of a fleet
#   marginal_efficiency = 0.5   # a larger size must add at least this share of the progress its cost would buy
# }

# External provider plugins must be pinned by checksum:
# plugin "oci" {
#   sha256 = "<64 hex characters of sha256sum fleetd-provider-oci>"
# }
