package ingester

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
)

// TestClaimDropsWhatNoWriterLeaves: an endpoint whose record does not
// decode (here a chunk_next past 2^63), or whose chunk sequences are near
// keyspace.MaxChunkSeq (a full chunk at 2^63-1, chunk_next 2^63: both
// valid, but the next open would pass the maximum), is dropped at the
// claim, chunks and record, and its next records start it afresh. Before,
// the first case skipped the endpoint, and the second opened chunk 2^63,
// which the next claim refused: either way a later store wrote a new chunk
// 0 over the blocks etcd held there, and the chunks past it stayed where
// no removal reached them (ghost blocks).
func TestClaimDropsWhatNoWriterLeaves(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		tamper func(t *testing.T, ctx context.Context, e *env, ks keyspace.Keyspace, topic string, rec keyspace.EndpointRecord, lease clientv3.LeaseID)
	}{
		{"chunk_next_past_max", func(t *testing.T, ctx context.Context, e *env, ks keyspace.Keyspace, topic string, rec keyspace.EndpointRecord, lease clientv3.LeaseID) {
			bad := []byte(`{"block_size":16,"hash_mode":"engine","last_record":"` + rec.LastRecord.Format(time.RFC3339Nano) + `","topic":"` + topic + `","partition":0,"lease":"` + rec.Lease.String() + `","chunk_next":{"gpu":9223372036854775809}}`)
			if _, err := keyspace.UnmarshalEndpointRecord(bad); err == nil {
				t.Fatal("the tampered record decodes; the case needs one that does not")
			}
			if _, err := e.etcd.Client.Put(ctx, ks.EndpointKey(keyspace.Endpoint{Model: "m", Pod: "a"}), string(bad), clientv3.WithLease(lease)); err != nil {
				t.Fatal(err)
			}
		}},
		{"sequence_near_max", func(t *testing.T, ctx context.Context, e *env, ks keyspace.Keyspace, topic string, rec keyspace.EndpointRecord, lease clientv3.LeaseID) {
			id := keyspace.Endpoint{Model: "m", Pod: "a"}
			full := keyspace.AppendChunkValue(nil, []keyspace.ChunkEntry{{Key: 20}, {Key: 21}, {Key: 22}, {Key: 23}}, false)
			if _, err := e.etcd.Client.Put(ctx, ks.ChunkKey(id, tier.GPU, keyspace.MaxChunkSeq), string(full), clientv3.WithLease(lease)); err != nil {
				t.Fatal(err)
			}
			good := []byte(`{"block_size":16,"hash_mode":"engine","last_record":"` + rec.LastRecord.Format(time.RFC3339Nano) + `","topic":"` + topic + `","partition":0,"lease":"` + rec.Lease.String() + `","chunk_next":{"gpu":9223372036854775808}}`)
			if _, err := keyspace.UnmarshalEndpointRecord(good); err != nil {
				t.Fatalf("the record at chunk_next 2^63 does not decode: %v", err)
			}
			if _, err := e.etcd.Client.Put(ctx, ks.EndpointKey(id), string(good), clientv3.WithLease(lease)); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			topic := "claimdrop-" + tc.name
			e := newEnv(t, 1, []string{topic})
			ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(40*time.Second))
			defer cancel()
			cfg := e.config(t, topic, "g-"+topic, "/kvindex/claimdrop/")
			cfg.ChunkSize, cfg.ChunkMergeBelow, cfg.ChunkOpenAt = 4, 1, 4
			ks := cfg.Keyspace
			id := keyspace.Endpoint{Model: "m", Pod: "a"}
			now := time.Now()
			end := ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{store(t, "a", now, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)})
			r := start(t, cfg)
			ingesttest.WaitApplied(t, ctx, e.etcd.Client, ks, topic, end)
			if err := r.stop(); err != nil {
				t.Fatal(err)
			}
			if n := len(ingesttest.Chunks(t, ctx, e.etcd.Client, ks)); n != 3 {
				t.Fatalf("%d chunks after 10 stores at chunk size 4, want 3", n)
			}
			resp, err := e.etcd.Client.Get(ctx, ks.EndpointKey(id))
			if err != nil || len(resp.Kvs) != 1 {
				t.Fatalf("endpoint record: %v, %v", resp, err)
			}
			rec, err := keyspace.UnmarshalEndpointRecord(resp.Kvs[0].Value)
			if err != nil {
				t.Fatal(err)
			}
			tc.tamper(t, ctx, e, ks, topic, rec, clientv3.LeaseID(resp.Kvs[0].Lease))
			// The offset put again, so the tampered state is the state at
			// the stored offset's revision.
			reputOffset(t, ctx, e, ks, topic)

			end = ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{
				store(t, "a", now, 11),
				batchRecord(t, "m", "a", now, events.Event{Type: events.BlockRemoved, BlockHashes: []uint64{9, 10}, Medium: "GPU"}),
			})
			start(t, cfg)
			ingesttest.WaitApplied(t, ctx, e.etcd.Client, ks, topic, end)
			got := chunkedKeys(t, ctx, e, ks)
			if !slices.Equal(got, []uint64{11}) {
				t.Fatalf("blocks in etcd %v, want [11]: the endpoint dropped at the claim, then block 11 stored (9 and 10 removed)", got)
			}
			resp, err = e.etcd.Client.Get(ctx, ks.EndpointKey(id))
			if err != nil || len(resp.Kvs) != 1 {
				t.Fatalf("endpoint record after: %v, %v", resp, err)
			}
			if _, err := keyspace.UnmarshalEndpointRecord(resp.Kvs[0].Value); err != nil {
				t.Fatalf("the record written afresh does not decode: %v", err)
			}
		})
	}
}

