package ingester

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
)

func heartbeat(pod string, at time.Time) refmodel.Record {
	return refmodel.Record{Key: pod, Headers: map[string]string{"model": "m", "kind": "heartbeat", "dp_rank": "0"}, Time: at}
}

func store(t *testing.T, pod string, at time.Time, hashes ...uint64) refmodel.Record {
	return batchRecord(t, "m", pod, at, events.Event{Type: events.BlockStored, BlockHashes: hashes, Medium: "GPU"})
}

// present reports whether pod's endpoint record exists and how many
// blocks its chunks hold.
func present(t *testing.T, ctx context.Context, e *env, ks keyspace.Keyspace, pod string) (bool, int) {
	t.Helper()
	id := keyspace.Endpoint{Model: "m", Pod: pod}
	resp, err := e.etcd.Client.Get(ctx, ks.EndpointKey(id))
	if err != nil {
		t.Fatal(err)
	}
	return len(resp.Kvs) == 1, blockCount(t, ctx, e, ks, id)
}

// shortLeases sets the shortest lease TTL the 2/3 rule allows with the
// test's session and rebalance timeouts.
func shortLeases(cfg *Config) {
	cfg.SessionTimeout = time.Second
	cfg.RebalanceTimeout = 1500 * time.Millisecond
	cfg.LeaseTTL = 5 * time.Second
}

// TestLivenessExpiry: an endpoint silent past the liveness window (on the
// partition clock, wall time once caught up) is dropped while one that
// sends heartbeats stays; once the ingester is gone too, the survivor's
// keys go when its leases expire.
func TestLivenessExpiry(t *testing.T) {
	t.Parallel()
	const topic = "live"
	e := newEnv(t, 1, []string{topic})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(40*time.Second))
	defer cancel()
	clock := clockwork.NewFakeClockAt(time.Now())
	cfg := e.config(t, topic, "g-live", "/kvindex/live/")
	shortLeases(&cfg)
	cfg.Clock = clock
	r := start(t, cfg)
	t0 := clock.Now()
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic,
		ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{store(t, "silent", t0, 1, 2), store(t, "chatty", t0, 3)}))

	// chatty heartbeats every 5 s, as a bridge does: the topic flows, so
	// this is no outage (DESIGN semantics 8, v1.1), and the silent
	// endpoint ages.
	beat := func() {
		clock.Advance(5 * time.Second)
		ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic,
			ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{heartbeat("chatty", clock.Now())}))
	}
	for range 5 { // to t0+25 s: within the window
		beat()
	}
	if ok, n := present(t, ctx, e, cfg.Keyspace, "silent"); !ok || n != 2 {
		t.Fatalf("silent endpoint before its window passed: record %v, %d blocks", ok, n)
	}

	// The window passes, then one tick (tickInterval: 1 s for a 30 s
	// window): by then the silent endpoint must be gone (the record runs
	// the expiry before it applies, as a tick would).
	beat() // t0+30 s
	clock.Advance(time.Second)
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic,
		ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{heartbeat("chatty", clock.Now())}))
	if ok, n := present(t, ctx, e, cfg.Keyspace, "silent"); ok || n != 0 {
		t.Fatalf("silent endpoint a tick past its window: record %v, %d blocks; want it gone", ok, n)
	}
	ingesttest.WaitFor(t, ctx, e.etcd.Client, cfg.Keyspace.Prefix(), "the silent endpoint to expire", func() bool {
		ok, n := present(t, ctx, e, cfg.Keyspace, "silent")
		return !ok && n == 0
	})
	if ok, n := present(t, ctx, e, cfg.Keyspace, "chatty"); !ok || n != 1 {
		t.Fatalf("chatty endpoint: record %v, %d blocks; want it kept", ok, n)
	}

	// The ingester goes too: nobody renews the leases, etcd drops the keys.
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	ingesttest.WaitFor(t, ctx, e.etcd.Client, cfg.Keyspace.Prefix(), "the leases to expire", func() bool {
		ok, n := present(t, ctx, e, cfg.Keyspace, "chatty")
		return !ok && n == 0
	})
}

