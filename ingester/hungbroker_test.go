package ingester

import (
	"context"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
)

// TestStopWithHungBroker: a broker that stops answering (SIGSTOP, a
// network that drops packets) must not hold the ingester's stop past its
// session timeout, after which the broker has expired the member anyway.
// Leaving the group waited for Kafka's request timeouts, 70 s in a fault
// attack, past Kubernetes' 60 s grace period.
func TestStopWithHungBroker(t *testing.T) {
	t.Parallel()
	const topic = "hung"
	e := newEnv(t, 1, []string{topic})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	px := testutil.StartProxy(t, e.kafka.Brokers[0])
	cfg := e.config(t, topic, "g-hung", "/kvindex/hung/")
	cfg.KafkaOptions = append(cfg.KafkaOptions, px.KafkaDialer())
	r := start(t, cfg)
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic,
		ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{store(t, "p", time.Now(), 1)}))

	px.Hang()
	began := time.Now()
	if err := r.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if took, most := time.Since(began), 3*cfg.SessionTimeout+5*time.Second; took > most {
		t.Errorf("stopping with the broker hung took %v, want at most %v (the session timeout %v, and slack)", took.Round(time.Millisecond), most, cfg.SessionTimeout)
	}
}
