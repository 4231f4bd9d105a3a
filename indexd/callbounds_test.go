package indexd

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/internal/testutil"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// TestRequestlessCallsFreeTheirSlots: with both ports at two connection
// slots, two clients that open a Lookup and never send its request, and
// two that open a health Watch on the health port, no longer lock a
// router and the kubelet out. The request-less calls are cancelled after
// RequestReadTimeout (counted), their connections then go idle and close,
// and the health port refuses Watch (Check only). Before, a call waiting
// for its request kept its connection from ever being idle, so the slots
// were held until MaxConnectionAge (30 min): a hostile test saw both
// probes fail.
func TestRequestlessCallsFreeTheirSlots(t *testing.T) {
	e := testutil.StartEtcd(t)
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := startReplica(t, e.Client, func(c *Config) {
		c.MaxConnections, c.HealthMaxConnections, c.HealthListener = 2, 2, hl
		c.MaxConnectionIdle, c.RequestReadTimeout = 300*time.Millisecond, 300*time.Millisecond
	})
	r.waitServing(t)
	r.conn.Close() // the helper's own connection frees its slot
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	dial := func(addr string) *grpc.ClientConn {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	var held []grpc.ClientStream
	for range 2 {
		cs, err := dial(r.srv.Addr().String()).NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, "/kvindex.v1.IndexService/Lookup")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, cs)
		st, err := healthpb.NewHealthClient(dial(hl.Addr().String())).Watch(ctx, &healthpb.HealthCheckRequest{})
		if err == nil {
			_, err = st.Recv()
		}
		if status.Code(err) != codes.Unimplemented {
			t.Fatalf("health Watch on the health port: %v, want UNIMPLEMENTED (Check only)", err)
		}
	}
	for _, cs := range held {
		// The server cancels the call: its answer is CANCELED.
		if err := cs.RecvMsg(new(kvindexv1.LookupResponse)); status.Code(err) != codes.Canceled {
			t.Fatalf("a call that never sent its request: %v, want CANCELED after RequestReadTimeout", err)
		}
	}
	if n := r.counter(t, r.srv.m.requestReadTimeouts); n != 2 {
		t.Fatalf("request_read_timeouts_total = %v, want 2", n)
	}
	probe := func(addr string) error {
		pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
		defer pcancel()
		_, err := healthpb.NewHealthClient(dial(addr)).Check(pctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		return err
	}
	if err := probe(hl.Addr().String()); err != nil {
		t.Errorf("a kubelet probe of the health port: %v", err)
	}
	if err := probe(r.srv.Addr().String()); err != nil {
		t.Errorf("a router's call on the API port: %v", err)
	}
}

// TestLargeMetadataRefused: a call whose metadata is past
// MaxMetadataBytes fails before any handler runs; one under it is
// answered. Before, grpc-go's default of 16 MiB per call applied, and 24
// calls of 1 MiB of metadata each held 27 MiB of a replica's heap.
func TestLargeMetadataRefused(t *testing.T) {
	e := testutil.StartEtcd(t)
	r := startReplica(t, e.Client, func(c *Config) { c.MaxMetadataBytes = 16 << 10 })
	r.waitServing(t)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	call := func(n int) error {
		mctx := metadata.AppendToOutgoingContext(ctx, "x-pad", strings.Repeat("x", n))
		_, err := kvindexv1.NewIndexServiceClient(r.conn).Lookup(mctx, &kvindexv1.LookupRequest{Model: "m", BlockHashes: []uint64{1}})
		return err
	}
	if err := call(1 << 10); err != nil {
		t.Fatalf("a call with 1 KiB of metadata: %v", err)
	}
	if err := call(64 << 10); err == nil {
		t.Fatal("a call with 64 KiB of metadata was answered past MaxMetadataBytes 16 KiB")
	}
	if n := r.counter(t, r.srv.m.requests.WithLabelValues("Lookup", codes.OK.String())); n != 1 {
		t.Fatalf("Lookups handled = %v, want 1 (the refused call reaches no handler)", n)
	}
}