// outlives waits out one lease TTL and then checks that every lease in ids
// is still alive and kept alive by r: with its previous owner gone, only r
// can have renewed it. (Waiting a TTL is the property under test: no event
// says "nothing expired".)
func outlives(t *testing.T, ctx context.Context, cli *clientv3.Client, r *running, ttl time.Duration, ids []clientv3.LeaseID) {
	t.Helper()
	r.in.leases.keeper.mu.Lock()
	for _, id := range ids {
		if r.in.leases.keeper.refs[id] == 0 {
			t.Errorf("lease %x is not kept alive by the new owner", id)
		}
	}
	r.in.leases.keeper.mu.Unlock()
	select {
	case <-time.After(ttl + time.Second):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	for _, id := range ids {
		resp, err := cli.TimeToLive(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if resp.TTL <= 0 {
			t.Errorf("lease %x expired under its new owner", id)
		}
	}
}

// TestLeasesSurviveRestartAndRebalance: an endpoint that keeps sending
// heartbeats keeps its blocks across an ingester restart and a rebalance:
// each new owner adopts and renews the recorded leases.
func TestLeasesSurviveRestartAndRebalance(t *testing.T) {
	t.Parallel()
	const topic = "keep"
	e := newEnv(t, 2, []string{topic})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(40*time.Second))
	defer cancel()
	cfg := e.config(t, topic, "g-keep", "/kvindex/keep/")
	shortLeases(&cfg)
	id := keyspace.Endpoint{Model: "m", Pod: "pod"}
	leases := func() (keyspace.EndpointRecord, []clientv3.LeaseID) {
		rec := ingesttest.Endpoints(t, ctx, e.etcd.Client, cfg.Keyspace)[id]
		ids := []clientv3.LeaseID{clientv3.LeaseID(rec.Lease)}
		for _, shards := range rec.TierLeases {
			for _, s := range shards {
				ids = append(ids, clientv3.LeaseID(s.ID))
			}
		}
		return rec, ids
	}
	beat := func() {
		ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic,
			ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{heartbeat("pod", time.Now())}))
	}

	first := start(t, cfg)
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic,
		ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{store(t, "pod", time.Now(), 1, 2, 3)}))
	rec0, ids := leases()
	if len(ids) != 2 {
		t.Fatalf("endpoint record %+v: want a record lease and one gpu lease", rec0)
	}

	// Restart: the successor adopts the leases.
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}
	second := start(t, cfg)
	second.waitOwned(t, ctx, 2)
	outlives(t, ctx, e.etcd.Client, second, cfg.LeaseTTL, ids)
	beat()

	// Rebalance: a second member joins, then the first leaves.
	third := start(t, cfg)
	third.waitOwned(t, ctx, 1)
	beat()
	if err := second.stop(); err != nil {
		t.Fatal(err)
	}
	third.waitOwned(t, ctx, 2)
	outlives(t, ctx, e.etcd.Client, third, cfg.LeaseTTL, ids)
	beat()
	rec1, ids1 := leases()
	if rec1.Lease != rec0.Lease || len(ids1) != len(ids) || ids1[1] != ids[1] {
		t.Errorf("leases changed across restart and rebalance: %v -> %v", ids, ids1)
	}
	if ok, n := present(t, ctx, e, cfg.Keyspace, "pod"); !ok || n != 3 {
		t.Errorf("after restart and rebalance: record %v, %d blocks; want 3", ok, n)
	}
}

