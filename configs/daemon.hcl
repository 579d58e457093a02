# fleetd daemon configuration (fleetd serve -config configs/daemon.hcl).
# Every attribute is optional; the values below are the defaults unless noted.

listen   = "127.0.0.1:7777"      # API address; loopback unless you mean to expose it
data_dir = "/var/lib/fleetd"      # state.db, token, CA; created 0700
# token_file = "/var/lib/fleetd/token"   # admin token, generated 0600 on first start
plugin_dir   = "/usr/lib/fleetd/plugins" # external providers: fleetd-provider-NAME
orphan_grace = "5m"               # instances tagged for us but unknown are terminated after this
log_level    = "info"

# TLS with a CA the daemon generates on first start (data_dir/ca.pem);
# agents pin its fingerprint, the CLI uses FLEETD_CA_FINGERPRINT or -ca-cert.
tls {
  hosts = ["fleetd.internal"]     # extra names for the server certificate
}

# External provider plugins must be pinned by checksum:
# plugin "oci" {
#   sha256 = "<64 hex characters of sha256sum fleetd-provider-oci>"
# }
