package plugins

import (
	"context"
	"errors"
	"fmt"

	providerv1 "github.com/fleetd/fleetd/plugins/proto/provider/v1"
	"github.com/fleetd/fleetd/providers"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Typed provider errors cross the plugin boundary as a gRPC status whose
// code says roughly what happened and whose ErrorDetail says exactly:
//
//	providers kind         gRPC code            detail
//	insufficient-capacity  RESOURCE_EXHAUSTED   ErrorDetail{kind, code, offering, retry_after}
//	quota                  RESOURCE_EXHAUSTED   ErrorDetail{kind, code, offering, retry_after}
//	not-found              NOT_FOUND            ErrorDetail
//	invalid-config         INVALID_ARGUMENT     ErrorDetail
//	transient              UNAVAILABLE          ErrorDetail
//	context.Canceled       CANCELLED            -
//	context.DeadlineExc.   DEADLINE_EXCEEDED    -
//	errors.ErrUnsupported  UNIMPLEMENTED        -
//	anything else          UNKNOWN              -
//
// A plugin not written in Go may omit the detail; the client then derives
// the kind from the code alone (RESOURCE_EXHAUSTED → capacity).

// TransportError reports that the plugin process could not be reached: it
// died, or the connection to it broke. It is distinct from a provider's own
// transient error (which carries an ErrorDetail) because only a transport
// failure justifies restarting the plugin process.
type TransportError struct {
	Method string
	Err    error
}

func (e *TransportError) Error() string {
	return fmt.Sprintf("provider plugin unreachable during %s: %v", e.Method, e.Err)
}

func (e *TransportError) Unwrap() error { return e.Err }

// IsTransportError reports whether err is (or wraps) a TransportError.
func IsTransportError(err error) bool {
	var te *TransportError
	return errors.As(err, &te)
}

// CodePluginUnavailable is the providers.Error Code of a transport failure;
// the error's Kind is transient so callers back off as for a throttled cloud.
const CodePluginUnavailable = "PluginUnavailable"

func kindToCode(k providers.ErrorKind) codes.Code {
	switch k {
	case providers.KindCapacity, providers.KindQuota:
		return codes.ResourceExhausted
	case providers.KindNotFound:
		return codes.NotFound
	case providers.KindInvalidConfig:
		return codes.InvalidArgument
	case providers.KindTransient:
		return codes.Unavailable
	case providers.KindAuth:
		return codes.Unauthenticated
	}
	return codes.Unknown
}

// errorToStatus is the server side: it turns whatever the provider
// returned into a gRPC status error.
func errorToStatus(err error) error {
	if err == nil {
		return nil
	}
	var pe *providers.Error
	if errors.As(err, &pe) {
		st := status.New(kindToCode(pe.Kind), err.Error())
		detail := &providerv1.ErrorDetail{
			Kind:       string(pe.Kind),
			Code:       pe.Code,
			Offering:   pe.Offering,
			RetryAfter: durationToPB(pe.RetryAfter),
		}
		if pe.Err != nil {
			detail.Message = pe.Err.Error()
		}
		if withDetail, derr := st.WithDetails(detail); derr == nil {
			st = withDetail
		}
		return st.Err()
	}
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, errors.ErrUnsupported):
		return status.Error(codes.Unimplemented, err.Error())
	}
	return status.Error(codes.Unknown, err.Error())
}

// remoteError keeps the full message the provider produced (which may have
// context wrapped around the typed error) while unwrapping to the typed error.
type remoteError struct {
	msg string
	err *providers.Error
}

func (r *remoteError) Error() string { return r.msg }
func (r *remoteError) Unwrap() error { return r.err }

// statusToError is the client side: it turns a failed RPC back into the
// error the provider returned, or into a context or transport error.
func statusToError(ctx context.Context, method string, err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	for _, d := range st.Details() {
		if ed, ok := d.(*providerv1.ErrorDetail); ok {
			pe := &providers.Error{
				Kind:       providers.ErrorKind(ed.GetKind()),
				Code:       ed.GetCode(),
				Offering:   ed.GetOffering(),
				RetryAfter: durationFromPB(ed.GetRetryAfter()),
			}
			if ed.GetMessage() != "" {
				pe.Err = errors.New(ed.GetMessage())
			}
			if st.Message() != "" && st.Message() != pe.Error() {
				return &remoteError{msg: st.Message(), err: pe}
			}
			return pe
		}
	}
	msg := st.Message()
	switch st.Code() {
	case codes.Canceled, codes.DeadlineExceeded:
		if ctxErr := ctx.Err(); ctxErr != nil {
			return fmt.Errorf("provider plugin %s: %w", method, ctxErr)
		}
		if st.Code() == codes.DeadlineExceeded {
			// The provider's own deadline ran out, not the caller's.
			return providers.Transient(fmt.Errorf("%s: %w", msg, context.DeadlineExceeded))
		}
		// Our context is live, so the connection was closed under us.
		return transportError(method, err)
	case codes.Unavailable:
		return transportError(method, err)
	case codes.Unimplemented:
		return fmt.Errorf("provider plugin does not implement %s (%s): %w", method, msg, errors.ErrUnsupported)
	case codes.NotFound:
		return providers.NotFound(errors.New(msg))
	case codes.InvalidArgument:
		return providers.InvalidConfig(errors.New(msg))
	case codes.ResourceExhausted:
		return providers.InsufficientCapacity(errors.New(msg))
	case codes.Unknown:
		return errors.New(msg)
	}
	return fmt.Errorf("provider plugin %s: %s: %s", method, st.Code(), msg)
}

func transportError(method string, err error) error {
	return &providers.Error{Kind: providers.KindTransient, Code: CodePluginUnavailable, Err: &TransportError{Method: method, Err: err}}
}