// TestReplayNeverRevives: a dead endpoint's old records, replayed after
// the stored offset is rewound or lost, do not bring it back: the replay
// ages endpoints by its own record times.
func TestReplayNeverRevives(t *testing.T) {
	const topic = "revive"
	e := newEnv(t, 1, []string{topic})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(40*time.Second))
	defer cancel()
	t0 := time.Now().Add(-time.Hour)
	recs := []refmodel.Record{store(t, "dead", t0, 1, 2), heartbeat("dead", t0.Add(time.Second))}
	// The live pod heartbeats through the dead one's silence, so the topic
	// flows and the silence is the dead pod's alone (a topic-wide silence
	// is an outage that ages nobody: DESIGN semantics 8, v1.1).
	for s := 10; s < 100; s += 10 {
		recs = append(recs, heartbeat("alive", t0.Add(time.Duration(s)*time.Second)))
	}
	recs = append(recs, store(t, "alive", t0.Add(100*time.Second), 3))
	end := ingesttest.Produce(t, ctx, e.prod, topic, recs)
	cfg := e.config(t, topic, "g-revive", "/kvindex/revive/")
	cfg.Clock = clockwork.NewFakeClockAt(t0.Add(100 * time.Second))
	offsetKey := cfg.Keyspace.OffsetKey(keyspace.Partition{Topic: topic, Partition: 0})
	check := func(t *testing.T, what string) {
		t.Helper()
		ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic, end)
		if ok, n := present(t, ctx, e, cfg.Keyspace, "dead"); ok || n != 0 {
			t.Errorf("%s: the dead endpoint is back: record %v, %d blocks", what, ok, n)
		}
		if ok, n := present(t, ctx, e, cfg.Keyspace, "alive"); !ok || n != 1 {
			t.Errorf("%s: the live endpoint: record %v, %d blocks", what, ok, n)
		}
	}
	r := start(t, cfg)
	check(t, "first pass")
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name   string
		rewind func() error
	}{
		{"rewound_offset", func() error { _, err := e.etcd.Client.Put(ctx, offsetKey, "0"); return err }},
		{"lost_offset", func() error { _, err := e.etcd.Client.Delete(ctx, offsetKey); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.rewind(); err != nil {
				t.Fatal(err)
			}
			r := start(t, cfg)
			check(t, tc.name)
			if err := r.stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestExpiredLeaseRegranted: a write whose lease expired under the
// ingester (revoked here behind its back, as etcd does to a lease nobody
// renewed) re-grants a lease and retries; the endpoint record names the new
// lease. The chunk the expired lease took is put again whole (its blocks
// are still present by the records), on the new lease.
func TestExpiredLeaseRegranted(t *testing.T) {
	const topic = "regrant"
	e := newEnv(t, 1, []string{topic})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	cfg := e.config(t, topic, "g-regrant", "/kvindex/regrant/")
	r := start(t, cfg)
	now := time.Now()
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic,
		ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{store(t, "pod", now, 1, 2)}))
	id := keyspace.Endpoint{Model: "m", Pod: "pod"}
	before := ingesttest.Endpoints(t, ctx, e.etcd.Client, cfg.Keyspace)[id]
	old := before.TierLeases["gpu"][0].ID
	if _, err := e.etcd.Client.Revoke(ctx, clientv3.LeaseID(old)); err != nil {
		t.Fatal(err)
	}
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic,
		ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{store(t, "pod", now, 3)}))
	if ok, n := present(t, ctx, e, cfg.Keyspace, "pod"); !ok || n != 3 {
		t.Errorf("after the lease expired: record %v, %d blocks; want 3 (the chunk the expired lease took, written again with block 3)", ok, n)
	}
	after := ingesttest.Endpoints(t, ctx, e.etcd.Client, cfg.Keyspace)[id]
	shards := after.TierLeases["gpu"]
	if len(shards) != 1 || shards[0].ID == old {
		t.Errorf("gpu leases after the expiry = %+v, want one new lease (old %v)", shards, old)
	}
	lease, err := ingesttest.LeaseOf(ctx, e.etcd.Client, chunkKeyOf(t, ctx, e, cfg.Keyspace, id, tier.GPU, 3))
	if err != nil || int64(lease) != int64(shards[0].ID) {
		t.Errorf("block 3's chunk hangs on lease %x (%v), want the recorded %v", lease, err, shards[0].ID)
	}
	if n := promtest.ToFloat64(r.in.m.leaseRegrants); n < 1 {
		t.Errorf("lease regrants = %v, want at least 1", n)
	}
}

