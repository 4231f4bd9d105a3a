package bridge_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kvindex/kvindex/bridge"
	"github.com/kvindex/kvindex/bridge/bridgetest"
	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/sim/enginesim"
	"github.com/kvindex/kvindex/internal/testutil"
)

// benchPublishers is how many pods connect to the bind-mode bridge in
// BenchmarkBind.
const benchPublishers = 64

// BenchmarkBind measures one bind-mode bridge with 64 connected
// publishers (simulated engines dialing it, llm-d's topic each, all
// publishing at once) into Kafka: records/s (batches produced) and block
// ops/s (the block hashes those batches store or remove), against a
// reference measured in the same run: the same records produced straight
// to the same kind of kfake broker by one franz-go client, read back by
// the same kind of consumer. ratio = bridge time / reference time.
func BenchmarkBind(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(10*time.Minute))
	defer cancel()
	n := max(b.N, benchPublishers)
	per := (n + benchPublishers - 1) / benchPublishers
	n = per * benchPublishers
	payloads := make([][][]byte, benchPublishers)
	var bytes, ops int64
	dec := events.NewDecoder(nil)
	for i := range payloads {
		w := enginesim.NewWorkload(uint64(100+i), enginesim.WorkloadConfig{Capacity: 256})
		for range per {
			p := w.Next().MustEncode()
			batch, err := dec.Decode(p)
			if err != nil {
				b.Fatal(err)
			}
			for _, ev := range batch.Events {
				ops += int64(len(ev.BlockHashes))
			}
			bytes += int64(len(p))
			payloads[i] = append(payloads[i], p)
		}
	}
	pods := make([]string, benchPublishers)
	for i := range pods {
		pods[i] = fmt.Sprintf("127.0.%d.%d:8000", 1+i/200, 2+i%200)
	}

	// Reference: the same records straight to Kafka.
	ref := testutil.StartKafka(b, "ref", 4)
	refConsumer := bridgetest.NewConsumer(b, ref.Brokers, "ref")
	cl, err := kgo.NewClient(kgo.SeedBrokers(ref.Brokers...), kgo.DefaultProduceTopic("ref"),
		kgo.RequiredAcks(kgo.AllISRAcks()), kgo.MaxBufferedRecords(10000))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	start := time.Now()
	for j := range per {
		for i := range benchPublishers {
			r := bridgetest.BatchRecord(pods[i], model, 0, uint64(j+1), payloads[i][j])
			rec := &kgo.Record{Key: []byte(r.Key), Value: r.Value}
			for k, v := range r.Headers {
				rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
			}
			cl.Produce(ctx, rec, nil)
		}
	}
	if _, err := refConsumer.Read(ctx, n); err != nil {
		b.Fatal(err)
	}
	refElapsed := time.Since(start)

	// The bridge, with 64 pods connected.
	k := testutil.StartKafka(b, topic, 4)
	consumer := bridgetest.NewConsumer(b, k.Brokers, topic)
	// Every pod's replay socket is open before the bridge learns the port.
	hosts := make([]string, benchPublishers)
	for i := range hosts {
		hosts[i], _, _ = net.SplitHostPort(pods[i])
	}
	replayLs, port, err := enginesim.ListenSamePort(ctx, hosts)
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range replayLs {
		defer l.Close() // each engine's from New on; twice is harmless
	}
	cfg := bridge.DefaultConfig()
	cfg.Listen = "tcp://127.0.0.1:0"
	cfg.ReplayPattern = "tcp://{host}:" + strconv.Itoa(port)
	cfg.Brokers, cfg.Topic = k.Brokers, topic
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
	engines := make([]*enginesim.Engine, benchPublishers)
	for i := range engines {
		ec := enginesim.Config{Connect: strings.TrimPrefix(br.Addr(), "tcp://"), ReplayListener: replayLs[i],
			BufferSize: per + 1, HWM: per + 1, Topic: "kv@" + pods[i] + "@" + model, FirstSeq: 1, ReplayTopicFrame: true}
		eng, err := enginesim.New(ec)
		if err != nil {
			b.Fatal(err)
		}
		defer eng.Close()
		if err := eng.WaitSubscriptions(ctx, 1); err != nil {
			b.Fatal(err)
		}
		engines[i] = eng
	}
	b.SetBytes(bytes / int64(n))
	b.ResetTimer()
	start = time.Now()
	var wg sync.WaitGroup
	for i, eng := range engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, p := range payloads[i] {
				if _, err := eng.Publish(ctx, p); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if _, err := consumer.Read(ctx, n); err != nil {
		b.Fatal(err)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	if err := r.Stop(); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(n)/elapsed.Seconds(), "records/s")
	b.ReportMetric(float64(ops)/elapsed.Seconds(), "block_ops/s")
	b.ReportMetric(float64(n)/refElapsed.Seconds(), "ref_records/s")
	b.ReportMetric(elapsed.Seconds()/refElapsed.Seconds(), "ratio")
	b.ReportMetric(metric(b, cfg, "kvindex_bridge_resyncs_total"), "resyncs")
	b.ReportMetric(float64(ops)/float64(n), "block_ops/record")
}
