package bridge_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kvindex/kvindex/bridge"
	"github.com/kvindex/kvindex/bridge/bridgetest"
	"github.com/kvindex/kvindex/internal/sim/enginesim"
	"github.com/kvindex/kvindex/internal/testutil"
)

// BenchmarkThroughput measures batches per second from an engine's PUB
// socket into Kafka through the bridge, against a reference measured in
// the same run: the same payloads produced straight to the same kfake
// broker by a franz-go client with the same producer settings, read back
// by the same kind of consumer. ratio = bridge time / reference time (1.0:
// the bridge adds nothing).
func BenchmarkThroughput(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(5*time.Minute))
	defer cancel()
	w := enginesim.NewWorkload(11, enginesim.WorkloadConfig{})
	payloads := make([][]byte, b.N)
	var bytes int64
	for i := range payloads {
		payloads[i] = w.Next().MustEncode()
		bytes += int64(len(payloads[i]))
	}

	// Reference: produce straight to Kafka.
	ref := testutil.StartKafka(b, "ref", 1)
	refConsumer := bridgetest.NewConsumer(b, ref.Brokers, "ref")
	cl, err := kgo.NewClient(kgo.SeedBrokers(ref.Brokers...), kgo.DefaultProduceTopic("ref"),
		kgo.RequiredAcks(kgo.AllISRAcks()), kgo.MaxBufferedRecords(10000))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	start := time.Now()
	for i, p := range payloads {
		r := bridgetest.BatchRecord(pod, model, 0, uint64(i), p)
		rec := &kgo.Record{Key: []byte(r.Key), Value: p}
		for k, v := range r.Headers {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
		cl.Produce(ctx, rec, nil)
	}
	if _, err := refConsumer.Read(ctx, b.N); err != nil {
		b.Fatal(err)
	}
	refElapsed := time.Since(start)

	// The bridge, fed by the simulated engine.
	eng, err := enginesim.New(enginesim.Config{PubAddr: "127.0.0.1:0", ReplayAddr: "127.0.0.1:0", BufferSize: 10000, HWM: 100000})
	if err != nil {
		b.Fatal(err)
	}
	defer eng.Close()
	k := testutil.StartKafka(b, topic, 1)
	consumer := bridgetest.NewConsumer(b, k.Brokers, topic)
	cfg := bridge.DefaultConfig()
	cfg.Endpoint, cfg.ReplayEndpoint = eng.PubEndpoint(), eng.ReplayEndpoint()
	cfg.Pod, cfg.Model, cfg.Brokers, cfg.Topic = pod, model, k.Brokers, topic
	cfg.GracePeriod, cfg.HeartbeatInterval = 0, time.Hour
	cfg.Registry = prometheus.NewRegistry()
	br, err := bridge.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	r := bridgetest.Start(b, br)
	if err := bridgetest.WaitReady(ctx, br); err != nil {
		b.Fatal(err)
	}
	if err := eng.WaitSubscribed(ctx, 1); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(bytes / int64(b.N))
	b.ResetTimer()
	start = time.Now()
	for _, p := range payloads {
		if _, err := eng.Publish(ctx, p); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := consumer.Read(ctx, b.N); err != nil {
		b.Fatal(err)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	if err := r.Stop(); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "batches/s")
	b.ReportMetric(float64(b.N)/refElapsed.Seconds(), "ref_batches/s")
	b.ReportMetric(elapsed.Seconds()/refElapsed.Seconds(), "ratio")
	b.ReportMetric(metric(b, cfg, "kvindex_bridge_batches_replayed_total"), "replayed")
}