// TestNewEndpointClearsForeignChunks: chunk keys under an endpoint the
// claim did not read (no record at all, or a record whose member key is
// gone) are deleted with the endpoint's first write. Before, its first
// store wrote chunk 0 over one of them and the rest stayed where no
// removal reached them: block 104 below survived its removal, a ghost.
func TestNewEndpointClearsForeignChunks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		record  bool // a record of the endpoint, without its member key
		goodbye bool // the endpoint says goodbye right after its store
	}{{"no_record", false, false}, {"record_without_member_key", true, false}, {"goodbye_in_the_same_window", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			topic := "foreign-" + tc.name
			e := newEnv(t, 1, []string{topic})
			ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(40*time.Second))
			defer cancel()
			cfg := e.config(t, topic, "g-"+topic, "/kvindex/foreign/")
			cfg.ChunkSize, cfg.ChunkMergeBelow, cfg.ChunkOpenAt = 4, 1, 4
			ks := cfg.Keyspace
			id := keyspace.Endpoint{Model: "m", Pod: "o"}
			put := func(k string, v []byte) {
				t.Helper()
				if _, err := e.etcd.Client.Put(ctx, k, string(v)); err != nil {
					t.Fatal(err)
				}
			}
			chunk := func(seq uint64, keys ...uint64) {
				es := make([]keyspace.ChunkEntry, len(keys))
				for i, k := range keys {
					es[i] = keyspace.ChunkEntry{Key: k}
				}
				put(ks.ChunkKey(id, tier.GPU, seq), keyspace.AppendChunkValue(nil, es, false))
			}
			chunk(0, 100, 101, 102, 103)
			chunk(1, 104)
			chunk(3, 105)
			if tc.record {
				put(ks.EndpointKey(id), []byte(`{"block_size":16,"hash_mode":"engine","last_record":"2026-12-01T12:00:00Z","topic":"`+topic+`","partition":0,"lease":"0","chunk_next":{"gpu":4}}`))
			}
			now := time.Now()
			recs := []refmodel.Record{
				store(t, "o", now, 200),
				batchRecord(t, "m", "o", now, events.Event{Type: events.BlockRemoved, BlockHashes: []uint64{104}, Medium: "GPU"}),
			}
			want := []uint64{200}
			if tc.goodbye {
				// Produced together, so most often one window: the keys
				// must go whether or not the drop shares the store's
				// window (a replay after a crash may join what a run
				// without one wrote apart).
				recs = append(recs, refmodel.Record{Key: "o", Headers: map[string]string{"model": "m", "kind": "goodbye"}, Time: now})
				want = nil
			}
			end := ingesttest.Produce(t, ctx, e.prod, topic, recs)
			start(t, cfg)
			ingesttest.WaitApplied(t, ctx, e.etcd.Client, ks, topic, end)
			got := chunkedKeys(t, ctx, e, ks)
			if !slices.Equal(got, want) {
				t.Fatalf("blocks in etcd %v, want %v: the chunks no claim read deleted with the endpoint's first write", got, want)
			}
		})
	}
}

