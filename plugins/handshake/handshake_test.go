package handshake

import (
	"slices"
	"testing"
)

// The default version must be one we negotiate, and the list must be
// ascending so "newest last" holds for readers of SupportedVersions.
func TestVersionsAgree(t *testing.T) {
	if int(HandshakeConfig.ProtocolVersion) != ProtocolVersion {
		t.Errorf("HandshakeConfig.ProtocolVersion = %d, want %d", HandshakeConfig.ProtocolVersion, ProtocolVersion)
	}
	if !slices.Contains(SupportedVersions, ProtocolVersion) {
		t.Errorf("SupportedVersions %v lacks the default version %d", SupportedVersions, ProtocolVersion)
	}
	if !slices.IsSorted(SupportedVersions) {
		t.Errorf("SupportedVersions %v not ascending", SupportedVersions)
	}
	if HandshakeConfig.MagicCookieKey == "" || HandshakeConfig.MagicCookieValue == "" {
		t.Error("empty magic cookie: go-plugin's Serve refuses to run")
	}
}
