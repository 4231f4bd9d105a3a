package bridge_test

import (
	"testing"
	"time"

	"github.com/kvindex/kvindex/bridge"
	"github.com/kvindex/kvindex/bridge/bridgetest"
	"github.com/kvindex/kvindex/internal/contract"
	"github.com/kvindex/kvindex/internal/sim/enginesim"
)

func TestGaplessDelivery(t *testing.T) {
	e := newEnv(t, nil)
	cfg := e.config(nil)
	r := e.start(cfg, true)
	want := e.publish(200)
	check(t, "records", want, e.read(200))
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	check(t, "records after shutdown", nil, e.readAll())
	checkMetrics(t, cfg, map[string]float64{
		"kvindex_bridge_batches_received_total{source=live}":     200,
		"kvindex_bridge_records_produced_total{kind=batch}":      200,
		"kvindex_bridge_gaps_total":                              0,
		"kvindex_bridge_resyncs_total":                           0,
		"kvindex_bridge_batches_replayed_total":                  0,
		"kvindex_bridge_replay_requests_total{outcome=complete}": 1,
		"kvindex_bridge_produce_seconds":                         200,
	})
}

func TestLateStartCaughtUpByReplay(t *testing.T) {
	e := newEnv(t, nil)
	before := e.publish(50) // nobody subscribed: PUB sends nothing
	cfg := e.config(nil)
	e.start(cfg, true)
	after := e.publish(30)
	check(t, "records", cat(before, after), e.read(80))
	checkMetrics(t, cfg, map[string]float64{
		"kvindex_bridge_batches_replayed_total": 50,
		"kvindex_bridge_resyncs_total":          0,
		"kvindex_bridge_gaps_total":             0,
	})
}

func TestEmptyEngineAtStart(t *testing.T) {
	// The first replay finds an empty buffer, so the stream starts at 0:
	// a first live batch past 0 is a gap to heal, not a start.
	e := newEnv(t, nil)
	cfg := e.config(nil)
	e.start(cfg, true)
	e.engine.DropNext(3)
	want := e.publish(10)
	check(t, "records", want, e.read(10))
	checkMetrics(t, cfg, map[string]float64{
		"kvindex_bridge_gaps_total":    1,
		"kvindex_bridge_resyncs_total": 0,
	})
	checkReplayed(t, cfg, 3, 10)
}

// checkReplayed checks how many batches came from the replay socket: at
// least the dropped ones, at most all (a replay also returns what was
// published after the gap, which then arrives live as a duplicate).
func checkReplayed(t *testing.T, cfg bridge.Config, least, most int) {
	t.Helper()
	n := metric(t, cfg, "kvindex_bridge_batches_replayed_total")
	dups := metric(t, cfg, "kvindex_bridge_batches_duplicate_total", "source", "live")
	if n < float64(least) || n > float64(most) {
		t.Errorf("replayed %v batches, want %d to %d", n, least, most)
	}
	if dups != n-float64(least) {
		t.Errorf("%v live duplicates, want %v (replayed past the gap)", dups, n-float64(least))
	}
}

func TestGapHealedByReplay(t *testing.T) {
	for _, tc := range []struct {
		name    string
		dropped int
		holes   [2]int // DropReplay(after, n) before the gap
	}{
		{"one_batch", 1, [2]int{}},
		{"many_batches", 300, [2]int{}},
		{"replay_answer_with_holes", 40, [2]int{5, 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			cfg := e.config(nil)
			e.start(cfg, true)
			want := e.publish(10)
			if tc.holes[1] > 0 {
				e.engine.DropReplay(tc.holes[0], tc.holes[1])
			}
			e.engine.DropNext(tc.dropped)
			want = append(want, e.publish(tc.dropped+10)...)
			check(t, "records", want, e.read(len(want)))
			checkMetrics(t, cfg, map[string]float64{
				"kvindex_bridge_gaps_total":    1,
				"kvindex_bridge_resyncs_total": 0,
			})
			checkReplayed(t, cfg, tc.dropped, tc.dropped+10)
			if tc.holes[1] > 0 {
				if n := metric(t, cfg, "kvindex_bridge_replay_requests_total", "outcome", "hole"); n != 1 {
					t.Errorf("replay answers with a hole = %v, want 1", n)
				}
			}
		})
	}
}

