package backoff

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jonboulle/clockwork"
)

func TestNextDoublesWithinJitter(t *testing.T) {
	b := New(100*time.Millisecond, time.Second, nil)
	nominal := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for round := range 50 {
		b.Reset()
		for i, n := range nominal {
			d, lo := b.Next(), n*time.Millisecond/2
			if d < lo || d > n*time.Millisecond {
				t.Fatalf("round %d wait %d = %v, want within [%v, %v]", round, i, d, lo, n*time.Millisecond)
			}
		}
	}
}

func TestNextJitters(t *testing.T) {
	b := New(time.Second, time.Second, nil)
	seen := map[time.Duration]bool{}
	for range 20 {
		seen[b.Next()] = true
	}
	if len(seen) < 2 {
		t.Errorf("20 waits of a 1 s backoff were all %v, want them spread over [0.5 s, 1 s]", seen)
	}
}

func TestRetryWaitsOnTheClock(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := New(time.Second, 4*time.Second, clock)
	calls := 0
	var delays []time.Duration
	done := make(chan error, 1)
	go func() {
		done <- Retry(context.Background(), b, func(context.Context) error {
			calls++
			if calls < 3 {
				return errors.New("not yet")
			}
			return nil
		}, func(_ error, d time.Duration) { delays = append(delays, d) })
	}()
	for range 2 {
		if err := clock.BlockUntilContext(context.Background(), 1); err != nil {
			t.Fatal(err)
		}
		clock.Advance(4 * time.Second)
	}
	if err := <-done; err != nil {
		t.Fatalf("Retry = %v, want nil", err)
	}
	if calls != 3 || len(delays) != 2 {
		t.Fatalf("%d calls, delays %v; want 3 calls and 2 delays", calls, delays)
	}
	if delays[0] > time.Second || delays[1] < time.Second || delays[1] > 2*time.Second {
		t.Errorf("delays %v, want the first within [0.5 s, 1 s] and the second within [1 s, 2 s]", delays)
	}
}

func TestRetryStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	boom := errors.New("boom")
	b := New(time.Hour, time.Hour, nil)
	calls := 0
	err := Retry(ctx, b, func(context.Context) error {
		calls++
		return boom
	}, func(error, time.Duration) { cancel() })
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Retry = %v, want context.Canceled", err)
	}
	if diff := cmp.Diff("context canceled (last error: boom)", err.Error()); diff != "" {
		t.Errorf("error text (-want +got):\n%s", diff)
	}
	if calls != 1 {
		t.Errorf("%d calls, want 1", calls)
	}
}

// TestUntil runs fn through a script of outcomes on a fake clock: an
// error waits a delay (growing while nothing progresses), nil goes again
// at once, and progress resets the delay to Min. It checks the delays
// Until drew and that it returns only when ctx ends.
func TestUntil(t *testing.T) {
	type outcome struct {
		progressed bool
		err        bool
	}
	script := []outcome{
		{err: true},                   // wait ~Min
		{err: true},                   // wait ~2 Min
		{progressed: false},           // again at once
		{progressed: true, err: true}, // reset, wait ~Min
		{err: true},                   // wait ~2 Min
	}
	clock := clockwork.NewFakeClock()
	b := New(time.Second, time.Minute, clock)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls := 0
	var delays []time.Duration
	done := make(chan struct{})
	go func() {
		defer close(done)
		Until(ctx, b, func(context.Context) (bool, error) {
			if calls == len(script) {
				cancel()
				return false, nil
			}
			o := script[calls]
			calls++
			if o.err {
				return o.progressed, errors.New("broken")
			}
			return o.progressed, nil
		}, func(_ error, d time.Duration) { delays = append(delays, d) })
	}()
	for range 4 { // one wait per scripted error
		if err := clock.BlockUntilContext(ctx, 1); err != nil {
			t.Fatal(err)
		}
		clock.Advance(time.Minute)
	}
	<-done
	if calls != len(script) {
		t.Fatalf("%d calls, want %d", calls, len(script))
	}
	// Nominal delays: 1 s, 2 s, then (after the reset) 1 s, 2 s; each
	// drawn from [d/2, d].
	nominal := []time.Duration{time.Second, 2 * time.Second, time.Second, 2 * time.Second}
	if len(delays) != len(nominal) {
		t.Fatalf("delays %v, want %d", delays, len(nominal))
	}
	for i, n := range nominal {
		if delays[i] < n/2 || delays[i] > n {
			t.Errorf("delay %d = %v, want within [%v, %v]", i, delays[i], n/2, n)
		}
	}
}
