package client

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// DefaultStaleAfter is the age of an answer's ProgressTime past which the
// client asks another replica (WithStaleAfter): three of indexd's default
// progress intervals (1 s), so a healthy replica is never taken for stale.
const DefaultStaleAfter = 3 * time.Second

// WithStaleAfter sets the age past which an answer counts as stale: when a
// replica's answer has a ProgressTime older than d (by this process's
// clock), the client avoids that replica for d, for every call of the
// Client, and asks a replica it does not avoid, up to WithMaxAttempts
// calls in all; it returns the first fresh answer, else the one with the
// newest ProgressTime. A fresh answer from an avoided replica (when every
// ready replica was avoided, calls go to them anyway) ends its avoidance.
// So a replica that fell behind stops answering a Client's calls within
// one call, whatever the number of callers, and an etcd outage, which
// makes every replica stale at once, costs at most one extra call per
// replica per d, not a multiple of the load. Default DefaultStaleAfter
// (3 s); zero or less turns the search off (every answer is returned as
// it comes; d is then DefaultStaleAfter for unresponsive replicas, see
// WithTimeout).
//
// The age compares the replica's clock (ProgressTime) with this
// process's: a clock skew between them counts as staleness, which a d of
// seconds tolerates for clocks kept by NTP.
func WithStaleAfter(d time.Duration) Option {
	return func(o *options) { o.staleAfter = d }
}

// lookupFresh sends req, and when the answer is stale asks the replicas
// the client does not avoid for a fresher one (WithStaleAfter). A failed
// extra call ends the search with the freshest answer so far; only the
// first call's error is returned. own says ctx's deadline is the
// client's own (see call).
func (c *Client) lookupFresh(ctx context.Context, req *kvindexv1.LookupRequest, own bool) (*kvindexv1.LookupResponse, error) {
	lookup := func() (resp *kvindexv1.LookupResponse, addr string, others int, err error) {
		addr, others, err = c.call(ctx, own, req.Barrier != nil, func(ctx context.Context) (err error) {
			resp, err = c.api.Lookup(ctx, req)
			return err
		})
		return resp, addr, others, err
	}
	resp, addr, others, err := lookup()
	if err != nil || c.staleAfter <= 0 {
		return resp, err
	}
	best := resp
	for calls := 1; c.stale(resp); calls++ {
		c.avoidFor(addr)
		if others == 0 || calls >= c.maxAttempts {
			return best, nil
		}
		if resp, addr, others, err = lookup(); err != nil {
			return best, nil
		}
		if resp.GetProgressTime().AsTime().After(best.GetProgressTime().AsTime()) {
			best = resp
		}
	}
	c.avoid.forget(addr)
	return resp, nil
}

// call runs f with ctx carrying a pick (balancer.go), and returns the
// address of the replica f's call went to and how many other ready
// replicas were not avoided then. A call that runs out its deadline while
// own (the call had at least half the client's WithTimeout, see
// deadline; a caller's cancel is not running out) avoids its replica: a replica that holds its connection open
// but does not answer (a stopped process, a node gone dark, a handler
// stuck) would otherwise fail every call balanced to it until gRPC's
// keepalive closes the connection. Running out is the client's context
// ending, or the server answering DEADLINE_EXCEEDED, which it does when
// the deadline gRPC sent with the call ends first; except for a barrier,
// whose DEADLINE_EXCEEDED is the replica's answer (a partition it has not
// applied far enough in the barrier's time).
func (c *Client) call(ctx context.Context, own, barrier bool, f func(context.Context) error) (addr string, others int, err error) {
	ctx, p := withPick(ctx, &c.avoid, c.now)
	err = f(ctx)
	addr, others = p.result()
	if err != nil && own && (errors.Is(ctx.Err(), context.DeadlineExceeded) || !barrier && status.Code(err) == codes.DeadlineExceeded) {
		c.avoidFor(addr)
	}
	return addr, others, err
}

// avoidFor avoids the replica at addr for WithStaleAfter
// (DefaultStaleAfter when the search is off).
func (c *Client) avoidFor(addr string) {
	d := c.staleAfter
	if d <= 0 {
		d = DefaultStaleAfter
	}
	now := c.now()
	c.avoid.avoid(addr, now.UnixNano(), now.Add(d).UnixNano())
}

// stale reports whether an answer's progress is older than staleAfter; an
// answer without a progress time (a replica before v1.1) is not judged.
func (c *Client) stale(resp *kvindexv1.LookupResponse) bool {
	if resp.GetProgressTime() == nil {
		return false
	}
	return c.now().Sub(resp.GetProgressTime().AsTime()) > c.staleAfter
}
