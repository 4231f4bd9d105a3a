package ingester

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
)

// batchRecord encodes one batch of evs as a record of pod at time at.
func batchRecord(t *testing.T, model, pod string, at time.Time, evs ...events.Event) refmodel.Record {
	t.Helper()
	v, err := events.Encode(events.Batch{TS: float64(at.UnixNano()) / 1e9, Events: evs}, events.EncodingMap)
	if err != nil {
		t.Fatal(err)
	}
	return refmodel.Record{Key: pod, Headers: map[string]string{"model": model}, Value: v, Time: at}
}

func chain(n int, seed uint64) []uint64 {
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = seed*1_000_003 + uint64(i)*0x9e3779b97f4a7c15
	}
	return hs
}

// TestLargeEvents: 1000- and 5000-block events land whole through an etcd
// that allows only 128 ops per transaction (chunks of 8: a 5000-block
// window is 625 chunk puts, split into parts), their chunk keys spread
// over lease shards of bounded size; removals and a clear empty them.
func TestLargeEvents(t *testing.T) {
	t.Parallel()
	const topic = "large"
	e := newEnv(t, 1, []string{topic}, testutil.WithMaxTxnOps(128))
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(60*time.Second))
	defer cancel()
	cfg := e.config(t, topic, "g-large", "/kvindex/large/")
	cfg.MaxTxnOps = 128
	cfg.KeysPerLease = 100
	cfg.ChunkSize = 8
	start(t, cfg)

	const model = "m"
	now := time.Now()
	h1000, h5000 := chain(1000, 1), chain(5000, 2)
	toks := make([]int64, 16*5000)
	steps := [][]refmodel.Record{
		{batchRecord(t, model, "pod-a", now, events.Event{Type: events.BlockStored, BlockHashes: h1000, TokenIDs: toks[:16*1000], BlockSize: 16, Medium: "GPU"})},
		{batchRecord(t, model, "pod-b", now, events.Event{Type: events.BlockStored, BlockHashes: h5000, TokenIDs: toks, BlockSize: 16, Medium: "GPU"})},
		{batchRecord(t, model, "pod-b", now, events.Event{Type: events.BlockRemoved, BlockHashes: h5000[2500:], Medium: "GPU"})},
		{batchRecord(t, model, "pod-b", now, events.Event{Type: events.AllBlocksCleared}),
			batchRecord(t, model, "pod-a", now, events.Event{Type: events.BlockStored, BlockHashes: h5000, Medium: "CPU"})},
	}
	wantCounts := []map[string]int{
		{"pod-a": 1000},
		{"pod-a": 1000, "pod-b": 5000},
		{"pod-a": 1000, "pod-b": 2500},
		{"pod-a": 6000},
	}
	m := refmodel.New(refmodel.Config{LivenessWindow: cfg.LivenessWindow})
	for i, recs := range steps {
		for _, r := range recs {
			m.Apply(r)
		}
		ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic, ingesttest.Produce(t, ctx, e.prod, topic, recs))
		blocks := ingesttest.Blocks(t, ctx, e.etcd.Client, cfg.Keyspace)
		counts := map[string]int{}
		for _, b := range blocks {
			counts[b.Endpoint.Pod]++
		}
		if diff := cmp.Diff(wantCounts[i], counts); diff != "" {
			t.Fatalf("step %d: blocks per pod (-want +got):\n%s", i, diff)
		}
		if diff := cmp.Diff(m.Blocks(), blocks, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("step %d: etcd differs from the reference model (-model +etcd):\n%s", i, diff)
		}
		if got := refmodel.LookupBlocks(blocks, model, h1000); len(got) != 1 || got[0].Blocks != 1000 {
			t.Fatalf("step %d: lookup of the 1000-block prefix = %+v", i, got)
		}
	}

	// Every chunk key of a tier hangs on a lease of that (endpoint, tier),
	// none holding more than KeysPerLease keys plus one transaction's worth.
	kvs, err := ingesttest.KVs(ctx, e.etcd.Client, cfg.Keyspace.ChunksPrefix())
	if err != nil {
		t.Fatal(err)
	}
	perLease := map[int64]int{}
	for _, kv := range kvs {
		if kv.Lease == 0 {
			t.Fatalf("chunk key %s has no lease", kv.Key)
		}
		perLease[kv.Lease]++
	}
	if len(perLease) < 6 {
		t.Errorf("750 chunk keys on %d leases, want at least 6 with KeysPerLease 100", len(perLease))
	}
	for id, n := range perLease {
		if n > cfg.KeysPerLease+cfg.MaxTxnOps {
			t.Errorf("lease %x holds %d keys, limit %d", id, n, cfg.KeysPerLease)
		}
	}
	recs := ingesttest.Endpoints(t, ctx, e.etcd.Client, cfg.Keyspace)
	a := recs[keyspace.Endpoint{Model: model, Pod: "pod-a"}]
	for id := range perLease {
		found := false
		for _, shards := range a.TierLeases {
			for _, s := range shards {
				found = found || int64(s.ID) == id
			}
		}
		if !found {
			t.Errorf("lease %x holds keys but is not recorded in the endpoint record %+v", id, a.TierLeases)
		}
	}
	if resp, err := e.etcd.Client.TimeToLive(ctx, clientv3.LeaseID(a.Lease)); err != nil || resp.TTL <= 0 {
		t.Errorf("endpoint record lease %v: ttl %v, %v", a.Lease, resp, err)
	}
}
