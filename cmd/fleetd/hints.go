package main

import (
	"crypto/x509"
	"errors"
	"syscall"
)

// errorHint is a line on what to do about a CLI error whose message names
// only the symptom: no daemon listening, or a daemon certificate the CLI
// does not trust. "" when there is nothing to add.
func errorHint(err error) string {
	var ua x509.UnknownAuthorityError
	var cv *x509.CertificateInvalidError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "no daemon is listening there. Start one with `fleetd serve` (or `fleetd serve -dev` to try fleetd), " +
			"or point the CLI at yours with FLEETD_ADDR=https://HOST:7777 or -addr."
	case errors.As(err, &ua):
		return "the daemon's certificate is signed by its own CA. Trust it with -ca-cert FILE (FLEETD_CACERT; " +
			"serve prints where ca.pem is) or pin it with -ca-fingerprint SHA256 (FLEETD_CA_FINGERPRINT)."
	case errors.As(err, &cv) && cv.Reason == x509.Expired:
		return "the daemon's certificate has expired: restart `fleetd serve` to renew it, or check this machine's clock."
	}
	return ""
}
