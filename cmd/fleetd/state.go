package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fleetd/fleetd/fleet/state"
)

func init() {
	register(command{name: "state", synopsis: "Export or import the daemon's state (bbolt data dir or etcd)", run: runState})
}

const stateUsage = `Usage:
  fleetd state export (-data-dir DIR | -etcd ENDPOINTS [-prefix P]) > FILE
  fleetd state import (-data-dir DIR | -etcd ENDPOINTS [-prefix P]) [-force] [FILE]

export writes every record (meta incl. the daemon id, fleets, nodes, events,
offerings) as JSON lines; import loads such a file (FILE or stdin) into an
empty store (-force replaces a non-empty one), then exports the target again
and checks that it matches the file byte for byte. Stop the daemon first: a
bbolt data dir is locked while fleetd serves it, and an import into etcd
takes several transactions.`

// defaultStatePrefix is where a clustered daemon keeps its state with the
// default cluster prefix ("/fleetd/" + "state/", see fleet/ha.go).
const defaultStatePrefix = "/fleetd/state/"

func runState(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "export" && args[0] != "import") {
		fmt.Fprintln(stderr, stateUsage)
		return exitUsage
	}
	fs := newFlagSet("state "+args[0], stderr)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, stateUsage)
		fmt.Fprintln(stderr, "\nFlags:")
		fs.PrintDefaults()
	}
	var sf stateFlags
	sf.register(fs)
	force := false
	if args[0] == "import" {
		fs.BoolVar(&force, "force", false, "replace the target's contents if it is not empty")
	}
	rest, err := parseInterleaved(fs, args[1:])
	if err != nil {
		return exitUsage
	}
	if err := sf.check(); err != nil {
		return exitCode(stderr, usageError{err})
	}
	ctx, cancel := context.WithTimeout(context.Background(), sf.timeout)
	defer cancel()
	if args[0] == "export" {
		if len(rest) != 0 {
			fs.Usage()
			return exitUsage
		}
		return exitCode(stderr, stateExport(ctx, sf, stdout, stderr))
	}
	if len(rest) > 1 {
		fs.Usage()
		return exitUsage
	}
	var in io.Reader = os.Stdin
	name := "stdin"
	if len(rest) == 1 && rest[0] != "-" {
		f, err := os.Open(rest[0])
		if err != nil {
			return exitCode(stderr, err)
		}
		defer f.Close()
		in, name = f, rest[0]
	}
	return exitCode(stderr, stateImport(ctx, sf, in, name, force, stdout))
}

// stateFlags say which store to open: a bbolt data dir or an etcd prefix.
type stateFlags struct {
	dataDir   string
	endpoints string
	prefix    string
	caFile    string
	certFile  string
	keyFile   string
	timeout   time.Duration
}

func (sf *stateFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&sf.dataDir, "data-dir", "", "the daemon's data directory (its state.db)")
	fs.StringVar(&sf.endpoints, "etcd", "", "etcd endpoints, comma-separated (e.g. http://10.0.1.5:2379,http://10.0.2.5:2379)")
	fs.StringVar(&sf.prefix, "prefix", defaultStatePrefix, "etcd key prefix of the state")
	fs.StringVar(&sf.caFile, "etcd-cacert", "", "CA bundle to verify etcd's TLS certificates")
	fs.StringVar(&sf.certFile, "etcd-cert", "", "client certificate for etcd")
	fs.StringVar(&sf.keyFile, "etcd-key", "", "client certificate key for etcd")
	fs.DurationVar(&sf.timeout, "timeout", 10*time.Minute, "give up after this long")
}

func (sf *stateFlags) check() error {
	if (sf.dataDir == "") == (sf.endpoints == "") {
		return errors.New("give exactly one of -data-dir and -etcd")
	}
	if (sf.certFile == "") != (sf.keyFile == "") {
		return errors.New("-etcd-cert and -etcd-key go together")
	}
	return nil
}

// describe names the store for messages.
func (sf *stateFlags) describe() string {
	if sf.dataDir != "" {
		return filepath.Join(sf.dataDir, "state.db")
	}
	return "etcd " + sf.endpoints + " prefix " + sf.prefix
}

