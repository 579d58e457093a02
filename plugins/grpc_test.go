package plugins_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"testing"
	"time"

	"github.com/fleetd/fleetd/internal/testutil"
	"github.com/fleetd/fleetd/plugins"
	providerv1 "github.com/fleetd/fleetd/plugins/proto/provider/v1"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/providertest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// serveInProcess serves p over a real loopback gRPC connection and returns
// the shim client and a raw client (to look at the wire status).
func serveInProcess(t *testing.T, p providers.Provider) (*plugins.GRPCClient, providerv1.ProviderClient, *grpc.Server) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	providerv1.RegisterProviderServer(s, plugins.NewGRPCServer(p))
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return plugins.NewGRPCClient(conn), providerv1.NewProviderClient(conn), s
}

func testCtx(t *testing.T) context.Context { return testutil.Context(t, 20*time.Second) }

func memOffering(t *testing.T) providers.Offering {
	t.Helper()
	for _, o := range providertest.MemOfferings() {
		if o.GPUs > 0 {
			return o
		}
	}
	t.Fatal("no GPU offering")
	return providers.Offering{}
}

func TestErrorsRoundTrip(t *testing.T) {
	off := memOffering(t)
	cause := errors.New("the cloud said no")
	tests := []struct {
		name     string
		err      error
		wireCode codes.Code
		is       func(error) bool
	}{
		{"capacity", &providers.Error{Kind: providers.KindCapacity, Code: "InsufficientInstanceCapacity", Offering: off.Key(), RetryAfter: 90 * time.Second, Err: cause}, codes.ResourceExhausted, providers.IsCapacity},
		{"quota", &providers.Error{Kind: providers.KindQuota, Code: "VcpuLimitExceeded", Offering: off.Key(), RetryAfter: time.Hour, Err: cause}, codes.ResourceExhausted, providers.IsQuota},
		{"not found", &providers.Error{Kind: providers.KindNotFound, Code: "InvalidInstanceID.NotFound", Err: cause}, codes.NotFound, providers.IsNotFound},
		{"invalid config", &providers.Error{Kind: providers.KindInvalidConfig, Code: "InvalidParameterValue", Err: cause}, codes.InvalidArgument, providers.IsInvalidConfig},
		{"transient", &providers.Error{Kind: providers.KindTransient, Code: "RequestLimitExceeded", RetryAfter: 2 * time.Second, Err: cause}, codes.Unavailable, providers.IsTransient},
		{"no cause", &providers.Error{Kind: providers.KindCapacity, Offering: off.Key()}, codes.ResourceExhausted, providers.IsCapacity},
		{"wrapped", fmt.Errorf("launch node-3: %w", &providers.Error{Kind: providers.KindQuota, Code: "Q", Offering: off.Key(), Err: cause}), codes.ResourceExhausted, providers.IsQuota},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mem := providertest.NewMemProvider()
			mem.SetHook(func(context.Context, providertest.Op, providers.Config) error { return tc.err })
			client, raw, _ := serveInProcess(t, mem)

			_, err := client.Create(testCtx(t), providers.Config{Fleet: "f"}, providers.LaunchRequest{Offering: off, Count: 1})
			if !tc.is(err) {
				t.Fatalf("client error %v (kind %q) does not match its kind", err, providers.KindOf(err))
			}
			var got, want *providers.Error
			errors.As(err, &got)
			errors.As(tc.err, &want)
			if got.Kind != want.Kind || got.Code != want.Code || got.Offering != want.Offering || got.RetryAfter != want.RetryAfter {
				t.Errorf("round trip: got {%s %s %s %v}, want {%s %s %s %v}",
					got.Kind, got.Code, got.Offering, got.RetryAfter, want.Kind, want.Code, want.Offering, want.RetryAfter)
			}
			if err.Error() != tc.err.Error() {
				t.Errorf("message: got %q, want %q", err.Error(), tc.err.Error())
			}
			if plugins.IsTransportError(err) {
				t.Error("a provider's own error is reported as a transport error")
			}

			_, rawErr := raw.Create(testCtx(t), &providerv1.CreateRequest{Request: &providerv1.LaunchRequest{Count: 1}})
			if c := status.Code(rawErr); c != tc.wireCode {
				t.Errorf("wire code %s, want %s", c, tc.wireCode)
			}
		})
	}
}

