// Package providerv1 is the Go code generated from provider.proto, the
// provider plugin protocol's version 1 (`make proto` regenerates it;
// TestGeneratedCodeIsCurrent checks it is current). Provider authors use
// it through package plugins, which carries providers.Provider over it;
// docs/plugins.md describes the protocol.
package providerv1