// TestClaimReleasesUnleasedChunks: chunks a claim finds on no lease (a
// restore that dropped leases, an operator's put) are rewritten onto one
// of their tier's leases before the first record, so they go when the
// endpoint's leases do. Before, only a chunk a later record rewrote got a
// lease; the others outlived the ingesters and the record, ghosts.
func TestClaimReleasesUnleasedChunks(t *testing.T) {
	t.Parallel()
	const topic = "unleased"
	e := newEnv(t, 1, []string{topic})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(40*time.Second))
	defer cancel()
	cfg := e.config(t, topic, "g-"+topic, "/kvindex/unleased/")
	cfg.ChunkSize, cfg.ChunkMergeBelow, cfg.ChunkOpenAt = 4, 1, 4
	ks := cfg.Keyspace
	id := keyspace.Endpoint{Model: "m", Pod: "a"}
	end := ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{store(t, "a", time.Now(), 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)})
	r := start(t, cfg)
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, ks, topic, end)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	// Chunks 0 and 1 put back as they are, on no lease; the offset put
	// again, so that is the state at the stored offset's revision.
	for _, seq := range []uint64{0, 1} {
		resp, err := e.etcd.Client.Get(ctx, ks.ChunkKey(id, tier.GPU, seq))
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("chunk %d: %v, %v", seq, resp, err)
		}
		if _, err := e.etcd.Client.Put(ctx, string(resp.Kvs[0].Key), string(resp.Kvs[0].Value)); err != nil {
			t.Fatal(err)
		}
	}
	reputOffset(t, ctx, e, ks, topic)

	start(t, cfg)
	ingesttest.WaitFor(t, ctx, e.etcd.Client, ks.ChunksPrefix(), "every chunk on one of its record's leases", func() bool {
		rec, err := e.etcd.Client.Get(ctx, ks.EndpointKey(id))
		if err != nil || len(rec.Kvs) != 1 {
			return false
		}
		r, err := keyspace.UnmarshalEndpointRecord(rec.Kvs[0].Value)
		if err != nil {
			return false
		}
		held := map[int64]bool{}
		for _, s := range r.Shards(tier.GPU) {
			held[int64(s.ID)] = true
		}
		resp, err := e.etcd.Client.Get(ctx, ks.EndpointChunksPrefix(id), clientv3.WithPrefix())
		if err != nil || len(resp.Kvs) != 3 {
			return false
		}
		for _, kv := range resp.Kvs {
			if !held[kv.Lease] {
				return false
			}
		}
		return true
	})
	if n := blockCount(t, ctx, e, ks, id); n != 10 {
		t.Fatalf("%d blocks after the rewrite, want the 10 stored", n)
	}
}

// TestClaimRepairsManyEndpoints: a claim that must rewrite more endpoints
// than one transaction holds records for (here every chunk of 40
// endpoints found on no lease, at etcd's --max-txn-ops 32) writes them in
// several windows. Before, it packed them into one and the transaction
// builder ran past its arrays: the ingester panicked.
func TestClaimRepairsManyEndpoints(t *testing.T) {
	t.Parallel()
	const topic, pods = "many", 40
	e := newEnv(t, 1, []string{topic}, testutil.WithMaxTxnOps(32))
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(40*time.Second))
	defer cancel()
	cfg := e.config(t, topic, "g-"+topic, "/kvindex/many/")
	cfg.MaxTxnOps = 32
	ks := cfg.Keyspace
	now := time.Now()
	var recs []refmodel.Record
	for i := range pods {
		recs = append(recs, store(t, fmt.Sprintf("p%02d", i), now, uint64(i+1)))
	}
	end := ingesttest.Produce(t, ctx, e.prod, topic, recs)
	r := start(t, cfg)
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, ks, topic, end)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	resp, err := e.etcd.Client.Get(ctx, ks.ChunksPrefix(), clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != pods {
		t.Fatalf("chunks: %d, %v; want %d", len(resp.Kvs), err, pods)
	}
	for _, kv := range resp.Kvs {
		if _, err := e.etcd.Client.Put(ctx, string(kv.Key), string(kv.Value)); err != nil {
			t.Fatal(err)
		}
	}
	reputOffset(t, ctx, e, ks, topic)

	start(t, cfg)
	ingesttest.WaitFor(t, ctx, e.etcd.Client, ks.ChunksPrefix(), "every chunk on a lease again", func() bool {
		resp, err := e.etcd.Client.Get(ctx, ks.ChunksPrefix(), clientv3.WithPrefix())
		if err != nil || len(resp.Kvs) != pods {
			return false
		}
		for _, kv := range resp.Kvs {
			if kv.Lease == 0 {
				return false
			}
		}
		return true
	})
}

// reputOffset puts topic's partition 0 offset again, unchanged, so the
// state a test has just written by hand is the state at the stored
// offset's revision, which the next claim rebuilds from.
func reputOffset(t *testing.T, ctx context.Context, e *env, ks keyspace.Keyspace, topic string) {
	t.Helper()
	off, err := e.etcd.Client.Get(ctx, ks.OffsetKey(keyspace.Partition{Topic: topic}))
	if err != nil || len(off.Kvs) != 1 {
		t.Fatalf("offset: %v, %v", off, err)
	}
	if _, err := e.etcd.Client.Put(ctx, string(off.Kvs[0].Key), string(off.Kvs[0].Value)); err != nil {
		t.Fatal(err)
	}
}

// chunkedKeys lists the key hashes of every chunk under ks, in chunk key
// order, then entry order.
func chunkedKeys(t *testing.T, ctx context.Context, e *env, ks keyspace.Keyspace) []uint64 {
	t.Helper()
	var got []uint64
	for _, c := range ingesttest.Chunks(t, ctx, e.etcd.Client, ks) {
		for _, en := range c.Entries {
			got = append(got, en.Key)
		}
	}
	return got
}
