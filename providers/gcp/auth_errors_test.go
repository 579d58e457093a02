package gcp

import (
	"errors"
	"net/http"
	"testing"

	"golang.org/x/oauth2"
	"google.golang.org/api/googleapi"

	"github.com/fleetd/fleetd/providers"
)

// TestCredentialErrorsAreAuth: missing, expired or rejected credentials are
// KindAuth (plan fails on them), not transient or a block error.
func TestCredentialErrorsAreAuth(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want providers.ErrorKind
	}{
		{"401", &googleapi.Error{Code: http.StatusUnauthorized, Message: "Request had invalid authentication credentials.",
			Errors: []googleapi.ErrorItem{{Reason: "authError"}}}, providers.KindAuth},
		{"401 without a reason", &googleapi.Error{Code: http.StatusUnauthorized}, providers.KindAuth},
		{"token endpoint refused", &oauth2.RetrieveError{Response: &http.Response{StatusCode: 400}, ErrorCode: "invalid_grant"}, providers.KindAuth},
		{"no credentials", errors.New("google: could not find default credentials. See https://cloud.google.com/docs/authentication/external/set-up-adc"), providers.KindAuth},
		{"403 is a permission", &googleapi.Error{Code: http.StatusForbidden, Errors: []googleapi.ErrorItem{{Reason: "forbidden"}}}, providers.KindInvalidConfig},
		{"connection refused stays transient", errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), providers.KindTransient},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := providers.KindOf(mapErr(tc.err, "list machine types", "")); got != tc.want {
				t.Errorf("kind %q, want %q", got, tc.want)
			}
		})
	}
}
