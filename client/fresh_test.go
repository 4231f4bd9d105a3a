package client

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// progressIndex answers every Lookup with progress_time now − behind.
type progressIndex struct {
	kvindexv1.UnimplementedIndexServiceServer
	behind time.Duration
	calls  atomic.Int32
}

func (p *progressIndex) Lookup(context.Context, *kvindexv1.LookupRequest) (*kvindexv1.LookupResponse, error) {
	p.calls.Add(1)
	return &kvindexv1.LookupResponse{Revision: 7, ProgressTime: timestamppb.New(time.Now().Add(-p.behind))}, nil
}

// With one replica cut off from etcd (its progress an hour old) and one
// current, every Lookup returns a current answer: a stale one makes the
// client ask the next replica. Without the search, round-robin returns
// the stale replica's answer every other call.
func TestLookupPrefersFreshReplica(t *testing.T) {
	stale, fresh := &progressIndex{behind: time.Hour}, &progressIndex{}
	a, _ := serve(t, stale)
	b, _ := serve(t, fresh)
	c, err := New(a + "," + b)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	waitBothCalled(t, c, stale, fresh)
	before := stale.calls.Load()
	for i := range 20 {
		res, err := c.Lookup(ctx, "m", []uint64{1})
		if err != nil {
			t.Fatal(err)
		}
		if age := time.Since(res.ProgressTime); res.ProgressTime.IsZero() || age > time.Minute {
			t.Fatalf("Lookup %d: ProgressTime %v (%v old), want the current replica's", i, res.ProgressTime, age)
		}
	}
	if stale.calls.Load() == before {
		t.Fatal("the stale replica was never called; the test did not balance over both")
	}
}

// waitBothCalled sends Lookups until both replicas have answered one, so
// the balancer has a connection to each (until then round-robin has only
// the replica that connected first, and a search for a fresher answer can
// only ask that one again), then forgets the replicas those Lookups made
// the client avoid.
func waitBothCalled(t *testing.T, c *Client, a, b *progressIndex) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for a.calls.Load() == 0 || b.calls.Load() == 0 {
		if _, err := c.Lookup(ctx, "m", []uint64{1}); err != nil {
			t.Fatalf("waiting for both replicas to answer: %v", err)
		}
	}
	c.avoid.m.Store(nil)
}

