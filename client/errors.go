package client

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Sentinel errors. Every error a call returns wraps one of them, so
// routers write errors.Is(err, client.ErrUnavailable); the *Error carrying
// the gRPC status is reachable with errors.As, except for a call on a
// Client already closed, which never reaches gRPC and returns ErrClosed
// itself.
var (
	// ErrUnavailable: no indexd replica could answer (none reachable, or
	// none has loaded its first snapshot yet). Already retried.
	ErrUnavailable = errors.New("kvindex client: unavailable")
	// ErrInvalidArgument: the request broke the API's rules or a server
	// limit; the message names it. Retrying the same request cannot help.
	ErrInvalidArgument = errors.New("kvindex client: invalid argument")
	// ErrResourceExhausted: the replica refused the call for a limit on
	// concurrent work (too many Lookups waiting on a barrier) or on message
	// size; the message names the limit. Not retried: retry later, or with
	// a smaller request.
	ErrResourceExhausted = errors.New("kvindex client: resource exhausted")
	// ErrDeadlineExceeded: the call's deadline passed, or a barrier was not
	// met in time (the message names the lagging partition).
	ErrDeadlineExceeded = errors.New("kvindex client: deadline exceeded")
	// ErrCanceled: the caller's context was cancelled.
	ErrCanceled = errors.New("kvindex client: canceled")
	// ErrInternal: any other failure (a server bug, a protocol error).
	ErrInternal = errors.New("kvindex client: internal error")
	// ErrClosed: the Client was closed.
	ErrClosed = errors.New("kvindex client: closed")
)

// Error is a failed call: the RPC, the gRPC status code and message, and
// the sentinel it maps to (Unwrap).
type Error struct {
	// Method is the RPC ("Lookup", "ListEndpoints").
	Method string
	// Code and Message are the gRPC status.
	Code    codes.Code
	Message string

	sentinel error
}

// Error renders "kvindex METHOD: CODE: message".
func (e *Error) Error() string {
	return fmt.Sprintf("kvindex %s: %s: %s", e.Method, e.Code, e.Message)
}

// Unwrap returns the sentinel for the code.
func (e *Error) Unwrap() error { return e.sentinel }

// GRPCStatus returns the status, so status.FromError works on an *Error.
func (e *Error) GRPCStatus() *status.Status { return status.New(e.Code, e.Message) }

// callError maps an RPC error to an *Error wrapping the sentinel of its
// code: the one place that maps codes back.
func callError(method string, err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		st = status.FromContextError(err)
	}
	var sentinel error
	switch st.Code() {
	case codes.Unavailable:
		sentinel = ErrUnavailable
	case codes.InvalidArgument:
		sentinel = ErrInvalidArgument
	case codes.ResourceExhausted:
		sentinel = ErrResourceExhausted
	case codes.DeadlineExceeded:
		sentinel = ErrDeadlineExceeded
	case codes.Canceled:
		sentinel = ErrCanceled
	default:
		sentinel = ErrInternal
	}
	if errors.Is(err, context.Canceled) {
		sentinel = ErrCanceled
	}
	return &Error{Method: method, Code: st.Code(), Message: st.Message(), sentinel: sentinel}
}

// invalidArgument is a call the client refuses before sending it: an
// *Error with code INVALID_ARGUMENT wrapping ErrInvalidArgument, as the
// server's own refusal would be.
func invalidArgument(method, format string, args ...any) error {
	return &Error{Method: method, Code: codes.InvalidArgument, Message: fmt.Sprintf(format, args...), sentinel: ErrInvalidArgument}
}
