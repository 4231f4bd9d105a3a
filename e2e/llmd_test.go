package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/bridge"
	"github.com/kvindex/kvindex/bridge/bridgetest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/sim/enginesim"
)

// TestBindBridgeThroughPipeline runs one bind-mode bridge for
// three pods that connect to it as llm-d's pods do: each a simulated
// engine whose PUB socket dials the bridge with llm-d's topic
// kv@<pod>@<model>, numbers batches from 1 as llm-d-inference-sim does,
// and answers replays with the topic frame from its own address
// (127.0.0.N:PORT, so one --replay-pattern tcp://{host}:PORT reaches
// each). After live batches, a gap healed from one pod's replay socket and
// a dropped connection the pod redials, indexd answers for each pod
// exactly what that engine's cache holds.
func TestBindBridgeThroughPipeline(t *testing.T) {
	t.Parallel()
	seed := genSeed(t)
	rig := newBridgeRig(t)
	ctx := bridgeCtx(t)
	// The pods' replay sockets are open before the bridge learns the port.
	replayLs, port, err := enginesim.ListenSamePort(ctx, []string{"127.0.0.20", "127.0.0.21", "127.0.0.22"})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range replayLs {
		t.Cleanup(func() { l.Close() }) // each engine's from New on; twice is harmless
	}
	cfg := bridge.DefaultConfig()
	cfg.Listen = "tcp://127.0.0.1:0"
	cfg.ReplayPattern = "tcp://{host}:" + strconv.Itoa(port)
	cfg.Brokers, cfg.Topic = rig.p.kafka.Brokers, topic
	cfg.HeartbeatInterval, cfg.GracePeriod = time.Hour, 0
	cfg.ReconnectBackoff, cfg.MaxReconnectBackoff = 10*time.Millisecond, 100*time.Millisecond
	cfg.Registry = prometheus.NewRegistry()
	b, err := bridge.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := bridgetest.Start(t, b)
	if err := bridgetest.WaitReady(ctx, b); err != nil {
		t.Fatal(err)
	}
	var eps []*simEndpoint
	for i := range 3 {
		// A model per pod: the workloads of different seeds share
		// blocks, and checkEngine wants each Lookup to match one pod.
		model := fmt.Sprintf("bridge-e2e/%s/%d", t.Name(), i)
		host := fmt.Sprintf("127.0.0.%d", 20+i)
		ec := enginesim.DefaultConfig()
		ec.Connect = strings.TrimPrefix(b.Addr(), "tcp://")
		ec.Topic = "kv@" + host + ":8000@" + model
		ec.ReplayListener = replayLs[i]
		ec.FirstSeq, ec.ReplayTopicFrame = 1, true
		eng, err := enginesim.New(ec)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { eng.Close() })
		if err := eng.WaitSubscriptions(ctx, 1); err != nil {
			t.Fatal(err)
		}
		eps = append(eps, &simEndpoint{
			rig: rig, ctx: ctx, engine: eng, cfg: cfg, subs: 1,
			ep:   keyspace.Endpoint{Model: model, Pod: host + ":8000"},
			work: enginesim.NewWorkload(seed+uint64(i), workloadConfig),
			// Seq 0 is never published: the engine numbers from 1.
			procs: [][][]byte{{nil}},
		})
	}
	from := rig.tail.pos()
	for range 2 {
		for _, e := range eps {
			e.landed(t, from, e.publish(t, 15))
		}
	}
	for _, e := range eps {
		e.checkEngine(t, "live, "+e.ep.Pod)
	}

	// One pod's gap, healed from its own replay socket.
	eps[1].engine.DropNext(6)
	eps[1].landed(t, from, eps[1].publish(t, 10))
	// Another's connection dropped: it redials, the bridge catches it up.
	eps[2].engine.DisconnectAll()
	eps[2].engine.DropNext(4)
	eps[2].publish(t, 4)
	eps[2].subs++
	if err := eps[2].engine.WaitSubscriptions(ctx, eps[2].subs); err != nil {
		t.Fatal(err)
	}
	for _, e := range eps {
		e.landed(t, from, e.publish(t, 5))
	}
	for _, e := range eps {
		e.checkEngine(t, "after the gap and the reconnect, "+e.ep.Pod)
		e.checkStream(t, seqs(0, 1, uint64(len(e.procs[0])-1)))
	}
	checkMetrics(t, cfg, map[string]float64{
		"kvindex_bridge_resyncs_total": 0,
	})
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
}
