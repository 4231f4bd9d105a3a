// Package backoff is kvindex's one retry delay: a capped exponential
// backoff with jitter, on an injectable clock. The ingester and indexd use
// it for every retry of an etcd or Kafka call that failed, so a fleet that
// lost etcd at once does not come back in lockstep.
//
// Each wait is drawn uniformly from [d/2, d], where d starts at Min and
// doubles after every wait up to Max ("equal jitter": a retry never comes
// sooner than half the nominal delay, and retries spread over the other
// half). Reset starts again at Min after a success.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/jonboulle/clockwork"
)

// Backoff is one retry loop's delay state. The zero value is not usable:
// set Min and Max (Min > 0, Min <= Max). It is not safe for concurrent use;
// each loop owns its own.
type Backoff struct {
	// Min is the first nominal delay; Max caps the nominal delay.
	Min, Max time.Duration
	// Clock times the waits of Retry and Until. Nil means the real clock.
	Clock clockwork.Clock

	cur time.Duration
}

// New returns a Backoff from min to max on clock (nil: the real clock).
func New(min, max time.Duration, clock clockwork.Clock) *Backoff {
	return &Backoff{Min: min, Max: max, Clock: clock}
}

// Next returns the next delay, drawn from [d/2, d] for the current nominal
// delay d, and doubles d up to Max.
func (b *Backoff) Next() time.Duration {
	if b.cur <= 0 {
		b.cur = b.Min
	}
	d := b.cur
	b.cur = min(2*b.cur, b.Max)
	return d/2 + rand.N(d/2+1)
}

// Reset makes the next delay start again at Min (call it after a success).
func (b *Backoff) Reset() { b.cur = 0 }

// Sleep waits for d on clock (nil: the real clock) or until ctx ends, and
// returns ctx's error if it ended first.
func Sleep(ctx context.Context, clock clockwork.Clock, d time.Duration) error {
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	t := clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.Chan():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Retry calls fn until it returns nil or ctx ends, waiting b's delays
// between tries; it returns nil, or ctx's error joined with fn's last
// error. onRetry, when not nil, is told every failure and the delay that
// follows it (for logs and metrics).
func Retry(ctx context.Context, b *Backoff, fn func(context.Context) error, onRetry func(err error, delay time.Duration)) error {
	for {
		err := fn(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return &retryError{ctx: ctx.Err(), last: err}
		}
		d := b.Next()
		if onRetry != nil {
			onRetry(err, d)
		}
		if Sleep(ctx, b.Clock, d) != nil {
			return &retryError{ctx: ctx.Err(), last: err}
		}
	}
}

// Until calls fn again and again until ctx ends, in the shape of
// client-go's BackoffUntil around a ListAndWatch: a call that made
// progress resets b first; a call that returns an error is followed by
// b's next delay (onRetry, when not nil, is told the error and the delay);
// a call that returns nil is followed at once by the next. It returns when
// ctx ends, never earlier.
func Until(ctx context.Context, b *Backoff, fn func(context.Context) (progressed bool, err error), onRetry func(err error, delay time.Duration)) {
	for ctx.Err() == nil {
		progressed, err := fn(ctx)
		if progressed {
			b.Reset()
		}
		if err == nil || ctx.Err() != nil {
			continue
		}
		d := b.Next()
		if onRetry != nil {
			onRetry(err, d)
		}
		_ = Sleep(ctx, b.Clock, d)
	}
}

// retryError is Retry's error when ctx ends: it matches ctx's error with
// errors.Is and names the last failure.
type retryError struct{ ctx, last error }

func (e *retryError) Error() string { return e.ctx.Error() + " (last error: " + e.last.Error() + ")" }
func (e *retryError) Unwrap() error { return e.ctx }
