package ingester

import (
	"context"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
)

// kvindex_ingester_lag_records grows while a worker retries: with etcd
// cut off, the worker is stuck retrying its transaction and takes no more
// fetched records, yet the lag follows the records produced (it is set
// from the topic's end offsets, listed every second). It used to freeze
// at its value before the stall.
func TestLagGrowsWhileWorkerRetries(t *testing.T) {
	t.Parallel()
	const topic = "lag"
	e := newEnv(t, 1, []string{topic})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(60*time.Second))
	defer cancel()
	px := testutil.StartProxy(t, testutil.HostPort(e.etcd.Endpoints[0]))
	cli, err := testutil.NewEtcdClient([]string{px.Endpoint()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	cfg := e.config(t, topic, "g-lag", "/kvindex/lag/")
	cfg.Etcd = cli
	r := start(t, cfg)
	now := time.Now()
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic,
		ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{store(t, "p", now, 1)}))
	lag := func() float64 { return promtest.ToFloat64(r.in.m.lag.WithLabelValues("0")) }

	px.Cut()
	// One record the worker takes and cannot commit: it retries.
	ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{heartbeat("p", now)})
	for promtest.ToFloat64(r.in.m.txnRetries) < 1 {
		select {
		case <-ctx.Done():
			t.Fatal("the worker never retried with etcd cut off")
		case <-time.After(20 * time.Millisecond):
		}
	}
	// 50 more arrive while it retries.
	recs := make([]refmodel.Record, 50)
	for i := range recs {
		recs[i] = heartbeat("p", now)
	}
	ingesttest.Produce(t, ctx, e.prod, topic, recs)
	for lag() < 50 {
		select {
		case <-ctx.Done():
			t.Fatalf("lag_records = %v with 51 records produced while the worker retries, want at least 50", lag())
		case <-time.After(50 * time.Millisecond):
		}
	}
	px.Restore(testutil.HostPort(e.etcd.Endpoints[0]))
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic, ingesttest.Offsets{0: 51})
	for lag() != 0 {
		select {
		case <-ctx.Done():
			t.Fatalf("lag_records = %v once everything is applied, want 0", lag())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
