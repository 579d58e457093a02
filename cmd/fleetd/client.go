package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
)

// clientFlags are the flags every command that talks to the daemon takes.
type clientFlags struct {
	addr        string
	token       string
	fingerprint string
	caFile      string
	json        bool
}

// newClientFlagSet is the flag set of a command that talks to the daemon,
// with the client flags registered.
func newClientFlagSet(name string, stderr io.Writer) (*flag.FlagSet, *clientFlags) {
	fs := newFlagSet(name, stderr)
	cf := &clientFlags{}
	cf.register(fs)
	return fs, cf
}

func (c *clientFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.addr, "addr", envOr("FLEETD_ADDR", "http://127.0.0.1:7777"), "daemon address (FLEETD_ADDR)")
	fs.StringVar(&c.fingerprint, "ca-fingerprint", os.Getenv("FLEETD_CA_FINGERPRINT"), "pin the daemon CA by sha256 (FLEETD_CA_FINGERPRINT)")
	fs.StringVar(&c.caFile, "ca-cert", os.Getenv("FLEETD_CACERT"), "trust this CA certificate file (FLEETD_CACERT)")
	fs.BoolVar(&c.json, "json", false, "output JSON for machines")
}

func (c *clientFlags) client() (*api.Client, error) {
	opts := api.ClientOptions{Token: os.Getenv("FLEETD_TOKEN"), CAFingerprint: c.fingerprint}
	if c.caFile != "" {
		b, err := os.ReadFile(c.caFile)
		if err != nil {
			return nil, err
		}
		opts.CACertPEM = b
	}
	return api.NewClient(c.addr, opts)
}

// interruptible is the daemon's client and a context that ends on an
// interrupt (^C stops a wait); defer the stop it returns.
func (c *clientFlags) interruptible() (*api.Client, context.Context, context.CancelFunc, error) {
	cl, err := c.client()
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	return cl, ctx, stop, nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func printJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func age(d time.Duration) string {
	switch {
	case d < time.Minute:
		return d.Truncate(time.Second).String()
	case d < time.Hour:
		return d.Truncate(time.Second).String()
	case d < 48*time.Hour:
		return d.Truncate(time.Minute).String()
	}
	return (d / (24 * time.Hour) * 24 * time.Hour).String()
}

// specFlags are the flags of a command that sends one spec file to the
// daemon (check, offerings, plan, apply): the client flags, -var and
// -var-file, and exactly one FILE.
type specFlags struct {
	clientFlags
	vars     varFlag
	varFiles *varFiles
}

func (s *specFlags) register(fs *flag.FlagSet, stderr io.Writer) {
	fs.SetOutput(stderr)
	s.clientFlags.register(fs)
	s.varFiles = registerVars(fs, &s.vars)
}

// parse parses args (flags may follow FILE), reads the spec and makes the
// client. On failure it has reported the problem (usage lines for a bad
// call) and returns the exit code with ok false.
func (s *specFlags) parse(fs *flag.FlagSet, args []string, stderr io.Writer, usage ...string) (req api.ApplyRequest, c *api.Client, code int, ok bool) {
	rest, err := parseInterleaved(fs, args)
	if err != nil || len(rest) != 1 {
		for _, u := range usage {
			fmt.Fprintln(stderr, u)
		}
		return req, nil, exitUsage, false
	}
	if req, err = s.request(rest[0], stderr); err != nil {
		return req, nil, exitCode(stderr, err), false
	}
	if c, err = s.client(); err != nil {
		return req, nil, exitCode(stderr, err), false
	}
	return req, c, exitOK, true
}

// request reports the problems of the -var-files, then reads and checks
// the spec at path (specRequest).
func (s *specFlags) request(path string, stderr io.Writer) (api.ApplyRequest, error) {
	if err := s.varFiles.report(stderr); err != nil {
		return api.ApplyRequest{}, err
	}
	return specRequest(path, s.vars, stderr)
}

// printJSONLine writes v as one line of JSON: the form of a stream of
// objects (apply -wait -json, destroy -wait -json), one per line.
func printJSONLine(w io.Writer, v any) {
	_ = json.NewEncoder(w).Encode(v)
}
