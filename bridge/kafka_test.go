package bridge_test

import (
	"bytes"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kvindex/kvindex/bridge"
	"github.com/kvindex/kvindex/bridge/bridgetest"
	"github.com/kvindex/kvindex/internal/contract"
	"github.com/kvindex/kvindex/internal/sim/enginesim"
)

func TestHeartbeats(t *testing.T) {
	e := newEnv(t, nil)
	clock := clockwork.NewFakeClock()
	cfg := e.config(func(c *bridge.Config) {
		c.Clock = clock
		c.HeartbeatInterval = 5 * time.Second
	})
	r := e.start(cfg, true)
	clock.Advance(5 * time.Second)
	check(t, "first heartbeat", []rec{control(contract.KindHeartbeat)}, e.read(1))
	batches := e.publish(3)
	check(t, "batches", batches, e.read(3))
	clock.Advance(5 * time.Second)
	check(t, "second heartbeat", []rec{control(contract.KindHeartbeat)}, e.read(1))

	// No heartbeat while the engine is away.
	if err := e.engine.Close(); err != nil {
		t.Fatal(err)
	}
	for !errors.Is(r.B.Ready(), bridge.ErrNotReady) { // readiness is only polled
		if err := e.ctx.Err(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	for range 3 {
		clock.Advance(5 * time.Second)
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	check(t, "records while the engine was away", nil, e.readAll())
}

func TestKafkaOutagesRetriedInOrder(t *testing.T) {
	e := newEnv(t, nil)
	cfg := e.config(func(c *bridge.Config) {
		// franz-go waits MetadataMinAge (5 s) between the metadata
		// refreshes a failed produce triggers; keep the test short.
		c.KafkaOptions = []kgo.Opt{
			kgo.MetadataMinAge(10 * time.Millisecond),
			kgo.RetryBackoffFn(func(int) time.Duration { return 10 * time.Millisecond }),
		}
	})
	r := e.start(cfg, true)
	want := e.publish(20)
	check(t, "before the outage", want, e.read(20))

	// Retriable errors, then dropped connections, on every produce for a
	// while: the idempotent producer retries without reordering or
	// duplicating anything.
	faults := e.kafka.Cluster.Fault(kfake.Fault{
		Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.NotEnoughReplicas, Count: 3,
	})
	var mu sync.Mutex
	drops := 0
	e.kafka.Cluster.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		mu.Lock()
		defer mu.Unlock()
		if drops >= 2 {
			return nil, nil, false
		}
		drops++
		e.kafka.Cluster.KeepControl()
		return nil, errors.New("injected connection drop"), true
	})
	during := e.publish(100)
	check(t, "through the outage", during, e.read(100))
	if faults.Hits() == 0 {
		t.Error("the produce faults never fired")
	}
	mu.Lock()
	if drops != 2 {
		t.Errorf("%d produce connections dropped, want 2", drops)
	}
	mu.Unlock()
	if err := r.Stop(); err != nil { // every promise has run once Run returns
		t.Fatal(err)
	}
	checkMetrics(t, cfg, map[string]float64{
		"kvindex_bridge_records_produced_total{kind=batch}": 120,
		"kvindex_bridge_records_lost_total":                 0,
	})
}

func TestBackpressureBoundsBuffers(t *testing.T) {
	e := newEnv(t, nil)
	const maxBuffered, queue = 8, 4
	cfg := e.config(func(c *bridge.Config) {
		c.MaxBufferedRecords = maxBuffered
		c.QueueSize = queue
	})
	e.start(cfg, true)
	release := make(chan struct{})
	e.kafka.Cluster.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		e.kafka.Cluster.KeepControl()
		e.kafka.Cluster.SleepControl(func() { <-release })
		return nil, nil, false
	})
	want := e.publish(300)
	// Kafka takes nothing: the client's buffer fills to its bound (the
	// gauge also counts the one record the producer goroutine is blocked
	// handing over), then both queues, then the bridge stops reading the
	// engine.
	buffered := func() (float64, float64) {
		return metric(t, cfg, "kvindex_bridge_buffered_records"), metric(t, cfg, "kvindex_bridge_queued_messages")
	}
	for {
		b, q := buffered()
		if b > maxBuffered+1 || q > 2*queue {
			t.Fatalf("buffered %v records and queued %v messages, bounds %d and %d", b, q, maxBuffered+1, 2*queue)
		}
		if b == maxBuffered+1 && q == 2*queue {
			break
		}
		if err := e.ctx.Err(); err != nil {
			t.Fatalf("buffers never filled: %v records, %v queued", b, q)
		}
		time.Sleep(time.Millisecond)
	}
	more := e.publish(100)
	if b, q := buffered(); b > maxBuffered+1 || q > 2*queue {
		t.Fatalf("after more batches: buffered %v records and queued %v messages, bounds %d and %d", b, q, maxBuffered+1, 2*queue)
	}
	close(release)
	check(t, "records after the stall", cat(want, more), e.read(400))
}

