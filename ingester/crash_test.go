package ingester

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/jonboulle/clockwork"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
)

// perPartitionModel applies recs to one reference model per partition
// (each partition has its own clock, DESIGN semantics 8), then ages every
// model to now, and returns the union of their blocks and endpoints.
func perPartitionModel(recs []refmodel.Record, parts []int32, window time.Duration, now time.Time, mode keyspace.HashMode) ([]keyspace.Block, []keyspace.Endpoint) {
	models := map[int32]*refmodel.Model{}
	for i, r := range recs {
		m := models[parts[i]]
		if m == nil {
			m = refmodel.New(refmodel.Config{LivenessWindow: window, HashMode: mode})
			models[parts[i]] = m
		}
		m.Apply(r)
	}
	var blocks []keyspace.Block
	var eps []keyspace.Endpoint
	for _, m := range models {
		m.Expire(now)
		blocks = append(blocks, m.Blocks()...)
		eps = append(eps, m.Endpoints()...)
	}
	refmodel.SortBlocks(blocks)
	return blocks, eps
}

// TestCrashReplay kills the ingester at random write transactions (before
// the parts of windows split past a tiny MaxTxnOps, and before windows'
// last transactions) many times while it works through a long randomized
// stream with tail-first evictions, restarting it each time; the final
// etcd contents must equal a run without crashes, chunk key for chunk key
// and byte for byte (the chunk layout depends only on the op sequence),
// and the reference model's prediction. Chunks of 4 with a merge below 2
// put every chunk-rule boundary (fill, open, merge, empty) in play.
func TestCrashReplay(t *testing.T) {
	t.Parallel()
	testCrashReplay(t, keyspace.HashModeEngine)
}

// TestCrashReplayTokenMode is TestCrashReplay in token mode: every restart
// rebuilds the engine-hash maps from etcd before replaying, so the crashed
// run must key and remove exactly as the clean run and the reference model
// in token mode do.
func TestCrashReplayTokenMode(t *testing.T) {
	t.Parallel()
	testCrashReplay(t, keyspace.HashModeToken)
}

