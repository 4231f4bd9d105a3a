package ingester

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
)

// TestRebalance: two ingesters share a group; one leaves mid-stream and
// the other takes its partitions over. The final etcd contents equal those
// of a run with one ingester and no rebalance, and the reference model's.
func TestRebalance(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	const topic = "rebalance"
	e := newEnv(t, 4, []string{topic})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(60*time.Second))
	defer cancel()
	recs := refmodel.Generate(refmodel.GenConfig{Seed: seed, Records: 900, Pods: 8, Ranks: 2, MaxHashesPerEvent: 16, Start: time.Now(), TailFirst: true})
	model := refmodel.New(refmodel.Config{})
	for _, r := range recs {
		model.Apply(r)
	}

	cfg := e.config(t, topic, "g-rb", "/kvindex/rb/")
	cfg.MaxTxnOps = 32
	a, b := cfg, cfg
	a.ID, b.ID = "a", "b"
	ra := start(t, a)
	rb := start(t, b)
	third := len(recs) / 3
	produced := ingesttest.Produce(t, ctx, e.prod, topic, recs[:third])
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic, produced)
	ra.waitOwned(t, ctx, 1)
	rb.waitOwned(t, ctx, 1)
	t.Logf("partitions: a %v, b %v", ra.in.Partitions(), rb.in.Partitions())

	// b leaves while records keep coming.
	done := make(chan ingesttest.Offsets, 1)
	go func() { done <- ingesttest.Produce(t, ctx, e.prod, topic, recs[third:]) }()
	if err := rb.stop(); err != nil {
		t.Fatalf("b: %v", err)
	}
	produced.Merge(<-done)
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic, produced)
	if got := ra.in.Partitions(); len(got) != 4 {
		t.Errorf("a owns %v after b left, want all 4 partitions", got)
	}

	// The same records with one ingester.
	solo := e.config(t, topic, "g-solo", "/kvindex/solo/")
	solo.MaxTxnOps = 32
	start(t, solo)
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, solo.Keyspace, topic, produced)

	got := ingesttest.Blocks(t, ctx, e.etcd.Client, cfg.Keyspace)
	want := ingesttest.Blocks(t, ctx, e.etcd.Client, solo.Keyspace)
	if len(want) == 0 {
		t.Fatal("no blocks: the test would prove nothing")
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("rebalanced run differs from the solo run (-solo +rebalanced):\n%s", diff)
	}
	if diff := cmp.Diff(model.Blocks(), got, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("rebalanced run differs from the reference model (-model +etcd):\n%s", diff)
	}
	if diff := cmp.Diff(ingesttest.SeqViews(ingesttest.Endpoints(t, ctx, e.etcd.Client, solo.Keyspace)),
		ingesttest.SeqViews(ingesttest.Endpoints(t, ctx, e.etcd.Client, cfg.Keyspace))); diff != "" {
		t.Errorf("endpoint records differ (-solo +rebalanced):\n%s", diff)
	}
}

// TestZombieFenced: when another member claims a partition, the previous
// owner's next write fails its guard, changes nothing, and stops only that
// partition's worker.
func TestZombieFenced(t *testing.T) {
	const topic = "zombie"
	e := newEnv(t, 1, []string{topic})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	cfg := e.config(t, topic, "g-zombie", "/kvindex/zombie/")
	r := start(t, cfg)
	now := time.Now()
	first := batchRecord(t, "m", "pod", now, events.Event{Type: events.BlockStored, BlockHashes: []uint64{1, 2}, Medium: "GPU"})
	produced := ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{first})
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic, produced)
	before, _, err := ingesttest.StoredOffsets(ctx, e.etcd.Client, cfg.Keyspace, topic)
	if err != nil {
		t.Fatal(err)
	}

	// Another ingester claims the partition (last claimer wins).
	rec := keyspace.OwnerRecord{MemberID: "usurper", Generation: 99, Nonce: "n", Claimed: time.Now().UTC()}
	val, err := rec.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.etcd.Client.Put(ctx, cfg.Keyspace.OwnerKey(keyspace.Partition{Topic: topic, Partition: 0}), string(val)); err != nil {
		t.Fatal(err)
	}
	r.in.mu.Lock()
	part := r.in.parts[0]
	r.in.mu.Unlock()
	late := batchRecord(t, "m", "pod", now, events.Event{Type: events.BlockStored, BlockHashes: []uint64{3}, Medium: "GPU"})
	ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{late})
	select {
	case <-part.done:
	case <-ctx.Done():
		t.Fatal("the fenced worker did not stop")
	}
	if !errors.Is(part.err, ErrFenced) {
		t.Errorf("worker stopped with %v, want ErrFenced", part.err)
	}
	if n := promtest.ToFloat64(r.in.m.guardFailures); n != 1 {
		t.Errorf("guard failures = %v, want 1", n)
	}
	after, _, err := ingesttest.StoredOffsets(ctx, e.etcd.Client, cfg.Keyspace, topic)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(before, after); diff != "" {
		t.Errorf("the zombie moved the stored offset (-before +after):\n%s", diff)
	}
	blocks := ingesttest.Blocks(t, ctx, e.etcd.Client, cfg.Keyspace)
	if len(blocks) != 2 {
		t.Errorf("blocks after the zombie's write = %v, want the 2 written before the claim", blocks)
	}
	if err := r.in.Ready(); err != nil {
		t.Errorf("a fenced partition made the ingester unready: %v", err)
	}
}
