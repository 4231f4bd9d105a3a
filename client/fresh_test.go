package client

import (
	"context"
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
// only ask that one again), then forgets any search back-off those
// Lookups set.
func waitBothCalled(t *testing.T, c *Client, a, b *progressIndex) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for a.calls.Load() == 0 || b.calls.Load() == 0 {
		if _, err := c.Lookup(ctx, "m", []uint64{1}); err != nil {
			t.Fatalf("waiting for both replicas to answer: %v", err)
		}
	}
	c.searchAfter.Store(0)
}

// When every replica is stale (an etcd outage), the client returns the
// freshest answer and then stops searching for StaleAfter: the outage
// costs one extra round of calls, not a multiple of the load.
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
	// The first call's search asks up to DefaultMaxAttempts replicas.
	if _, err := c.Lookup(ctx, "m", []uint64{1}); err != nil {
		t.Fatal(err)
	}
	first := r1.calls.Load() + r2.calls.Load()
	if first != DefaultMaxAttempts {
		t.Fatalf("the first stale answer led to %d calls, want %d", first, DefaultMaxAttempts)
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
	if n := r1.calls.Load() + r2.calls.Load() - first; n != 10 {
		t.Fatalf("10 Lookups during the pause made %d calls, want 10", n)
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
