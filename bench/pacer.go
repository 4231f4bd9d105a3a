package bench

import (
	"context"
	"fmt"
	"math"
	"time"

	"golang.org/x/time/rate"
)

// pacer hands a stream's records to the producer at a fixed rate of block
// operations: a token bucket (golang.org/x/time/rate) filled at perSecond
// block ops a second, holding at most burst, the stream's largest record
// (so every record fits), and full at the start. A record of n block ops
// waits until n tokens are there. After a stall (the fleet's in-flight
// bound) the bucket refills to burst only: the pace never catches up
// beyond one record, so the offered rate stays at or below perSecond.
type pacer struct {
	lim   *rate.Limiter
	burst int
}

// newPacer returns a pacer of perSecond block ops a second for records of
// at most maxOps block ops. It fails unless perSecond is positive and
// finite.
func newPacer(perSecond float64, maxOps int) (*pacer, error) {
	if !(perSecond > 0) || math.IsInf(perSecond, 0) {
		return nil, fmt.Errorf("bench: pacing rate %v: want a positive block-ops/s", perSecond)
	}
	burst := max(maxOps, 1)
	return &pacer{lim: rate.NewLimiter(rate.Limit(perSecond), burst), burst: burst}, nil
}

// delay reserves ops block ops at now and returns how long after now the
// record they belong to may be handed out. Records larger than the burst
// are reserved as the burst (newPacer sizes it to the largest record).
func (p *pacer) delay(now time.Time, ops int) time.Duration {
	r := p.lim.ReserveN(now, min(max(ops, 0), p.burst))
	return r.DelayFrom(now)
}

// wait blocks until a record of ops block ops may be handed out, or ctx
// ends.
func (p *pacer) wait(ctx context.Context, ops int) error {
	d := p.delay(time.Now(), ops)
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// prefixFor returns how many of s's first records a pacer at perSecond
// block ops a second hands out within d when the producer never stalls:
// record i goes at (its and its predecessors' block ops − the burst) /
// perSecond, or at once while that is negative, and counts while that
// time is at most d. A d of zero or less means the whole stream.
func prefixFor(s *Stream, perSecond float64, d time.Duration) int {
	if d <= 0 || !(perSecond > 0) {
		return len(s.Records)
	}
	budget := float64(max(s.MaxBlockOps, 1)) + perSecond*d.Seconds()
	var cum float64
	for i := range s.Records {
		cum += float64(s.Records[i].BlockOps)
		if cum > budget {
			return i
		}
	}
	return len(s.Records)
}

// Prefix returns the stream of s's first n records (all of them when n is
// out of range), with its totals recounted; Stats stays the whole
// fleet's, since the caches served every request.
func (s *Stream) Prefix(n int) *Stream {
	if n < 0 || n >= len(s.Records) {
		return s
	}
	p := &Stream{Records: s.Records[:n:n], Stats: s.Stats}
	for i := range p.Records {
		r := &p.Records[i]
		p.Events += r.Events
		p.BlockOps += r.BlockOps
		p.Bytes += len(r.Value)
		p.MaxBlockOps = max(p.MaxBlockOps, r.BlockOps)
	}
	return p
}
