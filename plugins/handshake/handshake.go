// Package handshake holds what the fleetd daemon and a provider plugin must
// agree on before they speak gRPC. It is a leaf package (it imports only
// go-plugin) so both sides can depend on it without pulling in anything else.
package handshake

import plugin "github.com/hashicorp/go-plugin"

// PluginName is the name under which the provider service is dispensed.
const PluginName = "provider"

// ProtocolVersion is the provider protocol version this build speaks by
// default. It changes only on an incompatible change of the gRPC service
// (plugins/proto/provider/vN); additive changes to v1 keep it at 1.
const ProtocolVersion = 1

// SupportedVersions lists every protocol version this build can serve and
// consume, newest last. go-plugin negotiates the highest common one.
var SupportedVersions = []int{ProtocolVersion}

// HandshakeConfig is the go-plugin handshake. The magic cookie is not a
// security measure: it only stops a user from running a plugin binary by
// hand and staring at a protocol line. Changing it breaks every plugin.
var HandshakeConfig = plugin.HandshakeConfig{
	ProtocolVersion:  ProtocolVersion,
	MagicCookieKey:   "FLEETD_PLUGIN_MAGIC_COOKIE",
	MagicCookieValue: "3c9a7e1f0b6d4a58b2e4c8f71d05a9e6fleetd-provider",
}
