// Package motoserver runs moto_server (moto, the widely used AWS emulator)
// for tests: one subprocess on a free loopback port, in its own process
// group, with helpers that build real aws-sdk-go-v2 clients for it and set
// up an AWS world (VPC, subnets, security group, AMI, instance profile,
// IAM users).
//
// It is a normal package, not a _test file, so tests of providers/aws,
// fleet/… and cmd/fleetd can share it; it imports nothing of the daemon.
// StartT gives a test its own server; Shared gives a test binary one
// (its TestMain calls CloseShared).
//
// A missing moto_server is a test failure, not a skip: moto is part of
// the machine image. Set FLEETD_NO_MOTO=1 to skip moto-backed tests
// instead (StartT and Shared honour it), e.g. on a laptop without moto.
//
// Moto 5.2.1 differs from EC2 in ways tests must allow for: it ignores
// RunInstances' ClientToken; answers GetSpotPlacementScores with an HTTP
// 500 HTML page and serves no Service Quotas; reports every spot price as
// 0.00001, "Linux/UNIX (Amazon VPC)", dated 2006-01-02, whatever the
// filters; creates no spot instance request for a RunInstances spot
// launch; attaches the instance profile to the first instance of a
// multi-instance launch only; answers an unknown instance profile with
// NoSuchEntity (EC2: InvalidParameterValue); launches with unknown AMIs,
// key pairs or instance types, types a zone does not offer, a spot
// MaxPrice below the price, "aws:" tags and a subnet outside the zone
// Placement names, all of which EC2 refuses; and, once IAM is enforced,
// denies with AccessDenied (EC2: UnauthorizedOperation).
package motoserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fleetd/fleetd/internal/freeport"
)

// Binary is the executable Start runs, looked up on PATH.
const Binary = "moto_server"

// NoMotoEnv, set to 1, makes StartT and Shared skip the test instead of
// failing it when moto cannot be started.
const NoMotoEnv = "FLEETD_NO_MOTO"

// Bounds of every wait, so a wedged moto fails a test instead of hanging
// the run.
const (
	startTimeout   = 30 * time.Second
	stopTimeout    = 10 * time.Second
	requestTimeout = 10 * time.Second
	logTailBytes   = 4096
)

// Server is one running moto_server.
type Server struct {
	url  string
	dir  string
	log  string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited

	closeOnce sync.Once
	closeErr  error
}

// Start starts moto_server on a free 127.0.0.1 port and waits (at most
// 30 s, or until ctx ends) until it answers. The caller must Close it.
func Start(ctx context.Context) (*Server, error) {
	bin, err := exec.LookPath(Binary)
	if err != nil {
		return nil, fmt.Errorf("moto_server not on PATH: moto 5.x is installed for the machine image's python3; see .ci/run: %w", err)
	}
	// The port is free when picked but may be taken before moto binds it;
	// a few fresh tries make that race harmless.
	var lastErr error
	for range 3 {
		s, err := start(ctx, bin)
		if err == nil {
			return s, nil
		}
		lastErr = err
		if ctx.Err() != nil || !errors.Is(err, errPortTaken) {
			break
		}
	}
	return nil, lastErr
}

var errPortTaken = errors.New("port taken")

func start(ctx context.Context, bin string) (*Server, error) {
	port, err := freeport.Pick()
	if err != nil {
		return nil, fmt.Errorf("moto: pick a free port: %w", err)
	}
	dir, err := os.MkdirTemp("", "fleetd-moto-")
	if err != nil {
		return nil, fmt.Errorf("moto: temp dir: %w", err)
	}
	logPath := filepath.Join(dir, "moto.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("moto: log file: %w", err)
	}
	// Not exec.CommandContext: ctx bounds the start, the server outlives it.
	cmd := exec.Command(bin, "-H", "127.0.0.1", "-p", strconv.Itoa(port))
	cmd.Dir = dir // pyenv and python look for config from the working directory up
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		logFile.Close()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("moto: start %s: %w", bin, err)
	}
	logFile.Close() // the child holds its own descriptor
	s := &Server{url: "http://127.0.0.1:" + strconv.Itoa(port), dir: dir, log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(s.done)
	}()
	if err := s.waitReady(ctx); err != nil {
		tail := s.LogTail()
		_ = s.Close()
		if strings.Contains(tail, "Address already in use") {
			err = fmt.Errorf("%w: %w", errPortTaken, err)
		}
		return nil, fmt.Errorf("moto: %w; log tail:\n%s", err, tail)
	}
	return s, nil
}

