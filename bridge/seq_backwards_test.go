package bridge_test

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvindex/kvindex/bridge/bridgetest"
)

// TestLiveSeqBackwardsResyncs: the engine behind an unbroken PUB
// connection (a ZMQ proxy in between, or a publisher whose counter was
// reset) starts again at seq 0. A seq at or below the connection's
// previous one is never a duplicate (PUB sends each batch once, in
// order): the bridge produces a resync (reason seq_backwards) and the new
// stream from there. Before, every seq below the cursor counted as a
// duplicate, unchecked: the new process's batches 0..9 were dropped,
// logged nowhere, and its batch 10 produced as if it continued the old
// process, so the ingester kept the old process's blocks (ghosts).
func TestLiveSeqBackwardsResyncs(t *testing.T) {
	w := newScriptWorld(t, true, nil)
	w.start()
	for s := uint64(0); s < 10; s++ {
		w.e.publish(s, payloadOf("A", s))
	}
	got, err := w.c.Read(w.ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	w.e.restartBehindProxy()
	for s := uint64(0); s < 15; s++ {
		w.e.publish(s, payloadOf("B", s))
	}
	time.Sleep(time.Second)
	rest, err := w.c.ReadAll(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, rest...)
	t.Logf("records: %s", describeShort(got))
	sawB0, sawResync := false, false
	for _, r := range got {
		if string(r.Value) == "B-batch-0" {
			sawB0 = true
		}
		if r.Kind() == "resync" {
			sawResync = true
		}
	}
	dups := metric(t, w.cfg, "kvindex_bridge_batches_duplicate_total", "source", "live")
	restarts := metric(t, w.cfg, "kvindex_bridge_engine_restarts_total")
	t.Logf("duplicates{live}=%v engine_restarts=%v", dups, restarts)
	if !sawB0 || !sawResync {
		t.Errorf("the new process's batches 0..9 were dropped as duplicates (%v counted) and its later batches produced as continuing the old process, with no resync and no restart detected (%v)", dups, restarts)
	}
	var want []string
	for s := uint64(0); s < 10; s++ {
		want = append(want, fmt.Sprintf("%s@%d", payloadOf("A", s), s))
	}
	want = append(want, "[resync]")
	for s := uint64(0); s < 15; s++ {
		want = append(want, fmt.Sprintf("%s@%d", payloadOf("B", s), s))
	}
	if got, w := describeShort(got), strings.Join(want, " ")+" "; got != w {
		t.Errorf("records:\n got %s\nwant %s", got, w)
	}
	if n := metric(t, w.cfg, "kvindex_bridge_resyncs_total", "reason", "seq_backwards"); n != 1 {
		t.Errorf("resyncs{seq_backwards} = %v, want 1", n)
	}
}

// TestBogusFarSeqCostsOneResync: one live message with a huge seq (a
// corrupted frame, a publisher bug) moves the cursor there; the next
// normal batch is below the connection's previous seq, so the stream
// went back: one resync (seq_backwards) and the stream goes on from it,
// with or without a replay socket. Before, every later batch was below
// the cursor and dropped as a duplicate, logged nowhere, for as long as
// the connection lived.
func TestBogusFarSeqCostsOneResync(t *testing.T) {
	for _, replay := range []bool{false, true} {
		t.Run(fmt.Sprintf("replay_%v", replay), func(t *testing.T) {
			w := newScriptWorld(t, replay, nil)
			w.start()
			for s := uint64(0); s < 5; s++ {
				w.e.publish(s, payloadOf("A", s))
			}
			if _, err := w.c.Read(w.ctx, 5); err != nil {
				t.Fatal(err)
			}
			w.e.sendLive([]byte{}, seqFrame(1<<62), []byte("bogus"))
			for s := uint64(5); s < 25; s++ {
				w.e.publish(s, payloadOf("A", s))
			}
			time.Sleep(2 * time.Second)
			rest, err := w.c.ReadAll(w.ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("records after the bogus one: %s", describeShort(rest))
			n := 0
			for _, r := range rest {
				if r.Kind() == "" && string(r.Value) != "bogus" {
					n++
				}
			}
			if n < 20 {
				t.Errorf("%d of the 20 normal batches after one bogus seq 2^62 reached Kafka; duplicates{live}=%v", n,
					metric(t, w.cfg, "kvindex_bridge_batches_duplicate_total", "source", "live"))
			}
			if n := metric(t, w.cfg, "kvindex_bridge_resyncs_total", "reason", "seq_backwards"); n != 1 {
				t.Errorf("resyncs{seq_backwards} = %v, want 1", n)
			}
		})
	}
}

// TestReplayFarFutureSeqRecovers: after a reconnection the replay socket
// answers with a seq far past the cursor (a wrong or buggy replay
// socket). The bridge takes it as an overrun (resync) and moves its
// cursor there; the next live batch is below the cursor and was produced
// by no replay, so the bridge asks the replay socket whether the engine
// holds the cursor's batch; it does not, so the stream went back: one
// resync (seq_backwards) and the live stream goes on. Before, every later
// live batch was dropped as a duplicate.
func TestReplayFarFutureSeqRecovers(t *testing.T) {
	w := newScriptWorld(t, true, nil)
	w.start()
	for s := uint64(0); s < 5; s++ {
		w.e.publish(s, payloadOf("A", s))
	}
	if _, err := w.c.Read(w.ctx, 5); err != nil {
		t.Fatal(err)
	}
	w.e.mu.Lock()
	w.e.answer = func(_ net.Conn, zc *zmq4.Conn, from uint64) {
		zc.SendMsg(zmq4.NewMsgFrom([]byte{}, seqFrame(1<<40), []byte("garbage")))
		zc.SendMsg(endMsg())
	}
	w.e.mu.Unlock()
	w.e.dropPub()
	w.e.waitSubs(w.ctx, 2)
	if err := bridgetest.WaitReady(w.ctx, w.r.B); err != nil {
		t.Fatal(err)
	}
	w.e.mu.Lock()
	w.e.answer = nil
	w.e.mu.Unlock()
	for s := uint64(5); s < 25; s++ {
		w.e.publish(s, payloadOf("A", s))
	}
	time.Sleep(2 * time.Second)
	rest, err := w.c.ReadAll(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("records after the reconnection: %s", describeShort(rest))
	n := 0
	for _, r := range rest {
		if r.Kind() == "" && string(r.Value) != "garbage" {
			n++
		}
	}
	if n < 20 {
		t.Errorf("%d of 20 live batches after a replay answer at seq 2^40 reached Kafka; duplicates{live}=%v", n,
			metric(t, w.cfg, "kvindex_bridge_batches_duplicate_total", "source", "live"))
	}
	checkMetrics(t, w.cfg, map[string]float64{
		"kvindex_bridge_resyncs_total{reason=replay_overrun}": 1,
		"kvindex_bridge_resyncs_total{reason=seq_backwards}":  1,
	})
}
