package client

import (
	"context"
	"errors"
	"math"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeIndex is a real gRPC IndexService that fails its first failFirst
// Lookup calls with failCode, blocks while block is set, and otherwise
// answers that pod "name" holds the first block on GPU.
type fakeIndex struct {
	kvindexv1.UnimplementedIndexServiceServer
	name      string
	calls     atomic.Int32
	failFirst int32
	failCode  codes.Code
	block     bool
	// delay holds each answer back this long (a barrier wait).
	delay time.Duration
}

func (f *fakeIndex) Lookup(ctx context.Context, req *kvindexv1.LookupRequest) (*kvindexv1.LookupResponse, error) {
	if n := f.calls.Add(1); n <= f.failFirst {
		return nil, status.Error(f.failCode, "injected failure")
	}
	if f.block {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	select {
	case <-time.After(f.delay):
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return &kvindexv1.LookupResponse{
		Revision:       42,
		Matches:        []*kvindexv1.EndpointMatch{{Endpoint: &kvindexv1.Endpoint{Pod: f.name, DpRank: 1}, MatchedBlocks: 1, Tiers: []kvindexv1.Tier{kvindexv1.Tier_TIER_GPU}}},
		AppliedOffsets: []*kvindexv1.PartitionOffset{{Topic: "t", Partition: 2, Offset: 9}},
	}, nil
}

// serve runs f (a fakeIndex or another real IndexService) on a loopback
// port until the test ends (or stop).
func serve(t *testing.T, f kvindexv1.IndexServiceServer) (addr string, stop func()) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	kvindexv1.RegisterIndexServiceServer(srv, f)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			srv.Stop()
			// Serve returns nil once Stop is called, an error otherwise.
			if err := <-done; err != nil {
				t.Errorf("Serve: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return l.Addr().String(), stop
}

func newClient(t *testing.T, target string, opts ...Option) *Client {
	t.Helper()
	c, err := New(target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestLookupConvertsTheAnswer(t *testing.T) {
	addr, _ := serve(t, &fakeIndex{name: "vllm-0"})
	c := newClient(t, addr)
	got, err := c.Lookup(context.Background(), "m", []uint64{1, 2}, WithCandidates(Endpoint{Pod: "vllm-0"}), WithBarrier(time.Second, PartitionOffset{Topic: "t", Partition: 2, Offset: 8}))
	if err != nil {
		t.Fatal(err)
	}
	want := &LookupResult{
		Matches:        []Match{{Endpoint: Endpoint{Pod: "vllm-0", DPRank: 1}, Blocks: 1, Tiers: []Tier{TierGPU}}},
		Revision:       42,
		AppliedOffsets: []PartitionOffset{{Topic: "t", Partition: 2, Offset: 9}},
	}
	if diff := gocmp.Diff(want, got); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
}

func TestRetriesOnlyUnavailable(t *testing.T) {
	for _, tc := range []struct {
		name      string
		failFirst int32
		code      codes.Code
		wantErr   error
		wantCalls int32
	}{
		{name: "unavailable_then_ok", failFirst: 2, code: codes.Unavailable, wantCalls: 3},
		{name: "unavailable_exhausts_attempts", failFirst: 10, code: codes.Unavailable, wantErr: ErrUnavailable, wantCalls: 3},
		{name: "invalid_argument_not_retried", failFirst: 1, code: codes.InvalidArgument, wantErr: ErrInvalidArgument, wantCalls: 1},
		{name: "deadline_exceeded_not_retried", failFirst: 1, code: codes.DeadlineExceeded, wantErr: ErrDeadlineExceeded, wantCalls: 1},
		{name: "internal_not_retried", failFirst: 1, code: codes.Internal, wantErr: ErrInternal, wantCalls: 1},
		{name: "resource_exhausted_not_retried", failFirst: 1, code: codes.ResourceExhausted, wantErr: ErrResourceExhausted, wantCalls: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeIndex{name: "p", failFirst: tc.failFirst, failCode: tc.code}
			addr, _ := serve(t, f)
			c := newClient(t, addr, WithMaxAttempts(3), WithTimeout(10*time.Second))
			_, err := c.Lookup(context.Background(), "m", []uint64{1})
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("error = %v, want %v", err, tc.wantErr)
			}
			if n := f.calls.Load(); n != tc.wantCalls {
				t.Fatalf("server saw %d calls, want %d", n, tc.wantCalls)
			}
			var e *Error
			if err != nil && (!errors.As(err, &e) || e.Code != tc.code || status.Code(err) != tc.code) {
				t.Fatalf("error %v does not carry code %v", err, tc.code)
			}
		})
	}
}

func TestBalancesOverAList(t *testing.T) {
	a, b := &fakeIndex{name: "a"}, &fakeIndex{name: "b"}
	addrA, stopA := serve(t, a)
	addrB, _ := serve(t, b)
	c := newClient(t, addrA+","+addrB, WithTimeout(10*time.Second))
	ctx := context.Background()
	// Until both replicas are connected, round robin may favour one.
	for i := 0; i < 200 && (a.calls.Load() == 0 || b.calls.Load() == 0); i++ {
		if _, err := c.Lookup(ctx, "m", []uint64{1}); err != nil {
			t.Fatal(err)
		}
	}
	if a.calls.Load() == 0 || b.calls.Load() == 0 {
		t.Fatalf("calls a=%d b=%d: not balanced over both", a.calls.Load(), b.calls.Load())
	}
	a0, b0 := a.calls.Load(), b.calls.Load()
	for range 20 {
		if _, err := c.Lookup(ctx, "m", []uint64{1}); err != nil {
			t.Fatal(err)
		}
	}
	if da, db := a.calls.Load()-a0, b.calls.Load()-b0; da < 5 || db < 5 {
		t.Fatalf("20 calls split a=%d b=%d", da, db)
	}
	// One replica goes away: calls go on against the other.
	stopA()
	for i := range 10 {
		if _, err := c.Lookup(ctx, "m", []uint64{1}); err != nil {
			t.Fatalf("call %d with one replica down: %v", i, err)
		}
	}
}

func TestDefaultDeadline(t *testing.T) {
	addr, _ := serve(t, &fakeIndex{name: "p", block: true})
	c := newClient(t, addr, WithTimeout(50*time.Millisecond))
	_, err := c.Lookup(context.Background(), "m", []uint64{1})
	if !errors.Is(err, ErrDeadlineExceeded) {
		t.Fatalf("error = %v, want ErrDeadlineExceeded", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Lookup(ctx, "m", []uint64{1}); !errors.Is(err, ErrCanceled) {
		t.Fatalf("cancelled call: %v, want ErrCanceled", err)
	}
	c.Close()
	if _, err := c.Lookup(context.Background(), "m", nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v, want ErrClosed", err)
	}
}

// TestCloseEndsCallsInFlightWithErrClosed: a Lookup waiting on the server
// when Close is called fails with ErrClosed, not ErrCanceled: its
// caller's context is live, the Client went away.
func TestCloseEndsCallsInFlightWithErrClosed(t *testing.T) {
	f := &fakeIndex{name: "p", block: true}
	addr, _ := serve(t, f)
	c := newClient(t, addr, WithTimeout(time.Minute))
	errc := make(chan error, 1)
	go func() {
		_, err := c.Lookup(context.Background(), "m", []uint64{1})
		errc <- err
	}()
	for f.calls.Load() == 0 {
		time.Sleep(time.Millisecond) // until the call reached the server
	}
	c.Close()
	if err := <-errc; !errors.Is(err, ErrClosed) || errors.Is(err, ErrCanceled) {
		t.Fatalf("call cut off by Close: %v, want ErrClosed", err)
	}
}

func TestNewRejectsEmptyTarget(t *testing.T) {
	for _, target := range []string{"  ", ",", " , ,", "http://indexd:50051", "https://indexd:50051", "a:1,b", "a:1,b:c:d"} {
		if _, err := New(target); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("New(%q) = %v, want ErrInvalidArgument", target, err)
		}
	}
	for _, target := range []string{"indexd:50051", "dns:///indexd:50051", "a:1, b:2", "[::1]:50051,127.0.0.1:50051"} {
		c, err := New(target)
		if err != nil {
			t.Errorf("New(%q) = %v", target, err)
			continue
		}
		c.Close()
	}
}

// TestBarrierExtendsTheCallDeadline: the per-call deadline bounds the answer,
// not the barrier wait a caller asked for.
func TestBarrierExtendsTheCallDeadline(t *testing.T) {
	addr, _ := serve(t, &fakeIndex{name: "p", delay: 300 * time.Millisecond})
	c := newClient(t, addr, WithTimeout(100*time.Millisecond))
	if _, err := c.Lookup(context.Background(), "m", []uint64{1}); !errors.Is(err, ErrDeadlineExceeded) {
		t.Fatalf("a 300 ms answer under a 100 ms call deadline: %v, want ErrDeadlineExceeded", err)
	}
	rec := PartitionOffset{Topic: "t", Partition: 0, Offset: 1}
	if _, err := c.Lookup(context.Background(), "m", []uint64{1}, WithBarrier(2*time.Second, rec)); err != nil {
		t.Fatalf("the same wait inside a 2 s barrier: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := c.Lookup(ctx, "m", []uint64{1}, WithBarrier(2*time.Second, rec)); !errors.Is(err, ErrDeadlineExceeded) {
		t.Fatalf("the caller's own shorter deadline still bounds a barrier: %v", err)
	}
}

// TestHugeBarrierTimeoutWaits: a barrier timeout near the largest
// duration extends the call's deadline without wrapping it into the past
// (the call waits for the answer instead of failing at once).
func TestHugeBarrierTimeoutWaits(t *testing.T) {
	addr, _ := serve(t, &fakeIndex{name: "p", delay: 200 * time.Millisecond})
	c := newClient(t, addr, WithTimeout(100*time.Millisecond))
	rec := PartitionOffset{Topic: "t", Partition: 0, Offset: 1}
	if _, err := c.Lookup(context.Background(), "m", []uint64{1}, WithBarrier(math.MaxInt64, rec)); err != nil {
		t.Fatalf("a 200 ms answer inside the largest barrier timeout: %v", err)
	}
}

// TestRefusesWhatCannotBeEncoded: strings protobuf cannot carry (invalid
// UTF-8) are refused before sending, as ErrInvalidArgument, where gRPC
// would fail with INTERNAL "error while marshaling".
func TestRefusesWhatCannotBeEncoded(t *testing.T) {
	f := &fakeIndex{name: "p"}
	addr, _ := serve(t, f)
	c := newClient(t, addr)
	ctx := context.Background()
	bad := "bad\xffname"
	rec := PartitionOffset{Topic: "t"}
	for _, tc := range []struct {
		name    string
		call    func() error
		wantMsg string
	}{
		{name: "lookup_model", call: func() error { _, err := c.Lookup(ctx, bad, []uint64{1}); return err }, wantMsg: "model"},
		{name: "lookup_candidate_pod", call: func() error {
			_, err := c.Lookup(ctx, "m", []uint64{1}, WithCandidates(Endpoint{Pod: "ok"}, Endpoint{Pod: bad}))
			return err
		}, wantMsg: "candidate 1"},
		{name: "lookup_barrier_topic", call: func() error {
			_, err := c.Lookup(ctx, "m", []uint64{1}, WithBarrier(0, rec, PartitionOffset{Topic: bad}))
			return err
		}, wantMsg: "barrier record 1"},
		{name: "list_model", call: func() error { _, err := c.ListEndpoints(ctx, bad); return err }, wantMsg: "model"},
		{name: "list_page_token", call: func() error { _, err := c.ListEndpointsPage(ctx, "m", 0, bad); return err }, wantMsg: "page token"},
		{name: "list_negative_page_size", call: func() error { _, err := c.ListEndpointsPage(ctx, "m", -1, ""); return err }, wantMsg: "page size -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if !errors.Is(err, ErrInvalidArgument) || status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("error = %v, want ErrInvalidArgument naming %q", err, tc.wantMsg)
			}
		})
	}
	if n := f.calls.Load(); n != 0 {
		t.Fatalf("the server saw %d calls, want none", n)
	}
}

// TestUnresolvableHostIsNamed: a host name that does not resolve fails
// UNAVAILABLE with a message naming the host and the resolver's answer,
// not gRPC's bare "no children to pick from".
func TestUnresolvableHostIsNamed(t *testing.T) {
	for _, tc := range []struct{ name, target string }{
		{name: "host_port", target: "nohost.invalid:1"},
		{name: "dns_target", target: "dns:///nohost.invalid:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient(t, tc.target, WithMaxAttempts(1))
			_, err := c.Lookup(context.Background(), "m", []uint64{1})
			if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), `no indexd address for host "nohost.invalid"`) {
				t.Fatalf("error = %v, want ErrUnavailable naming the host", err)
			}
			t.Log(err)
		})
	}
}