// TestLeaseRecountsBounded: an endpoint whose live keys hover near the
// lease bound (an LRU cache at capacity: one eviction and one store per
// batch) recounts its shards' keys in etcd a bounded number of times, not
// every few batches; and once it grows to more than twice the bound, its
// keys spread over enough leases that none holds more than KeysPerLease.
// Chunks of one block make every block a key of its own.
func TestLeaseRecountsBounded(t *testing.T) {
	t.Parallel()
	const topic = "recount"
	e := newEnv(t, 1, []string{topic})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(60*time.Second))
	defer cancel()
	cfg := e.config(t, topic, "g-recount", "/kvindex/recount/")
	cfg.KeysPerLease = 50
	cfg.ChunkSize = 1
	r := start(t, cfg)

	const live, churn, grow = 40, 100, 80
	now := time.Now()
	hashes := chain(50+churn+grow, 7)
	apply := func(evs ...events.Event) {
		t.Helper()
		rec := batchRecord(t, "m", "pod", now, evs...)
		ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic, ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{rec}))
	}
	// Fill the first shard to the bound, then evict 10: the shard's count
	// says 50, etcd says 40.
	apply(events.Event{Type: events.BlockStored, BlockHashes: hashes[:50], Medium: "GPU"})
	apply(events.Event{Type: events.BlockRemoved, BlockHashes: hashes[:50-live], Medium: "GPU"})
	// Churn at capacity, each batch in a window of its own.
	for i := 50; i < 50+churn; i++ {
		apply(events.Event{Type: events.BlockRemoved, BlockHashes: []uint64{hashes[i-live]}, Medium: "GPU"},
			events.Event{Type: events.BlockStored, BlockHashes: []uint64{hashes[i]}, Medium: "GPU"})
	}
	id := keyspace.Endpoint{Model: "m", Pod: "pod"}
	if n := blockCount(t, ctx, e, cfg.Keyspace, id); n != live {
		t.Fatalf("%d block keys after the churn, want %d", n, live)
	}
	// A shard found at least half full by a recount is closed, so each
	// recount is followed by at least 25 puts on a fresh shard; keeping
	// the old one would recount every 10 puts (about 10 times here).
	recounts := promtest.ToFloat64(r.in.m.leaseRecounts)
	t.Logf("%v recounts over %d batches", recounts, churn)
	if recounts < 1 || recounts > 6 {
		t.Errorf("lease recounts = %v over %d batches at capacity, want 1 to 6", recounts, churn)
	}

	// Grow past twice the bound, a few keys per batch.
	for i := 50 + churn; i < len(hashes); i += 8 {
		apply(events.Event{Type: events.BlockStored, BlockHashes: hashes[i:min(i+8, len(hashes))], Medium: "GPU"})
	}
	want := live + grow
	if n := blockCount(t, ctx, e, cfg.Keyspace, id); n != want {
		t.Fatalf("%d block keys after growing, want %d", n, want)
	}
	perLease := map[clientv3.LeaseID]int{}
	for _, h := range hashes[len(hashes)-want:] {
		lease, err := ingesttest.LeaseOf(ctx, e.etcd.Client, chunkKeyOf(t, ctx, e, cfg.Keyspace, id, tier.GPU, h))
		if err != nil {
			t.Fatal(err)
		}
		perLease[lease]++
	}
	t.Logf("keys per lease: %v", perLease)
	if need := (want + cfg.KeysPerLease - 1) / cfg.KeysPerLease; len(perLease) < need {
		t.Errorf("%d live keys on %d leases, want at least %d at %d keys per lease", want, len(perLease), need, cfg.KeysPerLease)
	}
	recorded := map[int64]bool{}
	for _, s := range ingesttest.Endpoints(t, ctx, e.etcd.Client, cfg.Keyspace)[id].TierLeases["gpu"] {
		recorded[int64(s.ID)] = true
	}
	for lease, n := range perLease {
		if n > cfg.KeysPerLease {
			t.Errorf("lease %x holds %d keys, bound %d", lease, n, cfg.KeysPerLease)
		}
		if !recorded[int64(lease)] {
			t.Errorf("lease %x holds keys but the endpoint record does not name it", lease)
		}
	}
}

