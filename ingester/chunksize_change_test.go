package ingester

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
)

// TestChunkSizeChangeAcrossOwners: an upgrade that changes --chunk-size
// (v2.1 took the default from 64 to 24) needs no conversion. An owner at
// chunks of 8 writes a pod's blocks; its successor at chunks of 4 takes
// the partition over, stores more and removes some of both generations:
// etcd holds exactly the reference model's blocks after every step, the
// old chunks keep at most 8 entries and shrink in place, and every chunk
// the successor opens holds at most 4.
func TestChunkSizeChangeAcrossOwners(t *testing.T) {
	t.Parallel()
	const topic, model, pod = "chunk-size-change", "m", "pod-a"
	e := newEnv(t, 1, []string{topic})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(60*time.Second))
	defer cancel()
	cfg := e.config(t, topic, "g-chunk-size-change", "/kvindex/chunk-size-change/")
	now := time.Now()
	gen1, gen2 := chain(20, 31), chain(10, 32)
	m := refmodel.New(refmodel.Config{LivenessWindow: cfg.LivenessWindow})
	step := func(name string, ev events.Event) {
		t.Helper()
		r := batchRecord(t, model, pod, now, ev)
		m.Apply(r)
		ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic, ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{r}))
		if diff := cmp.Diff(m.Blocks(), ingesttest.Blocks(t, ctx, e.etcd.Client, cfg.Keyspace), cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("%s: etcd differs from the reference model (-model +etcd):\n%s", name, diff)
		}
	}
	chunkLens := func() map[string]int {
		t.Helper()
		kvs, err := ingesttest.KVs(ctx, e.etcd.Client, cfg.Keyspace.ChunksPrefix())
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int{}
		for _, kv := range kvs {
			v, err := keyspace.ParseChunkValue(kv.Value)
			if err != nil {
				t.Fatalf("%s: %v", kv.Key, err)
			}
			out[string(kv.Key)] = v.Len()
		}
		return out
	}

	first := cfg
	first.ChunkSize, first.ChunkMergeBelow, first.WindowLinger = 8, 1, 0
	old := start(t, first)
	step("stores at chunks of 8", events.Event{Type: events.BlockStored, BlockHashes: gen1, BlockSize: 16, Medium: "GPU"})
	before := chunkLens()
	if len(before) != 3 {
		t.Fatalf("20 blocks at chunks of 8 in %d chunks %v, want 3", len(before), before)
	}
	if err := old.stop(); err != nil {
		t.Fatal(err)
	}

	second := cfg
	second.ChunkSize, second.ChunkMergeBelow, second.WindowLinger = 4, 1, 0
	start(t, second)
	step("stores at chunks of 4", events.Event{Type: events.BlockStored, BlockHashes: gen2, ParentHash: gen1[len(gen1)-1], HasParent: true, BlockSize: 16, Medium: "GPU"})
	step("removals of both generations", events.Event{Type: events.BlockRemoved, BlockHashes: append(append([]uint64(nil), gen1[:5]...), gen2[8:]...), Medium: "GPU"})

	after := chunkLens()
	for k, n := range after {
		if was, ok := before[k]; ok {
			if n > was {
				t.Errorf("%s: an old chunk grew from %d to %d entries under chunks of 4", k, was, n)
			}
			continue
		}
		if n > 4 {
			t.Errorf("%s: a chunk the successor opened holds %d entries, more than its chunk size 4", k, n)
		}
	}
	if len(after) <= len(before) {
		t.Errorf("chunks %v after the successor's stores, want new ones beside the old %v", after, before)
	}
}