// open opens the store; create allows a new bbolt file (import only: an
// export of a mistyped data dir must fail, not create an empty state).
func (sf *stateFlags) open(ctx context.Context, create bool) (state.Store, func(), error) {
	if sf.dataDir != "" {
		path := filepath.Join(sf.dataDir, "state.db")
		if _, err := os.Stat(path); err != nil && !create {
			return nil, nil, fmt.Errorf("state file: %w", err)
		}
		s, err := state.Open(path, state.Options{})
		if err != nil {
			return nil, nil, err
		}
		return s, func() { _ = s.Close() }, nil
	}
	tlsCfg, err := sf.tlsConfig()
	if err != nil {
		return nil, nil, err
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   strings.Split(sf.endpoints, ","),
		DialTimeout: 5 * time.Second,
		TLS:         tlsCfg,
		Context:     ctx,
		Logger:      zap.NewNop(), // errors reach the user through the returned error
	})
	if err != nil {
		return nil, nil, fmt.Errorf("etcd client %s: %w", sf.endpoints, err)
	}
	s, err := state.OpenEtcd(ctx, cli, state.EtcdOptions{Prefix: sf.prefix})
	if err != nil {
		_ = cli.Close()
		return nil, nil, fmt.Errorf("etcd %s: %w", sf.endpoints, err)
	}
	return s, func() { _ = s.Close(); _ = cli.Close() }, nil
}

func (sf *stateFlags) tlsConfig() (*tls.Config, error) {
	if sf.caFile == "" && sf.certFile == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if sf.caFile != "" {
		pem, err := os.ReadFile(sf.caFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: no PEM certificates", sf.caFile)
		}
	}
	if sf.certFile != "" {
		cert, err := tls.LoadX509KeyPair(sf.certFile, sf.keyFile)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

func stateExport(ctx context.Context, sf stateFlags, stdout, stderr io.Writer) error {
	s, closeFn, err := sf.open(ctx, false)
	if err != nil {
		return err
	}
	defer closeFn()
	counts, err := state.Dump(ctx, s, stdout)
	if err != nil {
		return err
	}
	// stdout is the dump; the summary goes with the diagnostics.
	fmt.Fprintf(stderr, "Exported %s from %s.\n", counts, sf.describe())
	return nil
}

func stateImport(ctx context.Context, sf stateFlags, in io.Reader, name string, force bool, stdout io.Writer) error {
	// Read whole first: the file is checked completely before anything is
	// written, and compared with the target afterwards.
	dump, err := io.ReadAll(in)
	if err != nil {
		return fmt.Errorf("read %s: %w", name, err)
	}
	// A bad file must not leave a new, empty state file behind.
	if _, err := state.CheckDump(bytes.NewReader(dump)); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	s, closeFn, err := sf.open(ctx, true)
	if err != nil {
		return err
	}
	defer closeFn()
	counts, err := state.Load(ctx, s, bytes.NewReader(dump), state.LoadOptions{Force: force})
	if err != nil {
		return err
	}
	var again bytes.Buffer
	if _, err := state.Dump(ctx, s, &again); err != nil {
		return fmt.Errorf("verify: export the target again: %w", err)
	}
	if !bytes.Equal(again.Bytes(), dump) {
		return fmt.Errorf("verify: %s now exports differently from %s (%s); import again with -force",
			sf.describe(), name, firstDifference(dump, again.Bytes()))
	}
	fmt.Fprintf(stdout, "Imported %s into %s; verified: it exports identically to %s.\n", counts, sf.describe(), name)
	return nil
}

// firstDifference names the first line where two dumps differ.
func firstDifference(want, got []byte) string {
	wl, gl := bytes.Split(want, []byte("\n")), bytes.Split(got, []byte("\n"))
	for i := range min(len(wl), len(gl)) {
		if !bytes.Equal(wl[i], gl[i]) {
			return fmt.Sprintf("first difference on line %d", i+1)
		}
	}
	return fmt.Sprintf("%d lines against %d", len(wl), len(gl))
}