// waitReady polls moto's own API until it answers 200.
func (s *Server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: time.Second}
	defer client.CloseIdleConnections()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url+"/moto-api/data.json", nil)
		if err != nil {
			return err
		}
		if resp, err := client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-s.done:
			return fmt.Errorf("moto_server exited before it answered (%v)", s.cmd.ProcessState)
		case <-ctx.Done():
			return fmt.Errorf("moto_server did not answer on %s within %v: %w", s.url, startTimeout, ctx.Err())
		case <-tick.C:
		}
	}
}

// URL is the server's endpoint, e.g. "http://127.0.0.1:40123"; every
// service (EC2, SQS, IAM, …) is served there.
func (s *Server) URL() string { return s.url }

// LogTail returns the end of moto's log (its request log and tracebacks).
func (s *Server) LogTail() string {
	b, err := os.ReadFile(s.log)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(b) > logTailBytes {
		b = b[len(b)-logTailBytes:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}

// Close kills moto's process group, waits (bounded) for it to exit and
// removes its temp dir. It is safe to call more than once.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		// The whole group: the pyenv shim execs python, but a wrapper that
		// forks must not leave a server behind either.
		if err := syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			_ = s.cmd.Process.Kill()
		}
		select {
		case <-s.done:
		case <-time.After(stopTimeout):
			s.closeErr = fmt.Errorf("moto: pid %d did not exit within %v of SIGKILL", s.cmd.Process.Pid, stopTimeout)
		}
		if err := os.RemoveAll(s.dir); err != nil && s.closeErr == nil {
			s.closeErr = fmt.Errorf("moto: remove %s: %w", s.dir, err)
		}
	})
	return s.closeErr
}

// Pid is the process id (and process group id) of moto_server.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Reset drops every resource moto holds (POST /moto-api/reset) and turns
// IAM enforcement off again, which a reset alone does not.
func (s *Server) Reset(ctx context.Context) error {
	if _, err := s.admin(ctx, "/moto-api/reset", ""); err != nil {
		return err
	}
	return s.DisableIAM(ctx)
}

// Seed seeds moto's id generator (POST /moto-api/seed?a=N): resources
// created after it get the same ids on every run.
func (s *Server) Seed(ctx context.Context, seed int) error {
	_, err := s.admin(ctx, "/moto-api/seed?a="+strconv.Itoa(seed), "")
	return err
}

// EnforceIAM switches moto's IAM enforcement on after freeActions more
// requests (POST /moto-api/reset-auth): from then on every request must be
// signed with an access key of an IAM user created in moto and is checked
// against that user's policies. A denied EC2 call answers HTTP 403 with
// code AccessDenied ("User: arn:aws:iam::123456789012:user/NAME is not
// authorized to perform: ec2:RunInstances"), also for DryRun requests;
// real EC2 says UnauthorizedOperation. An unknown key or a wrong secret
// answers HTTP 401 AuthFailure, as EC2 does. Enforcement outlives Reset's
// POST /moto-api/reset, hence DisableIAM.
func (s *Server) EnforceIAM(ctx context.Context, freeActions int) error {
	_, err := s.admin(ctx, "/moto-api/reset-auth", strconv.Itoa(freeActions))
	return err
}

// DisableIAM switches IAM enforcement off: any key is accepted again.
func (s *Server) DisableIAM(ctx context.Context) error {
	_, err := s.admin(ctx, "/moto-api/reset-auth", "inf")
	return err
}

// admin POSTs to one of moto's own endpoints.
func (s *Server) admin(ctx context.Context, path, body string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+path, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	resp, err := adminClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("moto: POST %s: %w", path, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("moto: POST %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("moto: POST %s: HTTP %d: %s", path, resp.StatusCode, bytes.TrimSpace(out))
	}
	return out, nil
}

// adminClient talks to moto directly, never through a proxy.
var adminClient = &http.Client{Transport: &http.Transport{Proxy: nil}}
