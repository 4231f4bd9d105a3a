package ingester

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
)

// TestStalledPartitionDoesNotHoldUpOthers: while one partition's worker
// is stuck (here in its transaction hook, as it would be behind a slow
// etcd), the records fetched for it queue up under QueueBytes, and the
// other partitions' records keep being delivered and written. A queue
// bounded by a count of fetches (a record or two each, at a steady rate)
// filled after a few and stopped the consume loop for every partition.
func TestStalledPartitionDoesNotHoldUpOthers(t *testing.T) {
	const topic = "stall"
	e := newEnv(t, 2, []string{topic})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(60*time.Second))
	defer cancel()
	cfg := e.config(t, topic, "g-stall", "/kvindex/stall/")
	var stalled atomic.Int32
	stalled.Store(-1)
	release := make(chan struct{})
	cfg.BeforeTxn = func(ctx context.Context, info TxnInfo) error {
		if info.Partition == stalled.Load() {
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return nil
	}
	start(t, cfg)

	// Find a pod on each partition.
	now := time.Now()
	pods := map[int32]string{}
	for i := 0; len(pods) < 2 && i < 64; i++ {
		pod := fmt.Sprintf("pod-%d", i)
		for p := range ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{heartbeat(pod, now)}) {
			if _, ok := pods[p]; !ok {
				pods[p] = pod
			}
		}
	}
	if len(pods) < 2 {
		t.Fatalf("64 pods all hashed to one partition: %v", pods)
	}

	stalled.Store(0)
	defer func() {
		if stalled.Load() >= 0 {
			close(release)
		}
	}()
	last := ingesttest.Offsets{}
	for i := range 60 {
		last.Merge(ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{store(t, pods[0], now, uint64(i+1))}))
		time.Sleep(2 * time.Millisecond) // a fetch or so each, as at a steady rate
	}
	other := ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{store(t, pods[1], now, 1000)})
	waitCtx, stop := context.WithTimeout(ctx, testutil.Timeout(15*time.Second))
	err := ingesttest.Applied(waitCtx, e.etcd.Client, cfg.Keyspace, topic, other)
	stop()
	if err != nil {
		t.Fatalf("partition 1's record was not written while partition 0 was stalled: %v", err)
	}

	stalled.Store(-1)
	close(release)
	last.Merge(other)
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic, last)
	if n := len(ingesttest.Blocks(t, ctx, e.etcd.Client, cfg.Keyspace)); n != 61 {
		t.Errorf("%d blocks after the stall, want 61", n)
	}
}

// TestFullQueuePausesPartition: when a stalled partition's queue is full
// (QueueBytes), the consume loop does not wait for its worker: it pauses
// fetching that partition and keeps polling, so the other partitions'
// records are still delivered and written (and the loop keeps allowing
// rebalances, which BlockRebalanceOnPoll holds off between polls). Once the
// worker catches up, the partition resumes and nothing is lost.
func TestFullQueuePausesPartition(t *testing.T) {
	t.Parallel()
	const topic = "full"
	e := newEnv(t, 2, []string{topic})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(60*time.Second))
	defer cancel()
	cfg := e.config(t, topic, "g-full", "/kvindex/full/")
	cfg.QueueBytes = 64 << 10
	var stalled atomic.Int32
	stalled.Store(-1)
	release := make(chan struct{})
	cfg.BeforeTxn = func(ctx context.Context, info TxnInfo) error {
		if info.Partition == stalled.Load() {
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return nil
	}
	start(t, cfg)

	now := time.Now()
	pods := map[int32]string{}
	for i := 0; len(pods) < 2 && i < 64; i++ {
		pod := fmt.Sprintf("pod-%d", i)
		for p := range ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{heartbeat(pod, now)}) {
			if _, ok := pods[p]; !ok {
				pods[p] = pod
			}
		}
	}
	if len(pods) < 2 {
		t.Fatalf("64 pods all hashed to one partition: %v", pods)
	}

	stalled.Store(0)
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	// Five times the queue's bytes for the stalled partition: records of
	// 8 KiB each (an unknown header pads them; the ingester ignores it),
	// at a pace of a fetch or so each, so the queue fills fetch by fetch.
	pad := strings.Repeat("x", 8<<10)
	last := ingesttest.Offsets{}
	for i := range 40 {
		rec := store(t, pods[0], now, uint64(i+1))
		rec.Headers["pad"] = pad
		last.Merge(ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{rec}))
		time.Sleep(5 * time.Millisecond)
	}
	other := ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{store(t, pods[1], now, 1000)})
	waitCtx, stop := context.WithTimeout(ctx, testutil.Timeout(15*time.Second))
	err := ingesttest.Applied(waitCtx, e.etcd.Client, cfg.Keyspace, topic, other)
	stop()
	if err != nil {
		t.Fatalf("partition 1's record was not written while partition 0's queue was full: %v", err)
	}

	stalled.Store(-1)
	close(release)
	released = true
	last.Merge(other)
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic, last)
	if n := len(ingesttest.Blocks(t, ctx, e.etcd.Client, cfg.Keyspace)); n != 41 {
		t.Errorf("%d blocks after the stall, want 41", n)
	}
}