// When every replica is stale (an etcd outage), the client asks each
// replica once, returns the freshest answer, and then avoids them all for
// StaleAfter: calls go to them anyway, one call per Lookup, so the outage
// costs one extra call per replica, not a multiple of the load.
func TestLookupAllStaleSearchesOnce(t *testing.T) {
	r1, r2 := &progressIndex{behind: time.Hour}, &progressIndex{behind: 2 * time.Hour}
	a, _ := serve(t, r1)
	b, _ := serve(t, r2)
	c, err := New(a+","+b, WithStaleAfter(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	waitBothCalled(t, c, r1, r2)
	before := r1.calls.Load() + r2.calls.Load()
	res, err := c.Lookup(ctx, "m", []uint64{1})
	if err != nil {
		t.Fatal(err)
	}
	first := r1.calls.Load() + r2.calls.Load() - before
	if first != 2 {
		t.Fatalf("the first stale answer led to %d calls, want 2 (each replica once)", first)
	}
	if age := time.Since(res.ProgressTime); age > 90*time.Minute {
		t.Fatalf("the answer is %v old, want the freshest (an hour)", age)
	}
	for range 10 {
		res, err := c.Lookup(ctx, "m", []uint64{1})
		if err != nil {
			t.Fatal(err)
		}
		if res.ProgressTime.IsZero() {
			t.Fatal("no ProgressTime")
		}
	}
	if n := r1.calls.Load() + r2.calls.Load() - before - first; n != 10 {
		t.Fatalf("10 Lookups while every replica was avoided made %d calls, want 10", n)
	}
}

// TestStaleReplicaAvoidedByConcurrentCallers: one replica an hour behind,
// one current, 16 goroutines calling. No answer is stale, and after the
// first stale answer the stale replica is passed over by every caller:
// it sees at most the calls already on their way to it. Before, the
// search's extra calls shared the round robin with everybody's, so a
// search could meet only the stale replica, and such a search paused the
// search for every caller: about half of all answers were an hour old
// (a hostile test counted 13,224 of 26,516 against real indexd).
func TestStaleReplicaAvoidedByConcurrentCallers(t *testing.T) {
	stale, fresh := &progressIndex{behind: time.Hour}, &progressIndex{}
	a, _ := serve(t, stale)
	b, _ := serve(t, fresh)
	c := newClient(t, a+","+b, WithStaleAfter(time.Minute))
	waitBothCalled(t, c, stale, fresh)
	const callers = 16
	before := stale.calls.Load()
	var staleAnswers, calls atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				res, err := c.Lookup(context.Background(), "m", []uint64{1})
				if err != nil {
					t.Error(err)
					return
				}
				calls.Add(1)
				if time.Since(res.ProgressTime) > time.Minute {
					staleAnswers.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if n := staleAnswers.Load(); n > 0 {
		t.Errorf("%d of %d answers were an hour stale although a current replica answered throughout", n, calls.Load())
	}
	if n := stale.calls.Load() - before; n > callers {
		t.Errorf("the stale replica got %d of %d calls, want at most %d (the calls on their way when it was first found stale)", n, calls.Load(), callers)
	}
}

// TestSilentReplicaAvoided: a replica that holds its connection open and
// never answers (a stopped process) fails the call that runs out the
// client's deadline on it, and then no other for StaleAfter. Before, every
// call balanced to it failed, a third of all calls with three replicas.
// A deadline of the caller's, shorter than the client's, is the caller's
// business: it does not make the replica avoided.
func TestSilentReplicaAvoided(t *testing.T) {
	silent, good := &fakeIndex{name: "silent", block: true}, &fakeIndex{name: "good"}
	a, _ := serve(t, silent)
	b, _ := serve(t, good)
	c := newClient(t, a+","+b, WithTimeout(200*time.Millisecond), WithStaleAfter(time.Minute))
	// Both connections ready: calls until each replica has had one.
	for silent.calls.Load() == 0 || good.calls.Load() == 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		c.Lookup(ctx, "m", []uint64{1})
		cancel()
	}
	if m := c.avoid.m.Load(); m != nil && len(*m) > 0 {
		t.Fatalf("calls cut short by the caller's own deadline made the client avoid %v", *m)
	}
	failed := 0
	for range 40 {
		if _, err := c.Lookup(context.Background(), "m", []uint64{1}); err != nil {
			if !errors.Is(err, ErrDeadlineExceeded) {
				t.Fatalf("Lookup: %v, want ErrDeadlineExceeded or an answer", err)
			}
			failed++
		}
	}
	if failed > 1 {
		t.Fatalf("%d of 40 Lookups ran out the deadline on the silent replica, want at most 1", failed)
	}
}

// WithStaleAfter(0) turns the search off: every answer as it comes.
func TestLookupStaleSearchOff(t *testing.T) {
	stale := &progressIndex{behind: time.Hour}
	a, _ := serve(t, stale)
	c, err := New(a, WithStaleAfter(0))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res, err := c.Lookup(context.Background(), "m", []uint64{1})
	if err != nil {
		t.Fatal(err)
	}
	if n := stale.calls.Load(); n != 1 || time.Since(res.ProgressTime) < time.Hour {
		t.Fatalf("calls = %d, ProgressTime %v; want one call returning the stale answer", n, res.ProgressTime)
	}
}

// TestSilentReplicaAvoidedUnderTheCallersEqualDeadline: a caller whose
// deadline equals the client's timeout (the GIE plugin runs each Lookup
// under its lookupTimeout, which is also its client's WithTimeout) makes
// a silent replica avoided too. Before, that deadline reached the client
// a hair sooner than its own, counted as the caller's, and the replica
// failed every other Lookup (a review measured 10 of 20).
func TestSilentReplicaAvoidedUnderTheCallersEqualDeadline(t *testing.T) {
	silent, good := &fakeIndex{name: "silent", block: true}, &fakeIndex{name: "good"}
	a, _ := serve(t, silent)
	b, _ := serve(t, good)
	const lookupTimeout = 200 * time.Millisecond
	c := newClient(t, a+","+b, WithTimeout(lookupTimeout), WithStaleAfter(time.Minute))
	for silent.calls.Load() == 0 || good.calls.Load() == 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond) // under half: the caller's
		c.Lookup(ctx, "m", []uint64{1})
		cancel()
	}
	failed := 0
	for range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), lookupTimeout)
		if _, err := c.Lookup(ctx, "m", []uint64{1}); err != nil {
			failed++
		}
		cancel()
	}
	if failed > 1 {
		t.Fatalf("%d of 20 Lookups ran out their deadline on the silent replica, want at most 1", failed)
	}
}

// TestCallerCancelAvoidsNothing: a call the caller cancels (an abandoned
// request) says nothing about its replica, which stays in the round.
// Before, any end of the call's context counted as running out the
// deadline: with the other replica stale, the next Lookup then got the
// stale answer although the fresh replica was ready.
func TestCallerCancelAvoidsNothing(t *testing.T) {
	slow := &fakeIndex{name: "slow", block: true}
	a, _ := serve(t, slow)
	c := newClient(t, a, WithTimeout(10*time.Second), WithStaleAfter(time.Minute))
	for range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		if _, err := c.Lookup(ctx, "m", []uint64{1}); !errors.Is(err, ErrCanceled) {
			t.Fatalf("Lookup cancelled by its caller: %v, want ErrCanceled", err)
		}
		cancel()
	}
	if slow.calls.Load() == 0 {
		t.Fatal("no call reached the replica")
	}
	if m := c.avoid.m.Load(); m != nil && len(*m) > 0 {
		t.Fatalf("calls cancelled by their caller made the client avoid %v", *m)
	}
}
