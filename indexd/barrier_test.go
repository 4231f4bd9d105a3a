package indexd

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// eventually polls cond until it holds or testTimeout passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

// TestBarrierWaitersBound parks MaxBarrierWaiters Lookups on a barrier of
// a partition nobody writes, and checks that one more is refused at once
// with RESOURCE_EXHAUSTED naming the limit and its flag, that a barrier
// already met still answers, and that the slots come back when the
// waiters are released.
func TestBarrierWaitersBound(t *testing.T) {
	const limit = 3
	e := testutil.StartEtcd(t)
	w := newWriter(t, e.Client)
	w.commit(w.put(blk(pod0, tier.GPU, 1))) // kvindex-events/0: record offset 0 applied
	r := startReplica(t, e.Client, func(c *Config) { c.MaxBarrierWaiters = limit })
	r.waitServing(t)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	hashes := make([]uint64, DefaultMaxHashes) // the attack's request: the most hashes allowed
	hashes[0] = 1
	unknown := keyspace.Partition{Topic: "not-written", Partition: 7}
	parked := func(timeout time.Duration) *kvindexv1.LookupRequest {
		return &kvindexv1.LookupRequest{Model: model, BlockHashes: hashes, Barrier: &kvindexv1.Barrier{
			Records: []*kvindexv1.PartitionOffset{{Topic: unknown.Topic, Partition: unknown.Partition, Offset: 0}},
			Timeout: durationpb.New(timeout),
		}}
	}
	waiting := func() float64 { return r.counter(t, r.srv.m.barrierWaiters) }

	errs := make(chan error, limit)
	for range limit {
		go func() {
			_, err := r.api.Lookup(ctx, parked(testTimeout))
			errs <- err
		}()
	}
	eventually(t, "the waiters to park", func() bool { return waiting() == limit })

	_, err := r.api.Lookup(ctx, parked(testTimeout))
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("Lookup past the limit: %v, want RESOURCE_EXHAUSTED", err)
	}
	for _, want := range []string{"the limit is 3", "--max-barrier-waiters"} {
		if !strings.Contains(st.Message(), want) {
			t.Errorf("message %q lacks %q", st.Message(), want)
		}
	}
	if n := r.counter(t, r.srv.m.requests.WithLabelValues("Lookup", codes.ResourceExhausted.String())); n != 1 {
		t.Errorf("requests_total{Lookup,ResourceExhausted} = %v, want 1", n)
	}

	// A barrier that is already met never waits, so the bound does not
	// apply to it.
	resp, err := r.api.Lookup(ctx, &kvindexv1.LookupRequest{Model: model, BlockHashes: []uint64{1}, Barrier: w.barrier()})
	if err != nil || len(resp.Matches) != 1 {
		t.Fatalf("met barrier while the waiters are full: %v, %v", resp, err)
	}

	// The partition appears: every waiter answers, and the slots are free.
	if _, err := e.Client.Put(ctx, keyspace.Default().OffsetKey(unknown), keyspace.FormatOffset(1)); err != nil {
		t.Fatal(err)
	}
	for range limit {
		if err := <-errs; err != nil {
			t.Fatalf("parked Lookup after its barrier was met: %v", err)
		}
	}
	if n := waiting(); n != 0 {
		t.Fatalf("waiters = %v after they answered, want 0", n)
	}
	// A new wait gets a slot again (and times out, as nothing more comes).
	_, err = r.api.Lookup(ctx, &kvindexv1.LookupRequest{Model: model, Barrier: &kvindexv1.Barrier{
		Records: []*kvindexv1.PartitionOffset{{Topic: unknown.Topic, Partition: unknown.Partition, Offset: 5}},
		Timeout: durationpb.New(20 * time.Millisecond),
	}})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a wait after the slots came back: %v, want DEADLINE_EXCEEDED", err)
	}
	if n := waiting(); n != 0 {
		t.Fatalf("waiters = %v after a timed-out wait, want 0", n)
	}
}

// TestBarrierWaiterSlotFreedOnCancel checks that a waiter whose caller
// goes away gives its slot back.
func TestBarrierWaiterSlotFreedOnCancel(t *testing.T) {
	e := testutil.StartEtcd(t)
	r := startReplica(t, e.Client, func(c *Config) { c.MaxBarrierWaiters = 1 })
	r.waitServing(t)
	req := &kvindexv1.LookupRequest{Model: model, Barrier: &kvindexv1.Barrier{
		Records: []*kvindexv1.PartitionOffset{{Topic: "t", Partition: 0, Offset: 0}}, Timeout: durationpb.New(testTimeout),
	}}
	for i := range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := r.api.Lookup(ctx, req)
			errc <- err
		}()
		eventually(t, "the waiter to park", func() bool { return r.counter(t, r.srv.m.barrierWaiters) == 1 })
		cancel()
		if err := <-errc; status.Code(err) != codes.Canceled {
			t.Fatalf("round %d: cancelled Lookup: %v, want CANCELLED", i, err)
		}
		eventually(t, "the slot to come back", func() bool { return r.counter(t, r.srv.m.barrierWaiters) == 0 })
	}
}

// TestShutdownReleasesBarrierWaiters: a Lookup waiting on a barrier when
// the replica begins to shut down ends at once with UNAVAILABLE "shutting
// down" (its client retries another replica), so the graceful stop does
// not wait out the barrier, or ShutdownGrace, for it.
func TestShutdownReleasesBarrierWaiters(t *testing.T) {
	e := testutil.StartEtcd(t)
	w := newWriter(t, e.Client)
	w.commit(w.put(blk(pod0, tier.GPU, 1)))
	// A grace past the test's timeout: a stop waiting it out fails the
	// test instead of passing late.
	r := startReplica(t, e.Client, func(c *Config) { c.ShutdownGrace = 2 * testTimeout })
	r.waitServing(t)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	// A connection of its own: the replica's stop closes r's.
	conn, err := grpc.NewClient(r.srv.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	api := kvindexv1.NewIndexServiceClient(conn)
	errs := make(chan error, 1)
	go func() {
		_, err := api.Lookup(ctx, &kvindexv1.LookupRequest{Model: model, BlockHashes: []uint64{1}, Barrier: &kvindexv1.Barrier{
			Records: []*kvindexv1.PartitionOffset{{Topic: "not-written", Partition: 7, Offset: 0}},
			Timeout: durationpb.New(testTimeout),
		}})
		errs <- err
	}()
	eventually(t, "the waiter to park", func() bool { return r.counter(t, r.srv.m.barrierWaiters) == 1 })
	stopped := make(chan struct{})
	go func() {
		r.stop()
		close(stopped)
	}()
	select {
	case err := <-errs:
		if st := status.Convert(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "shutting down") {
			t.Fatalf("the waiting Lookup ended with %v, want UNAVAILABLE naming the shutdown", err)
		}
	case <-ctx.Done():
		t.Fatal("the waiting Lookup did not end when the replica began to shut down")
	}
	select {
	case <-stopped:
	case <-ctx.Done():
		t.Fatal("the replica's stop waited on the barrier")
	}
}
