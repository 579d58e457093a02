package plugins

import (
	"context"
	"fmt"
	"runtime/debug"

	providerv1 "github.com/fleetd/fleetd/plugins/proto/provider/v1"
	"github.com/fleetd/fleetd/providers"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// grpcServer is the plugin side of the protocol: it serves a
// providers.Provider over gRPC.
type grpcServer struct {
	providerv1.UnimplementedProviderServer
	p      providers.Provider
	logger hclog.Logger
}

// NewGRPCServer wraps p for registration on a grpc.Server with
// providerv1.RegisterProviderServer. Serve does this for plugin authors;
// it is exported for tests and for hosts that embed the server themselves.
func NewGRPCServer(p providers.Provider) providerv1.ProviderServer {
	return newGRPCServer(p, nil)
}

func newGRPCServer(p providers.Provider, logger hclog.Logger) *grpcServer {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &grpcServer{p: p, logger: logger}
}

// recoverTo turns a provider panic into an INTERNAL status so one bad call
// fails alone instead of killing the process and every call in flight.
func (s *grpcServer) recoverTo(method string, err *error) {
	if r := recover(); r != nil {
		s.logger.Error("provider panicked", "method", method, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
		*err = status.Errorf(codes.Internal, "provider panicked in %s: %v", method, r)
	}
}

// toWire converts a provider's answer for the wire; an error, of the call
// or of the conversion, goes back as a gRPC status.
func toWire[T, P any](v T, err error, toPB func(T) (P, error)) (P, error) {
	var pb P
	if err == nil {
		pb, err = toPB(v)
	}
	if err != nil {
		var none P
		return none, errorToStatus(err)
	}
	return pb, nil
}

func (s *grpcServer) Info(ctx context.Context, _ *providerv1.InfoRequest) (resp *providerv1.InfoResponse, err error) {
	defer s.recoverTo("Info", &err)
	info, err := s.p.Info(ctx)
	if err != nil {
		return nil, errorToStatus(err)
	}
	return infoToPB(info), nil
}

func (s *grpcServer) Offerings(ctx context.Context, req *providerv1.OfferingsRequest) (resp *providerv1.OfferingsResponse, err error) {
	defer s.recoverTo("Offerings", &err)
	offs, err := s.p.Offerings(ctx, configFromPB(req.GetConfig()))
	pb, err := toWire(offs, err, offeringsToPB)
	if err != nil {
		return nil, err
	}
	return &providerv1.OfferingsResponse{Offerings: pb}, nil
}

func (s *grpcServer) Create(ctx context.Context, req *providerv1.CreateRequest) (resp *providerv1.CreateResponse, err error) {
	defer s.recoverTo("Create", &err)
	if req.GetRequest() == nil {
		return nil, errorToStatus(providers.Errorf(providers.KindInvalidConfig, "create request without a launch request"))
	}
	ins, err := s.p.Create(ctx, configFromPB(req.GetConfig()), launchFromPB(req.GetRequest()))
	pb, err := toWire(ins, err, instancesToPB)
	if err != nil {
		return nil, err
	}
	return &providerv1.CreateResponse{Instances: pb}, nil
}

func (s *grpcServer) Get(ctx context.Context, req *providerv1.GetRequest) (resp *providerv1.GetResponse, err error) {
	defer s.recoverTo("Get", &err)
	in, err := s.p.Get(ctx, configFromPB(req.GetConfig()), req.GetId())
	pb, err := toWire(in, err, instanceToPB)
	if err != nil {
		return nil, err
	}
	return &providerv1.GetResponse{Instance: pb}, nil
}

func (s *grpcServer) List(ctx context.Context, req *providerv1.ListRequest) (resp *providerv1.ListResponse, err error) {
	defer s.recoverTo("List", &err)
	ins, err := s.p.List(ctx, configFromPB(req.GetConfig()), req.GetTags())
	pb, err := toWire(ins, err, instancesToPB)
	if err != nil {
		return nil, err
	}
	return &providerv1.ListResponse{Instances: pb}, nil
}

func (s *grpcServer) Delete(ctx context.Context, req *providerv1.DeleteRequest) (resp *providerv1.DeleteResponse, err error) {
	defer s.recoverTo("Delete", &err)
	if err := s.p.Delete(ctx, configFromPB(req.GetConfig()), req.GetId()); err != nil {
		return nil, errorToStatus(err)
	}
	return &providerv1.DeleteResponse{}, nil
}

func (s *grpcServer) Interrupt(ctx context.Context, req *providerv1.InterruptRequest) (resp *providerv1.InterruptResponse, err error) {
	defer s.recoverTo("Interrupt", &err)
	ip, ok := s.p.(providers.Interrupter)
	if !ok {
		return nil, status.Error(codes.Unimplemented, fmt.Sprintf("provider %T cannot inject interruptions", s.p))
	}
	info := interruptionFromPB(req.GetInfo())
	if info == nil {
		return nil, errorToStatus(providers.Errorf(providers.KindInvalidConfig, "interrupt request without interruption info"))
	}
	if err := ip.Interrupt(ctx, configFromPB(req.GetConfig()), req.GetId(), *info); err != nil {
		return nil, errorToStatus(err)
	}
	return &providerv1.InterruptResponse{}, nil
}

func (s *grpcServer) Check(ctx context.Context, req *providerv1.CheckRequest) (resp *providerv1.CheckResponse, err error) {
	defer s.recoverTo("Check", &err)
	cp, ok := s.p.(providers.Checker)
	if !ok {
		return nil, status.Error(codes.Unimplemented, fmt.Sprintf("provider %T has no preflight check", s.p))
	}
	rs, err := cp.Check(ctx, configFromPB(req.GetConfig()), providers.CheckOptions{Quick: req.GetQuick(), TargetNodes: int(req.GetTargetNodes()), Network: req.GetNetwork(),
		FileSystems: fileSystemsFromPB(req.GetFileSystems())})
	if err != nil {
		return nil, errorToStatus(err)
	}
	return &providerv1.CheckResponse{Results: checkResultsToPB(rs)}, nil
}

func (s *grpcServer) ReleaseNetwork(ctx context.Context, req *providerv1.ReleaseNetworkRequest) (resp *providerv1.ReleaseNetworkResponse, err error) {
	defer s.recoverTo("ReleaseNetwork", &err)
	nr, ok := s.p.(providers.NetworkReleaser)
	if !ok {
		return nil, status.Error(codes.Unimplemented, fmt.Sprintf("provider %T creates no network resources", s.p))
	}
	if err := nr.ReleaseNetwork(ctx, configFromPB(req.GetConfig()), req.GetGroup()); err != nil {
		return nil, errorToStatus(err)
	}
	return &providerv1.ReleaseNetworkResponse{}, nil
}