// TestSplitWindowRepairsExpiredLease: a window split into parts past
// MaxTxnOps (chunks of 4: 300 blocks are 75 chunk puts, 16 ops per
// transaction) lands whole when the lease its chunks name expired behind
// the ingester's back: the refused part is rebuilt with a fresh lease and
// sent again, the offset still comes last, and every chunk hangs on a
// lease the endpoint record names.
func TestSplitWindowRepairsExpiredLease(t *testing.T) {
	const topic = "split-repair"
	e := newEnv(t, 1, []string{topic})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(60*time.Second))
	defer cancel()
	cfg := e.config(t, topic, "g-"+topic, "/kvindex/"+topic+"/")
	cfg.MaxTxnOps = 16
	cfg.ChunkSize = 4
	var parts, commits atomic.Int64
	cfg.BeforeTxn = func(_ context.Context, info TxnInfo) error {
		if info.Kind == TxnPart {
			parts.Add(1)
		} else if info.Kind == TxnCommit {
			commits.Add(1)
			if info.Offset < 0 {
				return fmt.Errorf("a commit transaction without the offset: %+v", info)
			}
		}
		return nil
	}
	r := start(t, cfg)
	now := time.Now()
	first, second := chain(300, 1), chain(300, 2)
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic,
		ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{store(t, "pod", now, first...)}))
	id := keyspace.Endpoint{Model: "m", Pod: "pod"}
	if n := blockCount(t, ctx, e, cfg.Keyspace, id); n != len(first) {
		t.Fatalf("after the first record: %d blocks, want %d", n, len(first))
	}
	if parts.Load() == 0 {
		t.Fatal("the first window was not split: the test tests nothing")
	}
	old := ingesttest.Endpoints(t, ctx, e.etcd.Client, cfg.Keyspace)[id].TierLeases["gpu"][0].ID
	if _, err := e.etcd.Client.Revoke(ctx, clientv3.LeaseID(old)); err != nil {
		t.Fatal(err)
	}
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic,
		ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{store(t, "pod", now, second...)}))
	// The first record's chunks went with the lease; the second's are all
	// in, on a new one.
	if n := blockCount(t, ctx, e, cfg.Keyspace, id); n != len(second) {
		t.Errorf("after the lease expired: %d blocks, want the second record's %d", n, len(second))
	}
	rec := ingesttest.Endpoints(t, ctx, e.etcd.Client, cfg.Keyspace)[id]
	recorded := map[int64]bool{}
	for _, s := range rec.TierLeases["gpu"] {
		if int64(s.ID) == int64(old) {
			t.Errorf("the record still names the expired lease %v", old)
		}
		recorded[int64(s.ID)] = true
	}
	kvs, err := ingesttest.KVs(ctx, e.etcd.Client, cfg.Keyspace.ChunksPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range kvs {
		if !recorded[kv.Lease] {
			t.Errorf("chunk %s hangs on lease %x, which the endpoint record (%+v) does not name", kv.Key, kv.Lease, rec.TierLeases)
		}
	}
	if n := promtest.ToFloat64(r.in.m.leaseRegrants); n < 1 {
		t.Errorf("lease regrants = %v, want at least 1", n)
	}
}
