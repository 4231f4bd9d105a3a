package bench

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/ingester"
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
	end, err := produceAll(ctx, prod, s, topic)
	prod.Close()
	if err != nil {
		t.Fatal(err)
	}
	capture, err := captureRun(ctx, ingesterOptions{partitions: 2, hashMode: mode, log: log, brokers: kafka.ListenAddrs(), topic: topic}, etcdOptions{noFsync: true}, end)
	if err != nil {
		t.Fatal(err)
	}
	if capture.transactions() == 0 || capture.blockOps() < int64(s.Stats.Misses) {
		t.Fatalf("captured %d transactions with %d block ops; the stream stores %d blocks", capture.transactions(), capture.blockOps(), s.Stats.Misses)
	}
	node, err := startEtcd(ctx, log, etcdOptions{noFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer node.close()
	if _, err := capture.rawWrite(ctx, node.cli, topic, ingester.DefaultMaxTxnsInFlight); err != nil {
		t.Fatal(err)
	}
	if len(capture.writerTime) != 2 {
		t.Fatalf("writer times %v: want one per partition", capture.writerTime)
	}
	ks := keyspace.Default()
	resp, err := node.cli.Get(ctx, ks.BlocksPrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, kv := range resp.Kvs {
		got = append(got, string(kv.Key))
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
	var want []string
	for _, b := range m.Blocks() {
		want = append(want, ks.BlockKey(b.Endpoint, b.Tier, b.Hash))
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("the reference writer left %d block keys, the stream describes %d; first few: %v vs %v",
			len(got), len(want), head(got), head(want))
	}
}

func head(s []string) string {
	return strings.Join(s[:min(3, len(s))], " ")
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
	if len(res.Freshness.Sorted) != wantProbes || res.Visible != wantProbes {
		t.Fatalf("%d probes, %d visible; want %d each", len(res.Freshness.Sorted), res.Visible, wantProbes)
	}
	if len(res.Sent.Sorted) != wantProbes || len(res.Shown.Sorted) != wantProbes || len(res.Acks.Sorted) != wantProbes {
		t.Fatalf("stages: %d, %d, %d; want %d each", len(res.Acks.Sorted), len(res.Sent.Sorted), len(res.Shown.Sorted), wantProbes)
	}
	if res.Fraction != 0.5 || res.TargetRate <= 0 || res.CeilingRate() <= 0 || len(res.CeilingWriters) != 2 {
		t.Fatalf("fraction %v, target %v, ceiling %v, writers %v", res.Fraction, res.TargetRate, res.CeilingRate(), res.CeilingWriters)
	}
	for _, f := range res.Figures() {
		if !(f.Value > 0) {
			t.Errorf("figure %s = %v, want positive", f.Name, f.Value)
		}
	}
}