func TestUnrecoverableGap(t *testing.T) {
	t.Run("buffer_overrun", func(t *testing.T) {
		e := newEnv(t, func(c *enginesim.Config) { c.BufferSize = 4 })
		cfg := e.config(nil)
		e.start(cfg, true)
		first := e.publish(10)
		e.engine.DropNext(10)
		e.publish(11) // seqs 10-19 dropped, 20 live; the buffer holds 17-20
		want := cat(first, []rec{control(contract.KindResync)}, e.batches(0, 17, 20))
		check(t, "records", want, e.read(len(want)))
		checkMetrics(t, cfg, map[string]float64{
			"kvindex_bridge_gaps_total":                           1,
			"kvindex_bridge_resyncs_total{reason=replay_overrun}": 1,
		})
	})
	t.Run("no_replay_socket", func(t *testing.T) {
		e := newEnv(t, func(c *enginesim.Config) { c.ReplayAddr = "" })
		cfg := e.config(nil)
		e.start(cfg, true)
		first := e.publish(5)
		e.engine.DropNext(3)
		e.publish(3)
		rest := e.publish(2)
		want := cat(first, []rec{control(contract.KindResync)}, rest)
		check(t, "records", want, e.read(len(want)))
		checkMetrics(t, cfg, map[string]float64{
			"kvindex_bridge_gaps_total":                             1,
			"kvindex_bridge_resyncs_total{reason=no_replay_socket}": 1,
		})
	})
}

func TestReconnectSameProcess(t *testing.T) {
	e := newEnv(t, nil)
	cfg := e.config(nil)
	r := e.start(cfg, true)
	want := e.publish(10)
	check(t, "records before the blip", want, e.read(10))
	e.engine.DisconnectAll()
	e.reconnecting()
	missed := e.publish(5) // published while the bridge reconnects, or after
	e.waitLive(r)
	more := e.publish(5)
	check(t, "records after the blip", cat(missed, more), e.read(10))
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	check(t, "extra records", nil, e.readAll())
	checkMetrics(t, cfg, map[string]float64{
		"kvindex_bridge_engine_connects_total": 2,
		"kvindex_bridge_engine_restarts_total": 0,
		"kvindex_bridge_resyncs_total":         0,
	})
}

func TestEngineRestartPassedThrough(t *testing.T) {
	for _, tc := range []struct {
		name       string
		replay     bool
		newBatches int
		want       func(e *env) []rec
	}{
		{
			// Fewer new batches than the old process had: the replay
			// finds nothing at our last seq.
			name: "fewer_batches_than_before", replay: true, newBatches: 4,
			want: func(e *env) []rec { return e.batches(1, 0, 3) },
		},
		{
			// More: the replay finds our last seq with other bytes.
			name: "more_batches_than_before", replay: true, newBatches: 15,
			want: func(e *env) []rec { return e.batches(1, 0, 14) },
		},
		{
			// Without a replay socket nothing can be verified: resync.
			name: "no_replay_socket", replay: false, newBatches: 3,
			want: func(e *env) []rec { return cat([]rec{control(contract.KindResync)}, e.batches(1, 0, 2)) },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, func(c *enginesim.Config) {
				if !tc.replay {
					c.ReplayAddr = ""
				}
			})
			cfg := e.config(nil)
			r := e.start(cfg, true)
			check(t, "first process", e.publish(10), e.read(10))
			e.restartEngine()
			if tc.replay {
				// Publish before the bridge reconnects: only the replay
				// can deliver these.
				e.publish(tc.newBatches)
				e.waitLive(r)
			} else {
				e.waitLive(r)
				e.publish(tc.newBatches)
			}
			want := tc.want(e)
			check(t, "second process", want, e.read(len(want)))
			if err := r.Stop(); err != nil {
				t.Fatal(err)
			}
			check(t, "extra records", nil, e.readAll())
			restarts := 0.0
			if tc.replay {
				restarts = 1
			}
			if n := metric(t, cfg, "kvindex_bridge_engine_restarts_total"); n != restarts {
				t.Errorf("engine restarts = %v, want %v", n, restarts)
			}
		})
	}
}

