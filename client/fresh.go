package client

import (
	"context"
	"time"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// DefaultStaleAfter is the age of an answer's ProgressTime past which the
// client asks another replica (WithStaleAfter): three of indexd's default
// progress intervals (1 s), so a healthy replica is never taken for stale.
const DefaultStaleAfter = 3 * time.Second

// WithStaleAfter sets the age past which an answer counts as stale: when a
// replica's answer has a ProgressTime older than d (by this process's
// clock), Lookup asks again, the round-robin balancer sending the call to
// the next replica, up to WithMaxAttempts calls in all, and returns the
// answer with the newest ProgressTime (the first fresh one ends the
// search). When every answer of such a search was stale (an etcd outage
// makes every replica stale at once), the client stops searching for d, so
// an outage costs at most one extra round of calls per d, not a multiple
// of the load. Default DefaultStaleAfter (3 s); zero or less turns the
// search off (every answer is returned as it comes).
//
// The age compares the replica's clock (ProgressTime) with this
// process's: a clock skew between them counts as staleness, which a d of
// seconds tolerates for clocks kept by NTP.
func WithStaleAfter(d time.Duration) Option {
	return func(o *options) { o.staleAfter = d }
}

// lookupFresh sends req, and when the answer is stale asks other replicas
// for a fresher one (WithStaleAfter). A failed extra call ends the search
// with the freshest answer so far; only the first call's error is
// returned.
func (c *Client) lookupFresh(ctx context.Context, req *kvindexv1.LookupRequest) (*kvindexv1.LookupResponse, error) {
	resp, err := c.api.Lookup(ctx, req)
	if err != nil || c.staleAfter <= 0 || !c.stale(resp) || c.now().UnixNano() < c.searchAfter.Load() {
		return resp, err
	}
	best := resp
	for i := 1; i < c.maxAttempts; i++ {
		next, err := c.api.Lookup(ctx, req)
		if err != nil {
			break
		}
		if next.GetProgressTime().AsTime().After(best.GetProgressTime().AsTime()) {
			best = next
		}
		if !c.stale(best) {
			return best, nil
		}
	}
	c.searchAfter.Store(c.now().Add(c.staleAfter).UnixNano())
	return best, nil
}

// stale reports whether an answer's progress is older than staleAfter; an
// answer without a progress time (a replica before v1.1) is not judged.
func (c *Client) stale(resp *kvindexv1.LookupResponse) bool {
	if resp.GetProgressTime() == nil {
		return false
	}
	return c.now().Sub(resp.GetProgressTime().AsTime()) > c.staleAfter
}