func TestUntypedErrorsRoundTrip(t *testing.T) {
	mem := providertest.NewMemProvider()
	mem.SetHook(func(_ context.Context, op providertest.Op, _ providers.Config) error {
		switch op {
		case providertest.OpGet:
			return errors.New("disk on fire")
		case providertest.OpList:
			panic("provider bug")
		}
		return nil
	})
	client, raw, _ := serveInProcess(t, mem)
	cfg := providers.Config{Fleet: "f"}

	_, err := client.Get(testCtx(t), cfg, "x")
	if err == nil || err.Error() != "disk on fire" || providers.KindOf(err) != "" {
		t.Errorf("plain error: got %v (kind %q), want \"disk on fire\" untyped", err, providers.KindOf(err))
	}
	if _, rawErr := raw.Get(testCtx(t), &providerv1.GetRequest{Id: "x"}); status.Code(rawErr) != codes.Unknown {
		t.Errorf("plain error wire code %s, want Unknown", status.Code(rawErr))
	}

	_, err = client.List(testCtx(t), cfg, nil)
	if err == nil || plugins.IsTransportError(err) {
		t.Fatalf("panicking provider: %v, want an ordinary error", err)
	}
	// The panic failed one call, not the server.
	if _, err := client.Offerings(testCtx(t), cfg); err != nil {
		t.Errorf("call after a provider panic: %v", err)
	}
}

// noInterrupt hides MemProvider's Interrupt method.
type noInterrupt struct{ providers.Provider }