func TestBridgeRestartIsNotEngineRestart(t *testing.T) {
	e := newEnv(t, nil)
	cfg1 := e.config(func(c *bridge.Config) { c.GracePeriod = 200e6 })
	r1 := e.start(cfg1, true)
	first := e.publish(20)
	check(t, "first bridge", first, e.read(20))
	if err := r1.Stop(); err != nil { // the engine is still there: no goodbye
		t.Fatal(err)
	}
	e.publish(5) // published while no bridge runs
	cfg2 := e.config(nil)
	r2 := e.start(cfg2, true)
	more := e.publish(5)
	// The second bridge replays the engine's whole buffer from seq 0:
	// duplicates of what the first produced, in order, then the rest.
	want := cat(e.batches(0, 0, 24), more)
	check(t, "second bridge", want, e.read(len(want)))
	if err := r2.Stop(); err != nil {
		t.Fatal(err)
	}
	check(t, "extra records (goodbye or resync)", nil, e.readAll())
	checkMetrics(t, cfg1, map[string]float64{
		"kvindex_bridge_shutdowns_total{outcome=engine_still_there}": 1,
	})
	checkMetrics(t, cfg2, map[string]float64{
		"kvindex_bridge_batches_replayed_total": 25,
		"kvindex_bridge_resyncs_total":          0,
		"kvindex_bridge_engine_restarts_total":  0,
	})
}

func TestShutdown(t *testing.T) {
	for _, tc := range []struct {
		name       string
		engineGone bool
		want       []rec
		outcome    string
	}{
		{"goodbye_when_engine_gone", true, []rec{control(contract.KindGoodbye)}, "engine_gone"},
		{"no_goodbye_when_engine_still_there", false, nil, "engine_still_there"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			cfg := e.config(func(c *bridge.Config) { c.GracePeriod = 300e6 })
			r := e.start(cfg, true)
			check(t, "batches", e.publish(5), e.read(5))
			if tc.engineGone {
				if err := e.engine.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if err := r.Stop(); err != nil {
				t.Fatal(err)
			}
			check(t, "records at shutdown", tc.want, e.readAll())
			checkMetrics(t, cfg, map[string]float64{
				"kvindex_bridge_shutdowns_total{outcome=" + tc.outcome + "}": 1,
			})
		})
	}
}

