package ingester

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
)

// TestDropOfLongKeysFitsTheReceiveLimit clears 10,000 blocks of an
// endpoint whose model is 89 CJK characters (801 bytes escaped, so the
// default page of 10,000 keys lists about 8.5 MB, over gRPC's 4 MiB
// receive limit, which etcd refused with RESOURCE_EXHAUSTED forever). The
// listing pages are bounded by bytes too: the clear lands, and no etcd
// call failed permanently.
func TestDropOfLongKeysFitsTheReceiveLimit(t *testing.T) {
	const topic = "long-drop"
	model := strings.Repeat("語", 89)
	if n := len(url.PathEscape(model)); n != 801 {
		t.Fatalf("escaped model is %d bytes, want 801", n)
	}
	pod := "team-a/" + strings.Repeat("p", 200)
	e := newEnv(t, 1, []string{topic})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(90*time.Second))
	defer cancel()
	cfg := e.config(t, topic, "g-long-drop", "/kvindex/long-drop/")
	r := start(t, cfg)
	now := time.Now()
	hashes := chain(10_000, 7)
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic, ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{
		batchRecord(t, model, pod, now, events.Event{Type: events.BlockStored, BlockHashes: hashes, Medium: "GPU", BlockSize: 16}),
	}))
	prefix := cfg.Keyspace.EndpointBlocksPrefix(keyspace.Endpoint{Model: model, Pod: pod})
	count := func() int64 {
		resp, err := e.etcd.Client.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count
	}
	if n := count(); n != 10_000 {
		t.Fatalf("%d block keys stored, want 10000", n)
	}
	if per := int64(len(prefix) + 20); per*int64(cfg.DropPageSize) < 4<<20 {
		t.Fatalf("a page of %d keys of %d bytes is under 4 MiB: the test does not test the limit", cfg.DropPageSize, per)
	}

	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic, ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{
		batchRecord(t, model, pod, now, events.Event{Type: events.AllBlocksCleared}),
	}))
	if n := count(); n != 0 {
		t.Fatalf("%d block keys left after AllBlocksCleared, want 0", n)
	}
	if n := promtest.ToFloat64(r.in.m.etcdFailures.WithLabelValues("range")); n != 0 {
		t.Fatalf("etcd_failures_total{op=range} = %v, want 0", n)
	}
}

func TestDropPageKeys(t *testing.T) {
	for _, tc := range []struct {
		name      string
		pageSize  int
		prefixLen int
		want      int64
	}{
		{"short_names_keep_the_page_size", 10_000, 60, 10_000},
		{"long_names_bounded_by_bytes", 10_000, 1_100, 2 << 20 / (1_100 + 32 + 64)},
		{"longest_names_still_list_a_key", 10_000, 5 << 20, 1},
		{"smaller_page_size_wins", 20, 1_100, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := dropPageKeys(tc.pageSize, strings.Repeat("k", tc.prefixLen)); got != tc.want {
				t.Fatalf("dropPageKeys = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestPermanentEtcdError(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"receive_limit", status.Error(codes.ResourceExhausted, "grpc: received message larger than max (8500000 vs. 4194304)"), true},
		{"request_too_large", rpctypes.ErrGRPCRequestTooLarge, true},
		{"invalid_argument", status.Error(codes.InvalidArgument, "bad"), true},
		{"permission_denied", rpctypes.ErrGRPCPermissionDenied, true},
		{"too_many_requests_passes", rpctypes.ErrGRPCRequestTooManyRequests, false},
		{"no_leader", rpctypes.ErrGRPCNoLeader, false},
		{"unavailable", status.Error(codes.Unavailable, "connection refused"), false},
		{"timeout", rpctypes.ErrGRPCTimeout, false},
		{"plain", errors.New("something"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := permanentEtcdError(tc.err); got != tc.want {
				t.Fatalf("permanentEtcdError(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
