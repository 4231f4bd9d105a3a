package ingester

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvindex/kvindex/bridge/bridgetest"
	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
)

// TestTokenModeParentZero: parent 0 names no block on an endpoint that
// holds no block 0, so it means "no parent" (DESIGN "Hashing", parent 0);
// on an endpoint that holds a block 0 it is that block.
func TestTokenModeParentZero(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	e := newEnv(t, 1, []string{"tok-p0"})
	tr := startToken(t, e, "tok-p0", "/kvindex/tok-p0/", nil)
	toks := tokenIDs(8, 40)
	keys := client.TokenKeys(client.TokenPrompt{TokenIDs: u32(toks)}, 4)
	root := func(hashes []uint64, toks []int64) events.Event {
		ev := stored(hashes, 0, toks, 4, "GPU")
		ev.HasParent = true // parent_block_hash: 0, not nil
		return ev
	}
	a, b := &tokenPod{pod: "a"}, &tokenPod{pod: "b"}
	tr.send(t, ctx,
		a.batch(t, root([]uint64{0xa1, 0xa2}, toks)),
		// b holds a block of engine hash 0, so its parent 0 is that block.
		b.batch(t, stored([]uint64{0}, 0, toks[:4], 4, "GPU")),
		b.batch(t, root([]uint64{0xb2}, toks[4:])),
	)
	want := map[keyspace.Block]string{
		block("a", tier.GPU, keys[0]): hex16(0xa1), block("a", tier.GPU, keys[1]): hex16(0xa2),
		block("b", tier.GPU, keys[0]): hex16(0), block("b", tier.GPU, keys[1]): hex16(0xb2),
	}
	if diff := cmp.Diff(want, blockValues(t, ctx, e.etcd.Client, tr.cfg.Keyspace)); diff != "" {
		t.Errorf("blocks (-want +got):\n%s", diff)
	}
	if n := promtest.ToFloat64(tr.r.in.m.unkeyedBlocks.WithLabelValues(unkeyedParent)); n != 0 {
		t.Errorf("%v blocks unkeyed as unknown_parent, want 0", n)
	}
}

// TestTokenModeRecordedSim feeds llm-d-inference-sim's recorded array
// batches (roots with parent 0, 9-field events, evictions, a clear;
// testdata/llmd-sim) to a token-mode ingester: after each batch the
// endpoint holds exactly the blocks the expected index lists, valued with
// their engine hashes, and none is skipped as unknown_parent (169 stores
// were while parent 0 was taken for a real parent, and the index stayed
// empty).
func TestTokenModeRecordedSim(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(60*time.Second))
	defer cancel()
	rec, err := bridgetest.LoadRecording("../testdata/llmd-sim", "array")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, 1, []string{"tok-sim"})
	tr := startToken(t, e, "tok-sim", "/kvindex/tok-sim/", nil)
	for _, bt := range rec.Batches() {
		tr.send(t, ctx, refmodel.Record{Key: "sim-0", Headers: map[string]string{
			"model": tokenModel, "seq": strconv.FormatUint(bt.Seq, 10), "dp_rank": "0",
		}, Value: bt.Payload, Time: time.Now()})
		var got []string
		for _, v := range blockValues(t, ctx, e.etcd.Client, tr.cfg.Keyspace) {
			got = append(got, v)
		}
		slices.Sort(got)
		if diff := cmp.Diff(rec.ResidentAfter[bt.Seq], got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("after seq %d: engine hashes held (-expected +got):\n%s", bt.Seq, diff)
		}
	}
	for _, r := range []string{unkeyedParent, unknownRemoval} {
		if n := promtest.ToFloat64(tr.r.in.m.unkeyedBlocks.WithLabelValues(r)); n != 0 {
			t.Errorf("%v blocks counted as %s, want 0", n, r)
		}
	}
}
