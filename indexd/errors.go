package indexd

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Sentinel errors; wrapped with detail, test them with errors.Is. The gRPC
// edge maps them to status codes in one place (toStatus).
var (
	// ErrInvalidConfig reports a Config that Validate rejects.
	ErrInvalidConfig = errors.New("indexd: invalid config")
	// ErrNotReady reports a call made before the first list of etcd has
	// been applied (gRPC UNAVAILABLE).
	ErrNotReady = errors.New("indexd: index not loaded yet")
	// ErrInvalidArgument reports a request outside the API's rules or the
	// configured limits; the message names the field and the limit (gRPC
	// INVALID_ARGUMENT).
	ErrInvalidArgument = errors.New("indexd: invalid argument")
	// ErrBarrierTimeout reports a read-your-events barrier that was not met
	// in time; the message names the lagging partition (gRPC
	// DEADLINE_EXCEEDED).
	ErrBarrierTimeout = errors.New("indexd: barrier not met")
	// ErrTooManyWaiters reports a Lookup whose barrier would have to wait
	// while Config.MaxBarrierWaiters Lookups already do; the message names
	// the limit and its flag (gRPC RESOURCE_EXHAUSTED).
	ErrTooManyWaiters = errors.New("indexd: too many Lookups waiting on a barrier")
	// ErrOverloaded reports a Lookup refused because the Lookups being
	// answered already hold Config.MaxInFlightBlocks blocks; the message
	// names the limit and its flag (gRPC RESOURCE_EXHAUSTED). Retry later,
	// or on another replica.
	ErrOverloaded = errors.New("indexd: too much Lookup work in flight")
	// ErrStale reports, from Ready, a replica whose last progress from etcd
	// is older than Config.MaxStaleness.
	ErrStale = errors.New("indexd: index is stale")
	// ErrStopping reports a Lookup whose barrier was still waiting when the
	// replica began to shut down (gRPC UNAVAILABLE): the client retries it
	// on another replica instead of the shutdown waiting out the barrier.
	ErrStopping = errors.New("indexd: shutting down")
)

// toStatus maps an error of a handler to its gRPC status: the one place
// that decides codes. Context errors pass through as CANCELLED and
// DEADLINE_EXCEEDED; anything unknown is INTERNAL.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := codes.Internal
	switch {
	case errors.Is(err, ErrInvalidArgument):
		code = codes.InvalidArgument
	case errors.Is(err, ErrNotReady), errors.Is(err, ErrStopping):
		code = codes.Unavailable
	case errors.Is(err, ErrTooManyWaiters), errors.Is(err, ErrOverloaded):
		code = codes.ResourceExhausted
	case errors.Is(err, ErrBarrierTimeout), errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	}
	return status.Error(code, err.Error())
}
