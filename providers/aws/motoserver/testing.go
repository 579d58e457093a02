package motoserver

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// skipped reports whether FLEETD_NO_MOTO=1 asks to skip moto-backed tests.
func skipped() bool { return os.Getenv(NoMotoEnv) == "1" }

// StartT starts a server for one test and closes it when the test ends.
// It fails the test when moto cannot be started, and skips it instead
// when FLEETD_NO_MOTO=1.
func StartT(t testing.TB) *Server {
	t.Helper()
	if skipped() {
		t.Skip(NoMotoEnv + "=1: skipping a test against moto_server")
	}
	s, err := Start(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

// shared is the one server of a test binary, see Shared.
var shared struct {
	mu  sync.Mutex
	srv *Server
	err error
}

// Shared returns the test binary's one server, started by the first call
// (a moto start takes a couple of seconds; share it rather than start one
// per test). Tests sharing it must not assume an empty world: scope every
// lookup by tags or ids of their own. A start failure fails this and every
// later caller; FLEETD_NO_MOTO=1 skips them. The package's TestMain must
// call CloseShared after m.Run; should it not run (a test timeout's
// panic), Linux still kills moto with the test binary.
func Shared(t testing.TB) *Server {
	t.Helper()
	if skipped() {
		t.Skip(NoMotoEnv + "=1: skipping a test against moto_server")
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.srv == nil && shared.err == nil {
		// Not t.Context(): the server outlives the test that starts it.
		shared.srv, shared.err = Start(context.Background())
	}
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.srv
}

// CloseShared stops the server Shared started, if any.
func CloseShared() error {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.srv == nil {
		return nil
	}
	err := shared.srv.Close()
	shared.srv, shared.err = nil, nil
	return err
}

// UseStaticKeys points the AWS SDK's default credential chain at the
// server's static test key for the rest of the test: the key in the
// environment, no session token, profile or shared files to fall back on.
func UseStaticKeys(t testing.TB) {
	t.Setenv("AWS_ACCESS_KEY_ID", AccessKeyID)
	t.Setenv("AWS_SECRET_ACCESS_KEY", SecretAccessKey)
	t.Setenv("AWS_SESSION_TOKEN", "")
	t.Setenv("AWS_PROFILE", "")
	none := filepath.Join(t.TempDir(), "none")
	t.Setenv("AWS_CONFIG_FILE", none)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", none)
}
