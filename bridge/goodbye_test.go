package bridge_test

import (
	"testing"
	"time"

	"github.com/kvindex/kvindex/bridge"
	"github.com/kvindex/kvindex/internal/testutil"
)

// TestGoodbyeBoundedWithKafkaAndEngineDown stops a bridge after both Kafka
// and the engine have gone: the engine is gone, so Run tries a goodbye,
// which cannot be delivered. Run must still return, having spent at most
// its two flushes (FlushTimeout each), the grace period and the probes,
// and count the goodbye as lost (a bridge ran 92 s past a 5 s
// flush timeout).
func TestGoodbyeBoundedWithKafkaAndEngineDown(t *testing.T) {
	e := newEnv(t, nil)
	cfg := e.config(func(c *bridge.Config) {
		c.GracePeriod = 2 * time.Second
		c.FlushTimeout = 300 * time.Millisecond
	})
	r := e.start(cfg, true)
	check(t, "batches", e.publish(5), e.read(5))
	// A consumer can read a batch before its produce acknowledgement has
	// reached the bridge; closing the cluster then would fail that produce
	// at the stop and count it lost too. Wait for the five acks first, so
	// the only record lost is the goodbye.
	waitMetric(t, e.ctx, cfg, "kvindex_bridge_records_produced_total", 5, "kind", "batch")
	e.kafka.Cluster.Close()
	if err := e.engine.Close(); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- r.Stop() }()
	// The bound is what Run may spend (2 × FlushTimeout + GracePeriod) and
	// a wide margin for a loaded machine; the bug it guards against hung
	// for minutes.
	select {
	case err := <-stopped:
		if err == nil {
			t.Error("Run returned nil; want the goodbye's produce error")
		}
	case <-time.After(testutil.Timeout(20 * time.Second)):
		t.Fatal("Run still running 20 s after the stop, with FlushTimeout 300ms and GracePeriod 2s")
	}
	checkMetrics(t, cfg, map[string]float64{
		"kvindex_bridge_shutdowns_total{outcome=engine_gone}":              1,
		"kvindex_bridge_records_lost_total{reason=shutdown_flush_timeout}": 1,
	})
}

// TestUnsentCountedBeforeExit: with the broker hung, the records a
// shutdown flush gives up on are counted lost while the bridge still runs
// (here in its grace period), so a scrape can see them. (A fault attack
// scraped 251 buffered records and no loss 8 s into a stop: that was
// before its two 5 s flush timeouts had passed.)
func TestUnsentCountedBeforeExit(t *testing.T) {
	e := newEnv(t, nil)
	px := testutil.StartProxy(t, e.kafka.Brokers[0])
	cfg := e.config(func(c *bridge.Config) {
		c.GracePeriod = 3 * time.Second
		c.FlushTimeout = 300 * time.Millisecond
		c.KafkaOptions = append(c.KafkaOptions, px.KafkaDialer())
	})
	r := e.start(cfg, true)
	check(t, "batches", e.publish(2), e.read(2))
	waitMetric(t, e.ctx, cfg, "kvindex_bridge_records_produced_total", 2, "kind", "batch")
	px.Hang()    // the broker stops answering (SIGSTOP): produces stay in flight
	e.publish(3) // buffered
	waitMetric(t, e.ctx, cfg, "kvindex_bridge_buffered_records", 3)
	stopped := make(chan error, 1)
	go func() { stopped <- r.Stop() }()
	deadline := time.Now().Add(testutil.Timeout(10 * time.Second))
	for metric(t, cfg, "kvindex_bridge_records_lost_total", "reason", "shutdown_flush_timeout") < 3 {
		select {
		case <-stopped:
			t.Fatal("Run returned before the unsent records were counted lost")
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the unsent records were never counted lost while the bridge ran")
		}
		time.Sleep(20 * time.Millisecond)
	}
	<-stopped
	checkMetrics(t, cfg, map[string]float64{
		"kvindex_bridge_records_lost_total{reason=shutdown_flush_timeout}": 3,
	})
}
