package ingester

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
)

// podHashes lists the hashes in etcd per pod.
func podHashes(t *testing.T, ctx context.Context, e *env, ks keyspace.Keyspace) map[string][]uint64 {
	out := map[string][]uint64{}
	for _, b := range ingesttest.Blocks(t, ctx, e.etcd.Client, ks) {
		out[b.Endpoint.Pod] = append(out[b.Endpoint.Pod], b.Hash)
	}
	return out
}

// TestOffsetOutOfRange: a stored offset past the log end (topic recreated)
// or before the log start (retention passed it) drops the blocks of the
// partition's endpoints, which may be stale, and restarts at the log start;
// it is counted.
func TestOffsetOutOfRange(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(40*time.Second))
	defer cancel()

	t.Run("past_log_end", func(t *testing.T) {
		const topic = "past-end"
		e := newEnv(t, 1, []string{topic})
		cfg := e.config(t, topic, "g-past", "/kvindex/past/")
		now := time.Now()
		end := ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{store(t, "a", now, 1), store(t, "a", now, 2)})
		r := start(t, cfg)
		ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic, end)
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		// A stale chunk no record explains, and an offset past the log end.
		stale := cfg.Keyspace.ChunkKey(keyspace.Endpoint{Model: "m", Pod: "a"}, tier.GPU, 99)
		if _, err := e.etcd.Client.Put(ctx, stale, string(keyspace.AppendChunkValue(nil, []keyspace.ChunkEntry{{Key: 99, Engine: 99}}, false))); err != nil {
			t.Fatal(err)
		}
		if _, err := e.etcd.Client.Put(ctx, cfg.Keyspace.OffsetKey(keyspace.Partition{Topic: topic}), "1000"); err != nil {
			t.Fatal(err)
		}
		r = start(t, cfg)
		ingesttest.WaitFor(t, ctx, e.etcd.Client, cfg.Keyspace.OffsetsPrefix(), "the offset reset and replay", func() bool {
			got, _, err := ingesttest.StoredOffsets(ctx, e.etcd.Client, cfg.Keyspace, topic)
			return err == nil && got[0] == end[0]+1
		})
		if diff := cmp.Diff(map[string][]uint64{"a": {1, 2}}, podHashes(t, ctx, e, cfg.Keyspace)); diff != "" {
			t.Errorf("after the reset (-want +got):\n%s", diff)
		}
		if n := promtest.ToFloat64(r.in.m.offsetResets); n != 1 {
			t.Errorf("offset resets = %v, want 1", n)
		}
	})

	t.Run("before_log_start", func(t *testing.T) {
		const topic = "before-start"
		e := newEnv(t, 1, []string{topic})
		cfg := e.config(t, topic, "g-before", "/kvindex/before/")
		now := time.Now()
		end := ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{store(t, "a", now, 1)})
		r := start(t, cfg)
		ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic, end)
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		// Two more records; retention then deletes everything before the last.
		end = ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{store(t, "b", now, 2), store(t, "a", now, 3)})
		adm := kadm.NewClient(e.prod)
		var offs kadm.Offsets
		offs.Add(kadm.Offset{Topic: topic, Partition: 0, At: end[0]})
		if resp, err := adm.DeleteRecords(ctx, offs); err != nil || resp.Error() != nil {
			t.Fatalf("deleting records: %v %v", err, resp.Error())
		}
		r = start(t, cfg)
		ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic, end)
		if diff := cmp.Diff(map[string][]uint64{"a": {3}}, podHashes(t, ctx, e, cfg.Keyspace)); diff != "" {
			t.Errorf("after the reset (-want +got):\n%s", diff)
		}
		if n := promtest.ToFloat64(r.in.m.offsetResets); n != 1 {
			t.Errorf("offset resets = %v, want 1", n)
		}
		resp, err := e.etcd.Client.Get(ctx, cfg.Keyspace.EndpointsPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil || resp.Count != 1 {
			t.Errorf("endpoint records after the reset: %v, %v; want only a's", resp, err)
		}
	})
}

// TestOffsetOutOfRangeWhileConsuming: retention passing the fetch position
// of a running ingester (OffsetOutOfRange while consuming) drops the
// partition's endpoints and restarts at the new log start.
//
// Pausing the partition does not stop a fetch already waiting at the
// broker: records produced after the pause answer it, franz-go keeps them
// buffered while the partition is paused, and hands them over on resume,
// records retention has since deleted included (they were read before
// the delete). So the test waits, after pausing, for the fetch in flight
// to come back (a short FetchMaxWait makes it come back at once) before
// it produces what retention then deletes; every later fetch leaves the
// paused partition out.
func TestOffsetOutOfRangeWhileConsuming(t *testing.T) {
	ctx := testutil.Context(t, 30*time.Second)
	const topic = "retention"
	e := newEnv(t, 1, []string{topic})
	cfg := e.config(t, topic, "g-retention", "/kvindex/retention/")
	fetches := &fetchReads{}
	cfg.KafkaOptions = append(cfg.KafkaOptions, kgo.FetchMaxWait(100*time.Millisecond), kgo.WithHooks(fetches))
	r := start(t, cfg)
	now := time.Now()
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic,
		ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{store(t, "a", now, 1)}))

	// Stop fetching, let records arrive and retention delete them all,
	// then fetch again from the old position.
	r.in.cl.PauseFetchPartitions(map[string][]int32{topic: {0}})
	fetches.waitNext(t, fetches.reads.Load())
	end := ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{store(t, "a", now, 2), store(t, "b", now, 3)})
	var offs kadm.Offsets
	offs.Add(kadm.Offset{Topic: topic, Partition: 0, At: end[0] + 1})
	if resp, err := kadm.NewClient(e.prod).DeleteRecords(ctx, offs); err != nil || resp.Error() != nil {
		t.Fatalf("deleting records: %v %v", err, resp.Error())
	}
	r.in.cl.ResumeFetchPartitions(map[string][]int32{topic: {0}})
	end = ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{store(t, "b", now, 4)})
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic, end)
	if diff := cmp.Diff(map[string][]uint64{"b": {4}}, podHashes(t, ctx, e, cfg.Keyspace)); diff != "" {
		t.Errorf("after the reset (-want +got):\n%s", diff)
	}
	if n := promtest.ToFloat64(r.in.m.offsetResets); n != 1 {
		t.Errorf("offset resets = %v, want 1", n)
	}
}

// fetchReads counts the Fetch responses a client reads (a franz-go
// HookBrokerRead).
type fetchReads struct{ reads atomic.Int64 }

func (f *fetchReads) OnBrokerRead(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == kmsg.Fetch.Int16() && err == nil {
		f.reads.Add(1)
	}
}

// waitNext waits until a Fetch response past the first seen ones has
// been read, or, when no fetch was in flight (none comes back), for
// a few FetchMaxWaits: either way no fetch built before the caller's
// pause is still out.
func (f *fetchReads) waitNext(t *testing.T, seen int64) {
	t.Helper()
	deadline := time.Now().Add(testutil.Timeout(2 * time.Second))
	for f.reads.Load() <= seen && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}
