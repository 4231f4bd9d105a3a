package indexd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/internal/testutil"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// waitFor polls cond every 10 ms until it holds or testTimeout passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// gathered is the value of the replica's gauge or counter name.
func gathered(t *testing.T, r *replica, name string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.Metric) == 1 {
			if g := mf.Metric[0].Gauge; g != nil {
				return g.GetValue()
			}
			return mf.Metric[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// progressOf looks up nothing and returns the answer's progress time.
func progressOf(t *testing.T, r *replica) time.Time {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	resp, err := r.api.Lookup(ctx, &kvindexv1.LookupRequest{Model: "m", BlockHashes: []uint64{1}})
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	if resp.ProgressTime == nil {
		t.Fatal("Lookup answer carries no progress_time")
	}
	return resp.ProgressTime.AsTime()
}

// An idle replica whose etcd is healthy keeps proving itself current:
// RequestProgress every ProgressInterval moves every answer's
// progress_time although no key changes.
func TestProgressTimeAdvancesWhileIdle(t *testing.T) {
	e := testutil.StartEtcd(t)
	r := startReplica(t, e.Client, func(c *Config) { c.ProgressInterval = 20 * time.Millisecond })
	r.waitServing(t)
	first := progressOf(t, r)
	waitFor(t, "progress_time to advance with no writes", func() bool {
		return progressOf(t, r).Sub(first) >= 100*time.Millisecond
	})
	if age := gathered(t, r, "kvindex_indexd_progress_age_seconds"); age > 5 {
		t.Fatalf("progress age %v s on a healthy idle replica", age)
	}
	r.stop()
}

// During an etcd outage the replica keeps answering from its last state,
// and says how stale it is: progress_time freezes, the age metric grows,
// a warning is counted, /readyz (Ready) fails past MaxStaleness and so
// does the kvindex.v1.IndexService health status, while the overall ("")
// status, liveness, stays SERVING; once etcd is back, all of it recovers.
func TestStaleDuringEtcdOutage(t *testing.T) {
	e := testutil.StartEtcd(t)
	px := testutil.StartProxy(t, testutil.HostPort(e.Endpoints[0]))
	w := newWriter(t, e.Client)
	s := newStream(t, w, 1)
	r := startReplica(t, ownClient(t, []string{px.Endpoint()}), func(c *Config) {
		c.ProgressInterval = 20 * time.Millisecond
		c.StaleLogAfter = 200 * time.Millisecond
		c.MaxStaleness = 400 * time.Millisecond
	})
	r.waitServing(t)
	s.step(10)
	s.check(r)
	if err := r.srv.Ready(); err != nil {
		t.Fatalf("Ready() = %v before the outage", err)
	}

	px.Cut()
	waitFor(t, "Ready to report staleness", func() bool { return errors.Is(r.srv.Ready(), ErrStale) })
	frozen := progressOf(t, r)
	if age := time.Since(frozen); age < 400*time.Millisecond {
		t.Fatalf("progress_time %v is only %v old while Ready says stale", frozen, age)
	}
	// Still answers from the last state (the reference is unchanged).
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	checkHealth := func(when, service string, want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		waitFor(t, when+": health of "+service+" "+want.String(), func() bool {
			h, err := r.health.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
			return err == nil && h.Status == want
		})
	}
	checkHealth("during the outage", serviceName, healthpb.HealthCheckResponse_NOT_SERVING)
	if h, err := r.health.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("overall health during the outage = %v, %v; want SERVING (liveness)", h, err)
	}
	if age := gathered(t, r, "kvindex_indexd_progress_age_seconds"); age < 0.4 {
		t.Fatalf("progress age metric %v s, want at least 0.4", age)
	}
	waitFor(t, "the stale warning", func() bool { return promtest.ToFloat64(r.srv.m.staleWarnings) == 1 })

	px.Restore(testutil.HostPort(e.Endpoints[0]))
	waitFor(t, "Ready after etcd is back", func() bool { return r.srv.Ready() == nil })
	checkHealth("after the outage", serviceName, healthpb.HealthCheckResponse_SERVING)
	if p := progressOf(t, r); !p.After(frozen) {
		t.Fatalf("progress_time %v did not move past %v after the outage", p, frozen)
	}
	s.step(10)
	s.check(r)
	if n := promtest.ToFloat64(r.srv.m.staleWarnings); n != 1 {
		t.Fatalf("stale warnings = %v, want 1 (one per episode)", n)
	}
	r.stop()
}

// With MaxStaleness off (0), a stale replica stays ready and SERVING.
func TestMaxStalenessOffKeepsReady(t *testing.T) {
	e := testutil.StartEtcd(t)
	px := testutil.StartProxy(t, testutil.HostPort(e.Endpoints[0]))
	r := startReplica(t, ownClient(t, []string{px.Endpoint()}), func(c *Config) {
		c.ProgressInterval = 20 * time.Millisecond
		c.StaleLogAfter = 100 * time.Millisecond
		c.MaxStaleness = 0
	})
	r.waitServing(t)
	px.Cut()
	waitFor(t, "the stale warning", func() bool { return promtest.ToFloat64(r.srv.m.staleWarnings) == 1 })
	if err := r.srv.Ready(); err != nil {
		t.Fatalf("Ready() = %v with MaxStaleness off", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if h, err := r.health.Check(ctx, &healthpb.HealthCheckRequest{Service: serviceName}); err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health with MaxStaleness off = %v, %v; want SERVING", h, err)
	}
	px.Restore(testutil.HostPort(e.Endpoints[0]))
	r.stop()
}

// The default MaxStaleness makes staleness visible out of the box.
func TestMaxStalenessOnByDefault(t *testing.T) {
	if got := DefaultConfig().MaxStaleness; got <= 0 {
		t.Fatalf("DefaultConfig().MaxStaleness = %v, want a positive default (staleness visible in /readyz and health)", got)
	}
}

// A stale replica, NOT_SERVING for kvindex.v1.IndexService, still answers
// Lookups, so the client's WithStaleAfter search (which does not use
// gRPC health) keeps working: with one replica cut off from etcd and one
// current, every answer is the current one; with both cut off, Lookups
// still answer.
func TestStaleReplicaStillAnswersClientSearch(t *testing.T) {
	e := testutil.StartEtcd(t)
	px := testutil.StartProxy(t, testutil.HostPort(e.Endpoints[0]))
	fast := func(c *Config) {
		c.ProgressInterval = 20 * time.Millisecond
		c.StaleLogAfter = 100 * time.Millisecond
		c.MaxStaleness = 200 * time.Millisecond
	}
	stale := startReplica(t, ownClient(t, []string{px.Endpoint()}), fast)
	fresh := startReplica(t, e.Client, fast)
	stale.waitServing(t)
	fresh.waitServing(t)
	px.Cut()
	waitFor(t, "the cut-off replica to go stale", func() bool { return errors.Is(stale.srv.Ready(), ErrStale) })
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	waitFor(t, "the cut-off replica's "+serviceName+" NOT_SERVING", func() bool {
		h, err := stale.health.Check(ctx, &healthpb.HealthCheckRequest{Service: serviceName})
		return err == nil && h.Status == healthpb.HealthCheckResponse_NOT_SERVING
	})
	c, err := client.New(stale.srv.Addr().String()+","+fresh.srv.Addr().String(), client.WithStaleAfter(150*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 10 {
		res, err := c.Lookup(ctx, "m", []uint64{1})
		if err != nil {
			t.Fatalf("Lookup %d: %v", i, err)
		}
		if age := time.Since(res.ProgressTime); age > time.Second {
			t.Fatalf("Lookup %d: answer %v old; want the current replica's", i, age)
		}
	}
	// Both stale: Lookups still answer, from the last state.
	fresh.stop()
	only, err := client.New(stale.srv.Addr().String(), client.WithStaleAfter(150*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer only.Close()
	if _, err := only.Lookup(ctx, "m", []uint64{1}); err != nil {
		t.Fatalf("Lookup on a stale replica: %v; want an answer from the last state", err)
	}
	px.Restore(testutil.HostPort(e.Endpoints[0]))
}

// TestSlowListWarns: a replica whose first list etcd does not answer says
// so in its log, naming the call it waits on, instead of staying silent
// until the list completes (47 s of nothing in a fault attack), and lists
// once etcd answers.
func TestSlowListWarns(t *testing.T) {
	e := testutil.StartEtcd(t)
	px := testutil.StartProxy(t, testutil.HostPort(e.Endpoints[0]))
	px.Cut()
	var logs testutil.LogBuffer
	r := startReplica(t, ownClient(t, []string{px.Endpoint()}), func(c *Config) {
		c.ProgressInterval = 20 * time.Millisecond
		c.StaleLogAfter = 100 * time.Millisecond
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	waitFor(t, "the slow-list warning", func() bool { return promtest.ToFloat64(r.srv.m.staleWarnings) == 1 })
	if got := logs.String(); !strings.Contains(got, `msg="listing etcd is taking long: no answer yet, still waiting" step="reading endpoints/"`) {
		t.Fatalf("log = %q, want the slow-list warning naming its step", got)
	}
	px.Restore(testutil.HostPort(e.Endpoints[0]))
	r.waitServing(t)
	if n := promtest.ToFloat64(r.srv.m.staleWarnings); n != 1 {
		t.Errorf("stale warnings = %v, want 1 (one per list, the next a while later)", n)
	}
}

// TestDeliveriesAfterSilenceNeedProof: events that reach a replica after a
// silence (here held by a paused proxy, as a SIGSTOPped or CPU-starved
// process finds its socket's backlog) are applied but do not make the
// index current "now": they may have waited. Only a progress check sent
// after the silence, once the index has applied its revision, does. Before,
// every delivery marked progress at its arrival, so a paused replica with
// a backlog said "current again" and put a fresh progress_time on answers
// while it was still behind.
func TestDeliveriesAfterSilenceNeedProof(t *testing.T) {
	e := testutil.StartEtcd(t)
	px := testutil.StartProxy(t, testutil.HostPort(e.Endpoints[0]))
	w := newWriter(t, e.Client)
	s := newStream(t, w, 7)
	clk := clockwork.NewFakeClock()
	var logs testutil.LogBuffer
	r := startReplica(t, ownClient(t, []string{px.Endpoint()}), func(c *Config) {
		c.Clock = clk
		c.ProgressInterval = 100 * time.Millisecond
		c.StaleLogAfter = 200 * time.Millisecond
		c.MaxStaleness = 250 * time.Millisecond
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	r.waitServing(t)
	s.step(10)
	s.check(r)
	before := clk.Now()
	if p := progressOf(t, r); !p.Equal(before) {
		t.Fatalf("progress_time %v before the silence, want the clock's %v", p, before)
	}

	px.Pause()
	s.step(20)
	// Three progress intervals of silence, one at a time: each tick's
	// check goes unanswered until it gives up (checkTimeout), so none is
	// left to be answered after the pause.
	for i := 1; i <= 3; i++ {
		clk.Advance(100 * time.Millisecond)
		waitFor(t, fmt.Sprintf("progress check %d, sent in the silence, to give up", i), func() bool {
			return strings.Count(logs.String(), "checking watch progress failed") == i
		})
	}
	px.Resume()
	s.check(r) // what waited is applied
	if p := progressOf(t, r); !p.Equal(before) {
		t.Fatalf("progress_time %v after deliveries that waited, want %v: only a check sent after the silence proves the index current", p, before)
	}
	if err := r.srv.Ready(); !errors.Is(err, ErrStale) {
		t.Fatalf("Ready() = %v before any proof, want ErrStale", err)
	}

	clk.Advance(100 * time.Millisecond)
	proved := clk.Now()
	waitFor(t, "a progress check to prove the index current", func() bool { return progressOf(t, r).Equal(proved) })
	if err := r.srv.Ready(); err != nil {
		t.Fatalf("Ready() = %v after the proof", err)
	}
	r.stop()
}

// TestBusyReplicaRecoversAfterSilence: a replica whose keyspace keeps
// changing, paused past --max-staleness, is ready again soon after it
// runs: deliveries do not count after the silence, so the proof must come
// from a progress check the watch catches up with while writes go on.
func TestBusyReplicaRecoversAfterSilence(t *testing.T) {
	e := testutil.StartEtcd(t)
	px := testutil.StartProxy(t, testutil.HostPort(e.Endpoints[0]))
	w := newWriter(t, e.Client)
	s := newStream(t, w, 9)
	r := startReplica(t, ownClient(t, []string{px.Endpoint()}), func(c *Config) {
		c.ProgressInterval = 20 * time.Millisecond
		c.StaleLogAfter = 100 * time.Millisecond
		c.MaxStaleness = 200 * time.Millisecond
	})
	r.waitServing(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the only user of s until wg.Wait
		defer wg.Done()
		for ctx.Err() == nil {
			s.step(1)
			time.Sleep(2 * time.Millisecond)
		}
	}()
	px.Pause()
	waitFor(t, "Ready to report staleness", func() bool { return errors.Is(r.srv.Ready(), ErrStale) })
	px.Resume()
	waitFor(t, "Ready while writes go on", func() bool { return r.srv.Ready() == nil })
	cancel()
	wg.Wait()
	s.check(r)
	r.stop()
}