func TestShutdownFlushesReceivedBatches(t *testing.T) {
	// Batches the bridge has received when told to stop still reach
	// Kafka, and the goodbye comes after them.
	e := newEnv(t, nil)
	cfg := e.config(func(c *bridge.Config) { c.GracePeriod = 300e6 })
	r := e.start(cfg, true)
	want := e.publish(100)
	if _, err := e.consumer.Read(e.ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := e.engine.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	got := e.readAll()
	if len(got) == 0 || got[len(got)-1].Kind() != contract.KindGoodbye {
		t.Fatalf("last record is not a goodbye:\n%s", describe(got))
	}
	// Every batch produced is one of the published ones, in order, with
	// no gap (the bridge may not have received the tail before stopping).
	got = got[:len(got)-1]
	check(t, "batches before the goodbye", want[1:1+len(got)], got)
}

func TestEngineReplacedUnderLiveConnection(t *testing.T) {
	// The PUB connection still delivers the old process while the replay
	// socket already answers for a new one (two simulated engines stand in
	// for the two sides). The bridge must not produce the old process's
	// batches after the new one's: it drops what the connection still
	// delivers and reconnects.
	e := newEnv(t, nil)
	replayEngine, err := enginesim.New(enginesim.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer replayEngine.Close()
	cfg := e.config(func(c *bridge.Config) { c.ReplayEndpoint = replayEngine.ReplayEndpoint() })
	r := e.start(cfg, true)
	first := e.publish(5)
	for i := range first {
		if _, err := replayEngine.Publish(e.ctx, e.payloads[0][i]); err != nil {
			t.Fatal(err)
		}
	}
	check(t, "old process", first, e.read(5))

	if err := replayEngine.Restart(e.ctx); err != nil {
		t.Fatal(err)
	}
	var second []rec
	for i := range 3 {
		p := e.workload.Next().MustEncode()
		if _, err := replayEngine.Publish(e.ctx, p); err != nil {
			t.Fatal(err)
		}
		second = append(second, bridgetest.BatchRecord(pod, model, 0, uint64(i), p))
	}
	e.reconnecting()
	e.engine.DropNext(2)
	e.publish(3) // seqs 5, 6 dropped; 7 arrives live and reveals the gap
	check(t, "new process", second, e.read(3))
	e.waitLive(r)
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	check(t, "after the new process (old batches must not follow)", nil, e.readAll())
	checkMetrics(t, cfg, map[string]float64{
		"kvindex_bridge_engine_restarts_total":                           1,
		"kvindex_bridge_messages_skipped_total{reason=stale_connection}": 1,
		"kvindex_bridge_engine_connects_total":                           2,
		"kvindex_bridge_resyncs_total":                                   0,
	})
}

// TestEndlessReplayAnswer: a replay answer that only repeats a batch the
// bridge has produced, never ending, fails once ReplayTimeout passes
// without a new batch, like a silent one; after the replay attempts the
// gap is resynced and the live batches flow again. It held the sequencer
// for good before: no produce and no heartbeat (a fault attack).
func TestEndlessReplayAnswer(t *testing.T) {
	e := newEnv(t, nil)
	cfg := e.config(func(c *bridge.Config) { c.ReplayTimeout = 300 * time.Millisecond })
	e.start(cfg, true)
	first := e.publish(3)
	e.engine.RepeatReplay(50 * time.Millisecond)
	e.engine.DropNext(2)
	e.publish(2) // dropped on PUB: a gap, which replay cannot heal
	rest := e.publish(2)
	want := cat(first, []rec{control(contract.KindResync)}, rest)
	check(t, "records", want, e.read(len(want)))
	checkMetrics(t, cfg, map[string]float64{
		"kvindex_bridge_gaps_total":                         1,
		"kvindex_bridge_resyncs_total{reason=unhealed_gap}": 1,
	})
}

// TestReplayBackoffAfterFailedHeal: once a heal has failed, later live
// gaps are resynced at once for ReplayBackoff instead of waiting on the
// replay socket again (ReplayAttempts × ReplayTimeout each). Before, a
// replay socket that never gave a usable answer held the stream that long
// at every gap, and with a small engine high-water mark the PUB overflow
// during the wait made the next gap: a resync every 15 s for as long as
// replay stayed broken. After the backoff, a gap asks again, and a replay
// that answers ends it.
func TestReplayBackoffAfterFailedHeal(t *testing.T) {
	e := newEnv(t, nil)
	cfg := e.config(func(c *bridge.Config) {
		c.ReplayTimeout = 200 * time.Millisecond
		c.ReplayAttempts = 2
		c.ReplayBackoff, c.MaxReplayBackoff = time.Hour, time.Hour
	})
	e.start(cfg, true)
	first := e.publish(3)
	e.engine.RepeatReplay(20 * time.Millisecond)
	e.engine.DropNext(2)
	e.publish(2) // a gap the broken replay cannot heal
	second := e.publish(2)
	e.engine.DropNext(1)
	e.publish(1) // a second gap, while replay is backed off
	third := e.publish(2)
	want := cat(first, []rec{control(contract.KindResync)}, second, []rec{control(contract.KindResync)}, third)
	check(t, "records", want, e.read(len(want)))
	checkMetrics(t, cfg, map[string]float64{
		"kvindex_bridge_gaps_total":                           2,
		"kvindex_bridge_resyncs_total{reason=unhealed_gap}":   1,
		"kvindex_bridge_resyncs_total{reason=replay_backoff}": 1,
		// Two requests for the first gap (ReplayAttempts), none for the
		// second.
		"kvindex_bridge_replay_requests_total{outcome=error}": 2,
	})
}
