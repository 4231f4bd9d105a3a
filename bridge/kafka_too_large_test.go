package bridge_test

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kvindex/kvindex/bridge/bridgetest"
	"github.com/kvindex/kvindex/internal/contract"
	"github.com/kvindex/kvindex/internal/testutil"
)

// TestBatchKafkaRefusesAsTooLargeIsSkipped: a batch under
// --max-record-bytes that the broker refuses for good with
// MESSAGE_TOO_LARGE (a topic whose max.message.bytes is below
// --max-record-bytes + 2 KiB, lowered after the bridge was deployed)
// takes the record_too_large path: skipped, counted, a resync in its
// place, and the stream goes on. The good batches Kafka refused with it
// (one produce batch) are produced again, in order. Before, the refusal
// stopped Run with ErrProduce, the good batches of the same request were
// lost uncounted, and every restarted bridge replayed the engine's buffer
// and died on the same batch again: a crash loop.
func TestBatchKafkaRefusesAsTooLargeIsSkipped(t *testing.T) {
	e := newEnv(t, nil)
	e.kafka = testutil.StartKafka(t, topic, 1, kfake.BrokerConfigs(map[string]string{"message.max.bytes": "200000"}))
	e.consumer = bridgetest.NewConsumer(t, e.kafka.Brokers, topic)
	poison := make([]byte, 300000) // incompressible, under MaxRecordBytes
	rand.NewChaCha8([32]byte{1}).Read(poison)
	var good [][]byte
	for i := range 5 {
		good = append(good, bytes.Repeat([]byte{byte(i)}, 100))
	}
	// Published before the bridge starts: its catch-up produces them at
	// once, so the good batches share the poison's produce batch.
	first := e.publishRaw(good...)
	e.publishRaw(poison)
	cfg := e.config(nil)
	r := e.start(cfg, true)
	want := cat(first, []rec{control(contract.KindResync)})
	check(t, "records up to the refused batch", want, e.read(len(want)))
	more := e.publishRaw([]byte("after 0"), []byte("after 1"))
	check(t, "records after it", more, e.read(len(more)))
	if err := r.B.Ready(); err != nil {
		t.Errorf("Ready = %v, want nil: a batch too large for the topic must not stop the bridge", err)
	}
	if err := r.Stop(); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	check(t, "extra records", nil, e.readAll())
	checkMetrics(t, cfg, map[string]float64{
		"kvindex_bridge_messages_skipped_total{reason=record_too_large}": 1,
		"kvindex_bridge_resyncs_total{reason=record_too_large}":          1,
		"kvindex_bridge_records_produced_total{kind=batch}":              7,
		"kvindex_bridge_records_produced_total{kind=resync}":             1,
		"kvindex_bridge_records_lost_total":                              0,
	})
}
