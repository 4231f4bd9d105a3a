package bench

import (
	"context"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/tier"
)

// TestColdStartLayouts checks what the cold start loads: both etcds hold
// exactly the entries TraceEntries produces, the v2 one in full chunks of
// ChunkSize but each endpoint's last, sequence numbers from 0 in
// insertion order, entries of the mode's width; the v1 reader's list reads
// every v1 key; the reference Gets return every key. The v2 indexd's time
// to ready needs an indexd that reads chunks and is not
// run here.
func TestColdStartLayouts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n, endpoints, chunk = 3000, 4, 64
	trace := loadTestTrace(t)
	run, err := PrepareColdStart(ctx, ColdStartConfig{Trace: trace, Entries: n, Endpoints: endpoints, ChunkSize: chunk})
	if err != nil {
		t.Fatal(err)
	}
	defer run.Close()
	src, err := NewTraceEntries(trace, endpoints)
	if err != nil {
		t.Fatal(err)
	}
	var want []keyspace.Block
	order := map[keyspace.Endpoint][]uint64{}
	src.Each(n, func(ep keyspace.Endpoint, h uint64) bool {
		want = append(want, keyspace.Block{Endpoint: ep, Tier: tier.GPU, Hash: h})
		order[ep] = append(order[ep], h)
		return true
	})
	refmodel.SortBlocks(want)
	ks := keyspace.Default()
	for name, node := range map[string]*etcdNode{"v2": run.v2, "v1": run.v1} {
		got, err := readState(ctx, node.cli, ks)
		if err != nil {
			t.Fatal(err)
		}
		if diff := gocmp.Diff(want, got); diff != "" {
			t.Fatalf("%s layout holds (-want +got):\n%s", name, diff)
		}
	}
	// The v2 chunks, endpoint by endpoint, in key (= sequence) order.
	resp, err := run.v2.cli.Get(ctx, ks.ChunksPrefix(), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != run.Result.Chunks {
		t.Fatalf("%d chunk keys, the load counted %d", len(resp.Kvs), run.Result.Chunks)
	}
	got := map[keyspace.Endpoint][]uint64{}
	for _, kv := range resp.Kvs {
		c, err := ks.ParseChunkKey(string(kv.Key))
		if err != nil {
			t.Fatal(err)
		}
		v, err := keyspace.ParseChunkValue(kv.Value)
		if err != nil {
			t.Fatal(err)
		}
		if c.Seq != uint64(len(got[c.Endpoint])/chunk) || !v.HasEngine() {
			t.Fatalf("chunk %s: seq %d after %d entries, engine hashes %v (token mode)", kv.Key, c.Seq, len(got[c.Endpoint]), v.HasEngine())
		}
		if v.Len() != chunk && len(got[c.Endpoint])+v.Len() != len(order[c.Endpoint]) {
			t.Fatalf("chunk %s holds %d entries and is not its endpoint's last", kv.Key, v.Len())
		}
		for i := range v.Len() {
			got[c.Endpoint] = append(got[c.Endpoint], v.Key(i))
		}
	}
	if diff := gocmp.Diff(order, got); diff != "" {
		t.Fatalf("insertion order per endpoint (-want +got):\n%s", diff)
	}
	if _, err := timeV1List(ctx, run.v1, ks, n); err != nil {
		t.Fatal(err)
	}
	if _, size, err := timeGet(ctx, run.v1, v1BlocksPrefix(ks), n); err != nil || size <= 0 {
		t.Fatalf("v1 Get: %d B, %v", size, err)
	}
	if _, size, err := timeGet(ctx, run.v2, ks.ChunksPrefix(), run.Result.Chunks); err != nil || size <= 0 {
		t.Fatalf("v2 Get: %d B, %v", size, err)
	}
}