// TestCodecRefusesBeforeDecoding: a Lookup past a count limit, or any
// request past MaxRequestBytes, is refused by the codec from its wire
// bytes with the message of the decoded request's check, and nothing is
// decoded. Before, an 8 MiB request of empty candidates (2 bytes each)
// was decoded first, allocating 440 MiB, only to be refused by size.
func TestCodecRefusesBeforeDecoding(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxCandidates, cfg.MaxBarrierRecords, cfg.MaxMultiModalItems, cfg.MaxTokens, cfg.MaxRequestBytes = 3, 2, 1, 4, 1<<10
	codec := newDeferredCodec(cfg)
	repeat := func(field []byte, n int) []byte {
		var b []byte
		for range n {
			b = append(b, field...)
		}
		return b
	}
	sub := func(num byte, body []byte) []byte { return append([]byte{num<<3 | 2, byte(len(body))}, body...) }
	for _, tc := range []struct {
		name string
		wire []byte
		want string // "" for a request decoded as usual
	}{
		{"candidates_at_the_limit", repeat([]byte{0x1a, 0x00}, 3), ""},
		{"candidates_past_it", repeat([]byte{0x1a, 0x00}, 4), "candidates has 4 endpoints, the limit is 3"},
		{"records_past_it", sub(4, repeat([]byte{0x0a, 0x00}, 3)), "barrier has 3 records, the limit is 2"},
		{"records_in_two_barriers", append(sub(4, []byte{0x0a, 0x00, 0x0a, 0x00}), sub(4, []byte{0x0a, 0x00})...), "barrier has 3 records, the limit is 2"},
		{"items_past_it", sub(5, repeat([]byte{0x22, 0x00}, 2)), "tokens.multimodal_items has 2 items, the limit is 1"},
		{"packed_tokens_past_it", sub(5, sub(1, []byte{1, 2, 0x80, 0x01, 3, 4})), "tokens.token_ids has 5 tokens, the limit is 4"},
		{"packed_tokens_at_it", sub(5, sub(1, []byte{1, 2, 0x80, 0x01, 3})), ""},
		{"unpacked_tokens_past_it", sub(5, repeat([]byte{0x08, 0x07}, 5)), "tokens.token_ids has 5 tokens, the limit is 4"},
		{"past_max_request_bytes", append([]byte{0x0a, 0x01, 'm'}, repeat([]byte{0x11, 1, 2, 3, 4, 5, 6, 7, 8}, 120)...), "request is 1083 bytes, the limit is 1024 bytes (--max-request-bytes)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := &kvindexv1.LookupRequest{}
			d := &deferred{msg: req}
			if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(tc.wire)}, d); err != nil {
				t.Fatal(err)
			}
			if tc.want == "" {
				if d.refused != nil || d.err != nil {
					t.Fatalf("refused %v, decoding error %v; want the request decoded", d.refused, d.err)
				}
				return
			}
			if d.refused == nil || !strings.Contains(d.refused.Error(), tc.want) || !errors.Is(d.refused, ErrInvalidArgument) {
				t.Fatalf("refused = %v, want ErrInvalidArgument containing %q", d.refused, tc.want)
			}
			if len(req.Candidates) != 0 || req.Barrier != nil || req.Tokens != nil || len(req.BlockHashes) != 0 {
				t.Fatalf("the refused request was decoded: %v", req)
			}
		})
	}
}

// TestCountLimitAnsweredInvalidArgument: through gRPC, a Lookup of more
// candidates than MaxCandidates, empty ones, is INVALID_ARGUMENT with the
// decoded check's message.
func TestCountLimitAnsweredInvalidArgument(t *testing.T) {
	e := testutil.StartEtcd(t)
	r := startReplica(t, e.Client)
	r.waitServing(t)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	body := []byte{0x0a, 0x01, 'm'}
	for range DefaultMaxCandidates + 1 {
		body = append(body, 0x1a, 0x00)
	}
	var reply []byte
	err := r.conn.Invoke(ctx, "/kvindex.v1.IndexService/Lookup", body, &reply, grpc.ForceCodecV2(rawCodec{}))
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "candidates has 4097 endpoints, the limit is 4096") {
		t.Fatalf("Lookup of 4097 empty candidates: %v, want INVALID_ARGUMENT naming the limit", err)
	}
}

// TestUnknownMethodIsNoReadTimeout: a call to an unknown method (a
// scanner, a client pointed at the health port, a typo) is answered
// UNIMPLEMENTED without reaching a handler, so it gets no stats.End; its
// stream's end stops requestRead's timer. Before, the timer fired
// RequestReadTimeout later, counting a request-read timeout for a call
// answered at once, and held the call's context and metadata until then.
func TestUnknownMethodIsNoReadTimeout(t *testing.T) {
	cfg := DefaultConfig()
	cfg.RequestReadTimeout = 200 * time.Millisecond
	var timedOut atomic.Int64
	srv := grpc.NewServer(connOptions(cfg, func() { timedOut.Add(1) })...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	// Lookup on a port without the IndexService (the health port).
	err = conn.Invoke(ctx, "/kvindex.v1.IndexService/Lookup", &healthpb.HealthCheckRequest{}, new(healthpb.HealthCheckResponse))
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("unknown method: %v", err)
	}
	time.Sleep(3 * cfg.RequestReadTimeout)
	if n := timedOut.Load(); n != 0 {
		t.Fatalf("request_read_timeouts counted %d for an answered UNIMPLEMENTED call (and a Check)", n)
	}
}
