package indexd

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/internal/index"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/testutil"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// The server-wide budget of blocks in flight: with part of it held, a
// Lookup that does not fit fails at once with RESOURCE_EXHAUSTED naming
// the limit and its flag, one that fits answers, and the budget comes
// back when released.
func TestInFlightBlocksBound(t *testing.T) {
	const limit = 100
	e := testutil.StartEtcd(t)
	r := startReplica(t, e.Client, func(c *Config) { c.MaxHashes, c.MaxInFlightBlocks = limit, limit })
	r.waitServing(t)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	hashes := func(n int) []uint64 { return make([]uint64, n) }

	release, err := r.srv.admit(80) // as if Lookups of 80 blocks were being answered
	if err != nil {
		t.Fatal(err)
	}
	if got := r.counter(t, r.srv.m.inflightBlocks); got != 80 {
		t.Fatalf("inflight_blocks = %v, want 80", got)
	}
	_, err = r.api.Lookup(ctx, &kvindexv1.LookupRequest{Model: "m", BlockHashes: hashes(21)})
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("Lookup past the budget: %v, want RESOURCE_EXHAUSTED", err)
	}
	for _, want := range []string{"the limit is 100 blocks", "--max-inflight-blocks"} {
		if !strings.Contains(st.Message(), want) {
			t.Errorf("message %q lacks %q", st.Message(), want)
		}
	}
	if _, err := r.api.Lookup(ctx, &kvindexv1.LookupRequest{Model: "m", BlockHashes: hashes(20)}); err != nil {
		t.Fatalf("Lookup that fits: %v", err)
	}
	release()
	if _, err := r.api.Lookup(ctx, &kvindexv1.LookupRequest{Model: "m", BlockHashes: hashes(limit)}); err != nil {
		t.Fatalf("largest Lookup after release: %v", err)
	}
	if got := r.counter(t, r.srv.m.inflightBlocks); got != 0 {
		t.Fatalf("inflight_blocks = %v after every Lookup answered, want 0", got)
	}
	r.stop()
}

func TestLookupCost(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  *kvindexv1.LookupRequest
		want int64
	}{
		{"empty_costs_one", &kvindexv1.LookupRequest{}, 1},
		{"hashes", &kvindexv1.LookupRequest{BlockHashes: make([]uint64, 8192)}, 8192},
		{"tokens_by_sixteen", &kvindexv1.LookupRequest{Tokens: &kvindexv1.TokenPrompt{TokenIds: make([]uint32, 32)}}, 2},
		{"partial_token_block_rounds_up", &kvindexv1.LookupRequest{Tokens: &kvindexv1.TokenPrompt{TokenIds: make([]uint32, 33)}}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := lookupCost(tc.req); got != tc.want {
				t.Fatalf("lookupCost = %d, want %d", got, tc.want)
			}
		})
	}
}

// A barrier timeout says which record is not applied and what is, in
// record offsets (not the next-offset convention of offsets/ keys).
func TestBarrierLagMessage(t *testing.T) {
	p := keyspace.Partition{Topic: "kvindex-events", Partition: 3}
	for _, tc := range []struct {
		name    string
		applied int64
		want    string
	}{
		{"no_offset_stored", -1, "partition kvindex-events/3: record offset 2 is not applied yet; this replica has applied no record of the partition (no offset stored)"},
		{"nothing_applied", 0, "partition kvindex-events/3: record offset 2 is not applied yet; this replica has applied no record of the partition"},
		{"one_behind", 2, "partition kvindex-events/3: record offset 2 is not applied yet; this replica has applied records up to offset 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := barrierLag(index.PartitionOffset{Partition: p, Next: 2}, tc.applied); got != tc.want {
				t.Fatalf("barrierLag = %q\nwant        %q", got, tc.want)
			}
		})
	}
}