func testCrashReplay(t *testing.T, mode keyspace.HashMode) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("KVINDEX_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d", seed)
	defer func() {
		if t.Failed() {
			t.Logf("failed with seed %d", seed)
		}
	}()
	topic := "crash-" + string(mode)
	e := newEnv(t, 2, []string{topic})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(80*time.Second))
	defer cancel()

	recs := refmodel.Generate(refmodel.GenConfig{Seed: seed, Records: 1000, Pods: 6, Ranks: 2, MaxHashesPerEvent: 24, TailFirst: true})
	// A last record from a pod of its own, at the stream's last time, so
	// the stream always leaves blocks: some seeds end with every generated
	// endpoint dropped or expired (seed 1796324521197694616 did).
	anchor := (&tokenPod{pod: "anchor"}).batch(t, stored([]uint64{1, 2}, 0, tokenIDs(8, 1), 4, "GPU"))
	anchor.Time = recs[len(recs)-1].Time
	recs = append(recs, anchor)
	krs := make([]*kgo.Record, len(recs))
	for i, r := range recs {
		krs[i] = ingesttest.KafkaRecord(topic, r)
	}
	end := ingesttest.ProduceKafka(t, ctx, e.prod, krs)
	parts := make([]int32, len(recs))
	for i, kr := range krs {
		parts[i] = kr.Partition
	}
	last := recs[len(recs)-1].Time
	const window = 800 * time.Millisecond

	configure := func(name string) Config {
		cfg := e.config(t, topic, "g-"+name, "/kvindex/"+name+"/")
		cfg.HashMode = mode
		cfg.MaxTxnOps = 16
		cfg.WindowRecords = 64
		cfg.LivenessWindow = window
		cfg.KeysPerLease = 50
		cfg.ChunkSize = 4
		cfg.ChunkMergeBelow = 2
		cfg.Clock = clockwork.NewFakeClockAt(last)
		return cfg
	}

	// The run without crashes.
	clean := configure("clean")
	var cleanTxns [3]atomic.Int64 // by kind; [0] all kinds
	clean.BeforeTxn = func(_ context.Context, info TxnInfo) error {
		cleanTxns[0].Add(1)
		cleanTxns[info.Kind].Add(1)
		return nil
	}
	began := time.Now()
	r := start(t, clean)
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, clean.Keyspace, topic, end)
	t.Logf("clean run: %v, %d transactions (%d parts of split windows)", time.Since(began), cleanTxns[0].Load(), cleanTxns[TxnPart].Load())
	if cleanTxns[TxnPart].Load() == 0 {
		t.Fatal("no window was split: the test would not crash between parts")
	}
	// Read the clean run's result now: once its ingester stops, nobody
	// renews its leases.
	cleanBlocks := ingesttest.Blocks(t, ctx, e.etcd.Client, clean.Keyspace)
	cleanEps := ingesttest.Endpoints(t, ctx, e.etcd.Client, clean.Keyspace)
	cleanChunks := ingesttest.ChunkValues(t, ctx, e.etcd.Client, clean.Keyspace)
	if err := r.stop(); err != nil {
		t.Fatalf("clean run: %v", err)
	}

	// The run with crashes.
	rng := rand.New(rand.NewPCG(seed, 7))
	crashy := configure("crashy")
	crashes := 0
	kinds := map[TxnKind]int{}
	var crashBlocks []keyspace.Block
	var crashEps map[keyspace.Endpoint]keyspace.EndpointRecord
	var crashChunks map[string]string
	for round := 0; ; round++ {
		cfg := crashy
		// Crash before the n-th transaction of one kind (0: any kind):
		// between the parts of a split window, or just before a window's
		// last transaction.
		var txns atomic.Int64
		crashAt := int64(-1)
		crashKind := TxnKind(rng.IntN(3))
		if crashes < 30 {
			// Spread the crash points over the whole stream.
			crashAt = 1 + rng.Int64N(max(1, cleanTxns[crashKind].Load()/25))
		}
		cfg.BeforeTxn = func(_ context.Context, info TxnInfo) error {
			if crashKind != 0 && info.Kind != crashKind {
				return nil
			}
			if n := txns.Add(1); n == crashAt {
				kinds[info.Kind]++
				return errCrash
			}
			return nil
		}
		r := start(t, cfg)
		appliedCtx, stopWaiting := context.WithCancel(ctx)
		applied := make(chan error, 1)
		go func() { applied <- ingesttest.Applied(appliedCtx, e.etcd.Client, crashy.Keyspace, topic, end) }()
		select {
		case err := <-applied:
			stopWaiting()
			if err != nil {
				stored, _, _ := ingesttest.StoredOffsets(context.Background(), e.etcd.Client, crashy.Keyspace, topic)
				t.Fatalf("round %d: %v (stored offsets %v, want past %v)", round, err, stored, end)
			}
			crashBlocks = ingesttest.Blocks(t, ctx, e.etcd.Client, crashy.Keyspace)
			crashEps = ingesttest.Endpoints(t, ctx, e.etcd.Client, crashy.Keyspace)
			crashChunks = ingesttest.ChunkValues(t, ctx, e.etcd.Client, crashy.Keyspace)
			if err := r.stop(); err != nil && !errors.Is(err, errCrash) {
				t.Fatalf("stopping: %v", err)
			}
		case err := <-r.done:
			close(r.done)
			stopWaiting()
			<-applied
			if !errors.Is(err, errCrash) {
				t.Fatalf("round %d: Run returned %v", round, err)
			}
			crashes++
			continue
		}
		break
	}
	t.Logf("%d crashes (before txn kinds %v)", crashes, kinds)

	wantBlocks, wantEps := perPartitionModel(recs, parts, window, last, mode)
	if len(wantBlocks) == 0 {
		t.Fatal("the stream left no blocks: the test would prove nothing")
	}
	if diff := cmp.Diff(wantBlocks, cleanBlocks, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("clean run differs from the reference model (-model +etcd):\n%s", diff)
	}
	if diff := cmp.Diff(cleanBlocks, crashBlocks, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("crashed run differs from the clean run (-clean +crashed):\n%s", diff)
	}
	if diff := cmp.Diff(cleanChunks, crashChunks, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("chunk keys or values differ (-clean +crashed):\n%s", diff)
	}
	if diff := cmp.Diff(chunkNexts(cleanEps), chunkNexts(crashEps), cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("chunk_next differs (-clean +crashed):\n%s", diff)
	}
	if diff := cmp.Diff(ingesttest.SeqViews(cleanEps), ingesttest.SeqViews(crashEps)); diff != "" {
		t.Errorf("endpoint records differ (-clean +crashed):\n%s", diff)
	}
	gotEps := make([]keyspace.Endpoint, 0, len(cleanEps))
	for id := range cleanEps {
		gotEps = append(gotEps, id)
	}
	sortEndpoints := cmpopts.SortSlices(func(a, b keyspace.Endpoint) bool { return a.String() < b.String() })
	if diff := cmp.Diff(wantEps, gotEps, sortEndpoints, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("endpoints differ from the reference model (-model +etcd):\n%s", diff)
	}
}

// chunkNexts projects endpoint records to their chunk_next.
func chunkNexts(recs map[keyspace.Endpoint]keyspace.EndpointRecord) map[string]map[string]uint64 {
	out := map[string]map[string]uint64{}
	for id, r := range recs {
		out[id.String()] = r.ChunkNext
	}
	return out
}