func TestInterruptUnsupported(t *testing.T) {
	client, raw, _ := serveInProcess(t, noInterrupt{providertest.NewMemProvider()})
	err := client.Interrupt(testCtx(t), providers.Config{}, "x", providers.InterruptionInfo{Kind: "preempted"})
	if !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Interrupt on a provider without it: %v, want errors.ErrUnsupported", err)
	}
	_, rawErr := raw.Interrupt(testCtx(t), &providerv1.InterruptRequest{Id: "x", Info: &providerv1.InterruptionInfo{Kind: "preempted"}})
	if status.Code(rawErr) != codes.Unimplemented {
		t.Errorf("wire code %s, want Unimplemented", status.Code(rawErr))
	}

	// And with a provider that has it, the notice arrives.
	mem := providertest.NewMemProvider()
	client, _, _ = serveInProcess(t, mem)
	ins, err := client.Create(testCtx(t), providers.Config{}, providers.LaunchRequest{Offering: memOffering(t), Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	if err := client.Interrupt(testCtx(t), providers.Config{}, ins[0].ID, providers.InterruptionInfo{Kind: "preempted", Deadline: deadline}); err != nil {
		t.Fatalf("Interrupt: %v", err)
	}
	got, err := mem.Get(testCtx(t), providers.Config{}, ins[0].ID)
	if err != nil || got.Interruption == nil || got.Interruption.Kind != "preempted" || !got.Interruption.Deadline.Equal(deadline) {
		t.Errorf("after Interrupt: %+v, %v", got.Interruption, err)
	}
}

func TestValuesRoundTrip(t *testing.T) {
	mem := providertest.NewMemProvider()
	client, _, _ := serveInProcess(t, mem)
	cfg := providers.Config{Fleet: "f", Raw: []byte(`{"quota_gpus": 64}`)}

	info, err := client.Info(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	wantInfo, _ := mem.Info(testCtx(t))
	if info.Name != wantInfo.Name || info.NoticeLead != wantInfo.NoticeLead || len(info.Schema.Attributes) != len(wantInfo.Schema.Attributes) {
		t.Errorf("Info: got %+v, want %+v", info, wantInfo)
	}
	for i, a := range info.Schema.Attributes {
		if a != wantInfo.Schema.Attributes[i] {
			t.Errorf("attribute %d: got %+v, want %+v", i, a, wantInfo.Schema.Attributes[i])
		}
	}

	offs, err := client.Offerings(testCtx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	wantOffs, _ := mem.Offerings(testCtx(t), cfg)
	if len(offs) != len(wantOffs) {
		t.Fatalf("%d offerings, want %d", len(offs), len(wantOffs))
	}
	for i := range offs {
		if offs[i] != wantOffs[i] {
			t.Errorf("offering %d: got %+v, want %+v", i, offs[i], wantOffs[i])
		}
	}

	req := providers.LaunchRequest{Offering: memOffering(t), Count: 2, UserData: "#cloud-config\n", Tags: map[string]string{"a": "1", providers.TagFleet: "f"}, IdempotencyToken: "tok"}
	ins, err := client.Create(testCtx(t), cfg, req)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range ins {
		direct, err := mem.Get(testCtx(t), cfg, in.ID)
		if err != nil {
			t.Fatal(err)
		}
		if in.ID != direct.ID || in.Offering != direct.Offering || in.State != direct.State || !in.LaunchedAt.Equal(direct.LaunchedAt) ||
			len(in.Tags) != len(direct.Tags) || in.Tags["a"] != "1" || in.Interruption != nil {
			t.Errorf("instance over gRPC %+v, in process %+v", in, direct)
		}
	}
}

// TestContextCrossesTheWire: a provider call blocked in the server sees the
// client's cancellation and deadline.
func TestContextCrossesTheWire(t *testing.T) {
	mem := providertest.NewMemProvider()
	entered := make(chan struct{}, 1)
	observed := make(chan error, 1)
	deadlines := make(chan time.Time, 1)
	mem.SetHook(func(ctx context.Context, op providertest.Op, _ providers.Config) error {
		switch op {
		case providertest.OpCreate:
			entered <- struct{}{}
			<-ctx.Done()
			observed <- ctx.Err()
			return ctx.Err()
		case providertest.OpList:
			d, _ := ctx.Deadline()
			deadlines <- d
		}
		return nil
	})
	client, _, _ := serveInProcess(t, mem)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	result := make(chan error, 1)
	go func() {
		_, err := client.Create(ctx, providers.Config{}, providers.LaunchRequest{Offering: memOffering(t), Count: 1})
		result <- err
	}()
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("Create never reached the provider")
	}
	cancel()
	select {
	case err := <-observed:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("provider observed %v, want context.Canceled", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the provider never observed the cancellation")
	}
	if err := <-result; !errors.Is(err, context.Canceled) {
		t.Errorf("client got %v, want context.Canceled", err)
	}

	want := time.Now().Add(time.Hour)
	dctx, dcancel := context.WithDeadline(context.Background(), want)
	defer dcancel()
	if _, err := client.List(dctx, providers.Config{}, nil); err != nil {
		t.Fatal(err)
	}
	got := <-deadlines
	if diff := got.Sub(want); diff < -time.Minute || diff > time.Minute {
		t.Errorf("server deadline %v, want about %v", got, want)
	}
}

func TestStoppedServerIsTransportError(t *testing.T) {
	client, _, s := serveInProcess(t, providertest.NewMemProvider())
	if _, err := client.Info(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	_, err := client.Info(testCtx(t))
	if !plugins.IsTransportError(err) || !providers.IsTransient(err) {
		t.Errorf("call to a stopped server: %v, want a transport error of kind transient", err)
	}
}

// checking adds a scripted preflight and a placement score to a provider.
type checking struct {
	providers.Provider
	got providers.CheckOptions
}

func (c *checking) Offerings(ctx context.Context, cfg providers.Config) ([]providers.Offering, error) {
	offs, err := c.Provider.Offerings(ctx, cfg)
	for i := range offs {
		offs[i].PlacementScore, offs[i].PlacementScoreNote = 7, "n"
		offs[i].Arch, offs[i].PriceSource, offs[i].PriceAsOf = "arm64", "price list", time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	}
	return offs, err
}

func (c *checking) Check(ctx context.Context, cfg providers.Config, opts providers.CheckOptions) ([]providers.CheckResult, error) {
	c.got = opts
	return []providers.CheckResult{
		{Check: "credentials", Status: providers.CheckOK, Detail: "env"},
		{Check: "image", Scope: "us-east-1", Status: providers.CheckFailed, Detail: "ami-1 not found", Fix: "set image"},
		{Check: "quota", Status: providers.CheckUnavailable, Detail: "not served"},
	}, nil
}

func TestCheckAndScoresOverGRPC(t *testing.T) {
	client, _, _ := serveInProcess(t, noInterrupt{providertest.NewMemProvider()})
	if _, err := client.Check(testCtx(t), providers.Config{}, providers.CheckOptions{}); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Check on a provider without it: %v, want errors.ErrUnsupported", err)
	}
	cp := &checking{Provider: providertest.NewMemProvider()}
	client, _, _ = serveInProcess(t, cp)
	opts := providers.CheckOptions{Quick: true, TargetNodes: 5, Network: true, FileSystems: []providers.FileSystemCheck{
		{Source: "fsx://fs-0123456789abcdef0", Scheme: "fsx", Host: "fs-0123456789abcdef0", Region: "us-east-1", Zone: "us-east-1a", Zones: []string{"us-east-1a"}},
		{Source: "filestore://10.0.0.2/share", Scheme: "filestore", Host: "10.0.0.2", Path: "/share", Region: "us-central1"},
	}}
	rs, err := client.Check(testCtx(t), providers.Config{}, opts)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cp.got, opts) {
		t.Errorf("options arrived as %+v, want %+v", cp.got, opts)
	}
	want, _ := cp.Check(testCtx(t), providers.Config{}, providers.CheckOptions{})
	if !reflect.DeepEqual(rs, want) {
		t.Errorf("results over gRPC %+v, want %+v", rs, want)
	}
	offs, err := client.Offerings(testCtx(t), providers.Config{})
	if err != nil || len(offs) == 0 || offs[0].PlacementScore != 7 || offs[0].PlacementScoreNote != "n" ||
		offs[0].Arch != "arm64" || offs[0].PriceSource != "price list" || !offs[0].PriceAsOf.Equal(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("placement score over gRPC: %+v, %v", offs, err)
	}
}