func TestRecordTooLarge(t *testing.T) {
	e := newEnv(t, nil)
	cfg := e.config(func(c *bridge.Config) { c.MaxRecordBytes = 1000 })
	e.start(cfg, true)
	first := e.publishRaw([]byte("batch 0"))
	e.publishRaw(bytes.Repeat([]byte("x"), 1001))
	last := e.publishRaw([]byte("batch 2"))
	check(t, "records", cat(first, []rec{control(contract.KindResync)}, last), e.read(3))
	checkMetrics(t, cfg, map[string]float64{
		"kvindex_bridge_messages_skipped_total{reason=record_too_large}": 1,
		"kvindex_bridge_resyncs_total{reason=record_too_large}":          1,
	})
}

func TestMessageTooLarge(t *testing.T) {
	// A ZMQ message over the limit breaks the connection before it is
	// read; the replay cannot deliver it either: resync, then go on.
	e := newEnv(t, nil)
	cfg := e.config(func(c *bridge.Config) {
		c.MaxRecordBytes = 1000
		c.MaxMessageBytes = 1000
	})
	r := e.start(cfg, true)
	first := e.publishRaw([]byte("batch 0"))
	check(t, "first batch", first, e.read(1))
	e.reconnecting()
	e.publishRaw(bytes.Repeat([]byte("x"), 5000))
	check(t, "resync", []rec{control(contract.KindResync)}, e.read(1))
	e.waitLive(r)
	last := e.publishRaw([]byte("batch 2"))
	check(t, "after the resync", last, e.read(1))
	checkMetrics(t, cfg, map[string]float64{
		"kvindex_bridge_messages_skipped_total{reason=message_too_large}": 1,
		"kvindex_bridge_resyncs_total{reason=replay_failed}":              1,
		"kvindex_bridge_replay_requests_total{outcome=error}":             float64(cfg.ReplayAttempts),
	})
}

func TestFatalProduceErrorStopsRun(t *testing.T) {
	e := newEnv(t, nil)
	cfg := e.config(func(c *bridge.Config) { c.GracePeriod = time.Minute })
	r := e.start(cfg, true)
	e.kafka.Cluster.Fault(kfake.Fault{
		Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.TopicAuthorizationFailed, Count: -1,
	})
	e.publish(1)
	select {
	case <-r.Done():
	case <-e.ctx.Done():
		t.Fatal("Run did not stop on a refused record")
	}
	if err := r.Err(); !errors.Is(err, bridge.ErrProduce) {
		t.Fatalf("Run = %v, want ErrProduce", err)
	}
	if err := r.B.Ready(); !errors.Is(err, bridge.ErrProduce) {
		t.Errorf("Ready = %v, want ErrProduce", err)
	}
}

func TestDataParallelRank(t *testing.T) {
	// The sidecar of rank 2 is given the engine's configured endpoints and
	// its rank; vLLM's engine of rank 2 listens on port + 2.
	e := newEnv(t, nil)
	e.rank = 2
	base := func(ep string) string {
		host, port, err := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
		if err != nil {
			t.Fatal(err)
		}
		p, _ := strconv.Atoi(port)
		return "tcp://" + net.JoinHostPort(host, strconv.Itoa(p-2))
	}
	clock := clockwork.NewFakeClock()
	cfg := e.config(func(c *bridge.Config) {
		c.DPRank = 2
		var err error
		if c.Endpoint, err = bridge.OffsetEndpointPort(base(e.engine.PubEndpoint()), 2); err != nil {
			t.Fatal(err)
		}
		if c.ReplayEndpoint, err = bridge.OffsetEndpointPort(base(e.engine.ReplayEndpoint()), 2); err != nil {
			t.Fatal(err)
		}
		c.Clock = clock
	})
	e.start(cfg, true)
	e.workload = enginesim.NewWorkload(3, enginesim.WorkloadConfig{Rank: 2, HasRank: true})
	check(t, "batches", e.publish(3), e.read(3))
	clock.Advance(cfg.HeartbeatInterval)
	check(t, "heartbeat", []rec{bridgetest.ControlRecord(pod, model, 2, contract.KindHeartbeat)}, e.read(1))
	checkMetrics(t, cfg, map[string]float64{"kvindex_bridge_dp_rank_mismatches_total": 0})
}

func TestRankMismatchReported(t *testing.T) {
	// The batches say rank 1, the bridge was told rank 0: the records go
	// out unchanged (the ingester skips them) and the bridge reports it.
	e := newEnv(t, nil)
	cfg := e.config(nil)
	e.start(cfg, true)
	e.workload = enginesim.NewWorkload(5, enginesim.WorkloadConfig{Rank: 1, HasRank: true})
	check(t, "batches", e.publish(3), e.read(3))
	checkMetrics(t, cfg, map[string]float64{"kvindex_bridge_dp_rank_mismatches_total": 1})
}
