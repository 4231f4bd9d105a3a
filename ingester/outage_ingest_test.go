package ingester

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
)

// TestOutageAgesNobody (DESIGN semantics 8, v1.1), on a fake clock with
// the default windows (liveness 30 s, threshold 15 s, grace 30 s): the
// whole topic goes silent for twice the liveness window, as when the
// broker is down; nothing is dropped. Once records flow again, a pod that
// died together with the fleet ("silent") leaves within the window plus
// the grace, and one that heartbeats ("chatty") stays. The old rule aged
// both on wall time through the outage and dropped them at its end.
func TestOutageAgesNobody(t *testing.T) {
	const topic = "outage"
	e := newEnv(t, 1, []string{topic})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(60*time.Second))
	defer cancel()
	clock := clockwork.NewFakeClockAt(time.Now())
	cfg := e.config(t, topic, "g-outage", "/kvindex/outage/")
	cfg.Clock = clock
	r := start(t, cfg)
	t0 := clock.Now()
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic,
		ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{store(t, "silent", t0, 1, 2), store(t, "chatty", t0, 3)}))

	// The outage: 60 s without a record, in steps, so that the worker's
	// ticks (once caught up, the partition clock is this clock) and the
	// end-offset listings may run through it.
	for range 12 {
		clock.Advance(5 * time.Second)
	}
	// Records flow again: chatty heartbeats every 5 s. Every record runs
	// the expiry before it applies, so the first one decides
	// deterministically what the outage did.
	beat := func() {
		ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic,
			ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{heartbeat("chatty", clock.Now())}))
	}
	end := clock.Now()
	beat()
	for _, pod := range []string{"silent", "chatty"} {
		if ok, n := present(t, ctx, e, cfg.Keyspace, pod); !ok || n == 0 {
			t.Fatalf("%s after a 60 s outage: record %v, %d blocks; want it kept (outage time ages nobody)", pod, ok, n)
		}
	}
	beat = func() {
		clock.Advance(5 * time.Second)
		ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic,
			ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{heartbeat("chatty", clock.Now())}))
	}
	for clock.Now().Before(end.Add(25 * time.Second)) { // within the grace
		beat()
	}
	if ok, n := present(t, ctx, e, cfg.Keyspace, "silent"); !ok || n != 2 {
		t.Fatalf("silent within the grace after the outage: record %v, %d blocks; want it kept", ok, n)
	}
	for clock.Now().Before(end.Add(cfg.LivenessWindow + 5*time.Second)) { // grace (= window) + a tick
		beat()
	}
	ingesttest.WaitFor(t, ctx, e.etcd.Client, cfg.Keyspace.Prefix(), "silent to leave after the grace", func() bool {
		ok, n := present(t, ctx, e, cfg.Keyspace, "silent")
		return !ok && n == 0
	})
	if ok, n := present(t, ctx, e, cfg.Keyspace, "chatty"); !ok || n != 1 {
		t.Fatalf("chatty after the outage: record %v, %d blocks; want its block kept", ok, n)
	}
	if n := promtest.ToFloat64(r.in.m.outages.WithLabelValues("topic")); n != 1 {
		t.Errorf("outages_total{kind=topic} = %v, want 1", n)
	}
	if s := promtest.ToFloat64(r.in.m.outageSeconds); s < 59 {
		t.Errorf("outage_seconds_total = %v, want about 60", s)
	}
}

// TestClaimAfterSilenceGivesGrace: the ingester is down together with the
// whole fleet (no record reaches the topic) for twice the liveness
// window; the next owner's first records are new ones. It was not
// consuming the partition, so every endpoint gets the grace: the
// heartbeating pod keeps its block, the dead one leaves after the grace.
// The old rule dropped both at the first record.
func TestClaimAfterSilenceGivesGrace(t *testing.T) {
	const topic = "claim-silence"
	e := newEnv(t, 1, []string{topic})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(60*time.Second))
	defer cancel()
	clock := clockwork.NewFakeClockAt(time.Now())
	cfg := e.config(t, topic, "g-claim-silence", "/kvindex/claim-silence/")
	cfg.Clock = clock
	first := start(t, cfg)
	t0 := clock.Now()
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic,
		ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{store(t, "silent", t0, 1, 2), store(t, "chatty", t0, 3)}))
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}

	clock.Advance(60 * time.Second)
	second := start(t, cfg)
	second.waitOwned(t, ctx, 1)
	// Every record runs the expiry before it applies, so each check after
	// a heartbeat is deterministic.
	beat := func() {
		ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic,
			ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{heartbeat("chatty", clock.Now())}))
		clock.Advance(5 * time.Second)
	}
	flow := clock.Now()
	for clock.Now().Before(flow.Add(25 * time.Second)) {
		beat()
	}
	for _, pod := range []string{"silent", "chatty"} {
		if ok, n := present(t, ctx, e, cfg.Keyspace, pod); !ok || n == 0 {
			t.Fatalf("%s within the grace after the claim: record %v, %d blocks; want it kept", pod, ok, n)
		}
	}
	for clock.Now().Before(flow.Add(cfg.LivenessWindow + 5*time.Second)) {
		beat()
	}
	ingesttest.WaitFor(t, ctx, e.etcd.Client, cfg.Keyspace.Prefix(), "silent to leave after the grace", func() bool {
		ok, n := present(t, ctx, e, cfg.Keyspace, "silent")
		return !ok && n == 0
	})
	if ok, n := present(t, ctx, e, cfg.Keyspace, "chatty"); !ok || n != 1 {
		t.Fatalf("chatty after the claim: record %v, %d blocks; want its block kept", ok, n)
	}
	if n := promtest.ToFloat64(second.in.m.outages.WithLabelValues("claim")); n != 1 {
		t.Errorf("outages_total{kind=claim} = %v, want 1", n)
	}
}
