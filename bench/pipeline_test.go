package bench

import (
	"context"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/logging"
	"github.com/kvindex/kvindex/internal/sim/fleetsim"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
)

// TestRawWriteReproducesIngest checks the reference of the ingest and
// fleet measurements: the transactions captured from an ingester run,
// written straight to a fresh etcd (with the ingester's default number in
// flight, so the writer must keep its barriers), leave exactly the blocks
// the stream describes (the reference model's answer), and count the
// block operations the ingester wrote. It runs in both hash modes: in
// token mode the captured block keys are token keys, and every block the
// stream stores (CPU placeholders included) must have been keyed.
func TestRawWriteReproducesIngest(t *testing.T) {
	trace := loadTestTrace(t)
	for _, mode := range []keyspace.HashMode{keyspace.HashModeEngine, keyspace.HashModeToken} {
		t.Run(string(mode), func(t *testing.T) { testRawWriteReproducesIngest(t, trace, mode) })
	}
}

func testRawWriteReproducesIngest(t *testing.T, trace []fleetsim.Request, mode keyspace.HashMode) {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(2*time.Minute))
	defer cancel()
	s, err := BuildStream(trace, StreamConfig{Endpoints: 4, GPUBlocks: 32, CPUBlocks: 64, Requests: 300})
	if err != nil {
		t.Fatal(err)
	}
	log := logging.Discard()
	const topic = "t"
	kafka, err := startKafka(log, topic, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer kafka.Close()
	prod, err := newProducer(kafka.ListenAddrs(), log)
	if err != nil {
		t.Fatal(err)
	}
	end, _, err := produceAll(ctx, prod, s, topic)
	prod.Close()
	if err != nil {
		t.Fatal(err)
	}
	capture, err := captureRun(ctx, ingesterOptions{partitions: 2, hashMode: mode, log: log, brokers: kafka.ListenAddrs(), topic: topic}, etcdOptions{noFsync: true}, end)
	if err != nil {
		t.Fatal(err)
	}
	if c := capture.counts(); c.Txns == 0 || c.DataOps == 0 {
		t.Fatalf("captured %d transactions with %d data ops", c.Txns, c.DataOps)
	}
	node, err := startEtcd(ctx, log, etcdOptions{noFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer node.close()
	if _, err := capture.rawWrite(ctx, node.cli, topic, DefaultTxnsInFlight); err != nil {
		t.Fatal(err)
	}
	if len(capture.writerTime) != 2 {
		t.Fatalf("writer times %v: want one per partition", capture.writerTime)
	}
	checkState(t, ctx, node, s, topic, mode)
}

// checkState checks that etcd holds exactly the blocks the stream
// describes (the reference model's answer), in whichever layout they were
// written.
func checkState(t *testing.T, ctx context.Context, node *etcdNode, s *Stream, topic string, mode keyspace.HashMode) {
	t.Helper()
	got, err := readState(ctx, node.cli, keyspace.Default())
	if err != nil {
		t.Fatal(err)
	}
	m := refmodel.New(refmodel.Config{HashMode: mode})
	for i := range s.Records {
		kr := s.KafkaRecord(topic, i)
		hs := map[string]string{}
		for _, h := range kr.Headers {
			hs[h.Key] = string(h.Value)
		}
		m.Apply(refmodel.Record{Key: string(kr.Key), Headers: hs, Value: kr.Value})
	}
	want := m.Blocks()
	refmodel.SortBlocks(want)
	if len(want) == 0 {
		t.Fatal("the stream leaves no block: nothing to compare")
	}
	if diff := gocmp.Diff(want, got); diff != "" {
		t.Fatalf("etcd holds %d blocks, the stream describes %d (-want +got):\n%s", len(got), len(want), diff)
	}
}

// TestFleetSmall runs the fleet measurement on a small stream (the race
// detector watches the pacer, the producer's callbacks and the probes)
// and checks its accounting.
func TestFleetSmall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(2*time.Minute))
	defer cancel()
	trace := loadTestTrace(t)
	// Caches big enough that no block leaves both tiers: every probe must
	// then see its batch's endpoint.
	s, err := BuildStream(trace, StreamConfig{Endpoints: 4, GPUBlocks: 512, CPUBlocks: 4096, Requests: 200})
	if err != nil {
		t.Fatal(err)
	}
	res, err := RunFleet(ctx, FleetConfig{Stream: s, Partitions: 2, ProbeEvery: 2})
	if err != nil {
		t.Fatal(err)
	}
	wantProbes := (len(s.Records) + 1) / 2
	p := &res.Paced
	if len(p.Freshness.Sorted) != wantProbes || p.Visible != wantProbes {
		t.Fatalf("%d probes, %d visible; want %d each", len(p.Freshness.Sorted), p.Visible, wantProbes)
	}
	if len(p.Sent.Sorted) != wantProbes || len(p.Shown.Sorted) != wantProbes || len(p.Acks.Sorted) != wantProbes {
		t.Fatalf("stages: %d, %d, %d; want %d each", len(p.Acks.Sorted), len(p.Sent.Sorted), len(p.Shown.Sorted), wantProbes)
	}
	if res.Fraction != 0.5 || res.TargetRate <= 0 || res.CeilingRate() <= 0 || len(res.CeilingWriters) != 2 {
		t.Fatalf("fraction %v, target %v, ceiling %v, writers %v", res.Fraction, res.TargetRate, res.CeilingRate(), res.CeilingWriters)
	}
	// The unpaced run probes every 64th record (the default).
	if want := (len(s.Records) + 63) / 64; len(res.E2E.Freshness.Sorted) != want || res.E2E.Elapsed <= 0 {
		t.Fatalf("unpaced run: %d probes in %s; want %d", len(res.E2E.Freshness.Sorted), res.E2E.Elapsed, want)
	}
	// The paced run's ingester wrote something, the watcher saw at least
	// one event per transaction (each writes the offset key), and the v1
	// writer wrote one key per block op it kept.
	if p.Txns == 0 || p.Ops < p.Txns || p.WatchEvents < p.Txns || p.WatchBytes <= p.WatchEvents || p.DB.InUse <= 0 {
		t.Fatalf("paced run: %d txns, %d ops, %d watch events, %d watch bytes, DB %+v", p.Txns, p.Ops, p.WatchEvents, p.WatchBytes, p.DB)
	}
	if res.V1.BlockOps == 0 || res.V1.BlockOps > res.BlockOps || res.V1DB.InUse <= 0 || res.V1Time <= 0 {
		t.Fatalf("v1 writer: %+v of %d block ops, DB %+v, time %s", res.V1, res.BlockOps, res.V1DB, res.V1Time)
	}
	for _, f := range res.Figures() {
		if !(f.Value > 0) {
			t.Errorf("figure %s = %v, want positive", f.Name, f.Value)
		}
	}
}
