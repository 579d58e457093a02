package gcp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/fleetd/fleetd/providers"
	"golang.org/x/oauth2"
	"google.golang.org/api/googleapi"
)

// class is what a Compute Engine error code means to fleetd.
type class int

const (
	classOther class = iota
	classInvalid
	classTransient
	classQuota
	classCapacity
	classExists
	classNotFound
	classAuth // credentials missing, expired or rejected
)

// classify maps one code: an operation's error.errors[].code (async) or a
// googleapi error's errors[].reason (sync). See
// /work/shared/reference/interruption.md §6.2 for the codes' meaning.
func classify(code string) class {
	switch code {
	case "ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
		"REGION_RESOURCE_POOL_EXHAUSTED", "REGION_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
		"RESOURCE_POOL_EXHAUSTED", "insufficientCapacity":
		return classCapacity
	case "QUOTA_EXCEEDED", "quotaExceeded":
		return classQuota
	case "rateLimitExceeded", "userRateLimitExceeded", "RESOURCE_OPERATION_RATE_EXCEEDED",
		"backendError", "internalError", "RESOURCE_NOT_READY", "serviceUnavailable":
		return classTransient
	case "alreadyExists", "RESOURCE_ALREADY_EXISTS":
		return classExists
	case "notFound", "RESOURCE_NOT_FOUND":
		return classNotFound
	case "authError", "UNAUTHENTICATED", "unauthorized":
		return classAuth
	case "invalid", "badRequest", "required", "invalidParameter", "parseError",
		"INVALID_FIELD_VALUE", "INVALID_USAGE", "forbidden", "accessNotConfigured",
		"insufficientPermissions", "PERMISSIONS_ERROR":
		return classInvalid
	}
	return classOther
}

// worst picks the class that matters most when an error carries several
// codes: capacity and quota decide placement, so they win.
func worst(a, b class) class {
	rank := map[class]int{classOther: 0, classInvalid: 1, classTransient: 2, classNotFound: 3, classExists: 4, classAuth: 5, classQuota: 6, classCapacity: 7}
	if rank[b] > rank[a] {
		return b
	}
	return a
}

func kindOf(c class) providers.ErrorKind {
	switch c {
	case classCapacity:
		return providers.KindCapacity
	case classQuota:
		return providers.KindQuota
	case classTransient:
		return providers.KindTransient
	case classNotFound:
		return providers.KindNotFound
	case classInvalid:
		return providers.KindInvalidConfig
	case classAuth:
		return providers.KindAuth
	}
	return ""
}

// apiErr is a classified synchronous API error.
type apiErr struct {
	class class
	code  string
	err   error
}

// classifyAPI classifies an error returned by a client call. Context
// errors and errors without a googleapi.Error (transport failures) are
// left to the caller.
func classifyAPI(err error) (apiErr, bool) {
	var ge *googleapi.Error
	if !errors.As(err, &ge) {
		return apiErr{}, false
	}
	out := apiErr{err: err}
	for _, it := range ge.Errors {
		if c := classify(it.Reason); out.code == "" || worst(out.class, c) != out.class {
			out.class, out.code = c, it.Reason
		}
	}
	// Quota errors sometimes come with a generic reason; the message names
	// the quota metric ("Quota 'GPUS_ALL_REGIONS' exceeded").
	if out.class != classQuota && strings.Contains(ge.Message, "Quota '") && strings.Contains(ge.Message, "exceeded") {
		out.class, out.code = classQuota, "QUOTA_EXCEEDED"
	}
	if out.class == classOther || out.class == classInvalid {
		switch {
		case ge.Code == http.StatusTooManyRequests || ge.Code >= 500:
			out.class = classTransient
		case ge.Code == http.StatusNotFound:
			out.class = classNotFound
		case ge.Code == http.StatusConflict && out.class == classOther:
			out.class = classExists
		case ge.Code == http.StatusUnauthorized:
			// 401 is the credentials (403 is a permission they lack).
			out.class = classAuth
		case ge.Code == http.StatusBadRequest || ge.Code == http.StatusForbidden:
			out.class = classInvalid
		}
	}
	if out.code == "" {
		out.code = fmt.Sprintf("HTTP %d", ge.Code)
	}
	return out, true
}

// mapErr turns a client error into a typed provider error. what names the
// call for the message; off, when set, is the offering the call was about.
// A 404 becomes notFound; callers that mean something else by it (Delete,
// Create) check IsNotFound first.
func mapErr(err error, what, off string) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("gcp: %s: %w", what, err)
	}
	a, ok := classifyAPI(err)
	var re *oauth2.RetrieveError
	if !ok && (errors.As(err, &re) || strings.Contains(err.Error(), "could not find default credentials")) {
		// The request was never sent: no credentials were found, or the
		// token endpoint refused them (revoked key, expired refresh token).
		return &providers.Error{Kind: providers.KindAuth, Code: "NoCredentials", Offering: off, Err: fmt.Errorf("gcp: %s: %w", what, err)}
	}
	if !ok {
		// No API answer at all (connection refused, reset, DNS): retry.
		return &providers.Error{Kind: providers.KindTransient, Code: "Unreachable", Offering: off, Err: fmt.Errorf("gcp: %s: %w", what, err)}
	}
	kind := kindOf(a.class)
	if a.class == classExists {
		kind = providers.KindInvalidConfig
	}
	if kind == "" {
		return fmt.Errorf("gcp: %s: %w", what, err)
	}
	return &providers.Error{Kind: kind, Code: a.code, Offering: off, Err: fmt.Errorf("gcp: %s: %w", what, err)}
}

// opFailure classifies a DONE operation's error block.
func opFailure(op *computepb.Operation) (class, string, error) {
	items := op.GetError().GetErrors()
	if len(items) == 0 {
		return classOther, "", nil
	}
	var (
		cls  = classOther
		code string
		msgs []string
	)
	for _, it := range items {
		if c := classify(it.GetCode()); code == "" || worst(cls, c) != cls {
			cls, code = c, it.GetCode()
		}
		msgs = append(msgs, it.GetCode()+": "+it.GetMessage())
	}
	return cls, code, fmt.Errorf("operation %s (%s) failed: %s", op.GetName(), op.GetOperationType(), strings.Join(msgs, "; "))
}

// opErr is the typed error of a failed launch operation.
func opErr(cls class, code string, err error, off string) error {
	kind := kindOf(cls)
	switch cls {
	case classNotFound:
		// A missing image, network or subnetwork: the block is wrong.
		kind = providers.KindInvalidConfig
	case classOther, classExists:
		return fmt.Errorf("gcp: %w", err)
	}
	return &providers.Error{Kind: kind, Code: code, Offering: off, Err: fmt.Errorf("gcp: %w", err)}
}
