package indexd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvindex/kvindex/internal/index"
)

// broadcaster wakes every waiter at once: wait returns a channel that the
// next broadcast closes (and replaces). The reflector broadcasts after it
// applies a revision that changed offsets/ and after it publishes a fresh
// index, so barrier waiters re-check without polling.
type broadcaster struct {
	mu sync.Mutex
	ch chan struct{}
}

func newBroadcaster() *broadcaster { return &broadcaster{ch: make(chan struct{})} }

// wait returns the channel the next broadcast closes. Take it before
// checking the condition you wait for, so a broadcast in between is not
// missed.
func (b *broadcaster) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ch
}

func (b *broadcaster) broadcast() {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.ch)
	b.ch = make(chan struct{})
}

// waitBarrier waits until the serving index has applied every record of
// records (DESIGN "Reads", read-your-events: each partition's applied next
// offset is greater than the record's offset, held in Next) and returns
// that index. It gives up after timeout or when ctx ends; a deadline
// either way is ErrBarrierTimeout naming the first lagging partition. A
// shutdown beginning while it waits ends it with ErrStopping, so the
// graceful stop does not wait out the barrier.
func (s *Server) waitBarrier(ctx context.Context, records []index.PartitionOffset, timeout time.Duration) (*index.Index, error) {
	start := time.Now()
	defer func() { s.m.barrierSeconds.Observe(time.Since(start).Seconds()) }()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	waiting := false
	defer func() {
		if waiting {
			s.releaseWaiter()
		}
	}()
	for {
		wake := s.bcst.wait()
		ix := s.refl.current()
		if ix == nil {
			return nil, ErrNotReady
		}
		rec, applied, ok := ix.Lagging(records)
		if ok {
			return ix, nil
		}
		// A barrier not met at once waits in one of MaxBarrierWaiters
		// slots, or fails with ErrTooManyWaiters when none is free.
		if !waiting {
			if err := s.acquireWaiter(); err != nil {
				return nil, err
			}
			waiting = true
		}
		var cause error
		select {
		case <-wake:
			continue
		case <-s.stopping.Done():
			return nil, fmt.Errorf("%w: a barrier was waiting (%s)", ErrStopping, barrierLag(rec, applied))
		case <-timer.C:
			cause = fmt.Errorf("waited %s", timeout)
		case <-ctx.Done():
			if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil, ctx.Err()
			}
			cause = fmt.Errorf("the call's deadline passed after %s", time.Since(start).Round(time.Millisecond))
		}
		return nil, fmt.Errorf("%w: %s (%v)", ErrBarrierTimeout, barrierLag(rec, applied), cause)
	}
}

// acquireWaiter takes one of the MaxBarrierWaiters slots, or returns
// ErrTooManyWaiters naming the limit when all are taken. A taken slot is
// given back with releaseWaiter.
func (s *Server) acquireWaiter() error {
	if n := s.waiters.Add(1); n > int64(s.cfg.MaxBarrierWaiters) {
		s.waiters.Add(-1)
		// n counts the other callers refused at this moment too, so the
		// message gives the limit, not n.
		return fmt.Errorf("%w: the limit is %d (--max-barrier-waiters), and every slot is taken; retry later",
			ErrTooManyWaiters, s.cfg.MaxBarrierWaiters)
	}
	s.m.barrierWaiters.Inc()
	return nil
}

// releaseWaiter gives back a slot acquireWaiter took.
func (s *Server) releaseWaiter() {
	s.waiters.Add(-1)
	s.m.barrierWaiters.Dec()
}

// barrierLag says, in a barrier timeout's message, which record of which
// partition is not applied yet and what is: applied is the partition's
// applied next offset (every record below it is reflected), -1 when the
// partition has none.
func barrierLag(rec index.PartitionOffset, applied int64) string {
	switch {
	case applied < 0:
		return fmt.Sprintf("partition %s: record offset %d is not applied yet; this replica has applied no record of the partition (no offset stored)",
			rec.Partition, rec.Next)
	case applied == 0:
		return fmt.Sprintf("partition %s: record offset %d is not applied yet; this replica has applied no record of the partition",
			rec.Partition, rec.Next)
	}
	return fmt.Sprintf("partition %s: record offset %d is not applied yet; this replica has applied records up to offset %d",
		rec.Partition, rec.Next, applied-1)
}
