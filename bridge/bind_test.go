package bridge_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/bridge"
	"github.com/kvindex/kvindex/bridge/bridgetest"
	"github.com/kvindex/kvindex/internal/contract"
	"github.com/kvindex/kvindex/internal/sim/enginesim"
	"github.com/kvindex/kvindex/internal/testutil"
)

// bindEnv is a bind-mode bridge with publishers that dial it as llm-d's
// pods do: each a simulated engine with the PUB socket connecting to the
// bridge, topic kv@<pod>@<model>, and a replay socket on its own loopback
// address (127.0.0.N), so one pattern, tcp://{host}:PORT, reaches them
// all, as tcp://{host}:5558 reaches a fleet's pods.
type bindEnv struct {
	t          *testing.T
	ctx        context.Context
	kafka      *testutil.Kafka
	consumer   *bridgetest.Consumer
	cfg        bridge.Config
	running    *bridgetest.Running
	replayPort string
	// replayLs are the pods' replay listeners, all on replayPort: pod i
	// (host 127.0.0.<i+2>) serves on replayLs[i].
	replayLs []net.Listener
	engines  []*bindEngine
}

type bindEngine struct {
	pod    string
	engine *enginesim.Engine
	wl     *enginesim.Workload
	// want are the records the bridge must produce for the pod, in order.
	want []rec
}

// bindMaxPods is how many pods a bindEnv can add (addPod's i below it).
const bindMaxPods = 3

func newBindEnv(t *testing.T, mod func(*bridge.Config)) *bindEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(60*time.Second))
	t.Cleanup(cancel)
	k := testutil.StartKafka(t, topic, 4)
	// Every pod's replay socket is open before the bridge learns the port.
	var hosts []string
	for i := range bindMaxPods {
		hosts = append(hosts, fmt.Sprintf("127.0.0.%d", i+2))
	}
	ls, p, err := enginesim.ListenSamePort(ctx, hosts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, l := range ls {
			l.Close() // those no engine took; closing twice is harmless
		}
	})
	port := strconv.Itoa(p)
	cfg := bridge.DefaultConfig()
	cfg.Listen = "tcp://127.0.0.1:0"
	cfg.ReplayPattern = "tcp://{host}:" + port
	cfg.Brokers, cfg.Topic = k.Brokers, topic
	cfg.HeartbeatInterval = time.Hour
	cfg.GracePeriod = 0
	cfg.ReconnectBackoff = 10 * time.Millisecond
	cfg.MaxReconnectBackoff = 50 * time.Millisecond
	cfg.ReplayTimeout = 2 * time.Second
	cfg.Registry = prometheus.NewRegistry()
	if mod != nil {
		mod(&cfg)
	}
	b, err := bridge.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := bridgetest.Start(t, b)
	if err := bridgetest.WaitReady(ctx, b); err != nil {
		t.Fatal(err)
	}
	return &bindEnv{t: t, ctx: ctx, kafka: k, consumer: bridgetest.NewConsumer(t, k.Brokers, topic), cfg: cfg, running: r, replayPort: port, replayLs: ls}
}

// addPod starts pod i's engine (pod "127.0.0.<i+2>:8000"), numbering
// batches from first, answering replays with the topic frame when
// topicFrame, as llm-d-inference-sim does.
func (e *bindEnv) addPod(i int, first uint64, topicFrame bool) *bindEngine {
	e.t.Helper()
	host := fmt.Sprintf("127.0.0.%d", i+2)
	pod := host + ":8000"
	ec := enginesim.DefaultConfig()
	ec.Connect = e.bridgeAddr()
	ec.Topic = "kv@" + pod + "@" + model
	if i >= len(e.replayLs) {
		e.t.Fatalf("pod %d: the env opens replay sockets for %d pods", i, len(e.replayLs))
	}
	ec.ReplayListener = e.replayLs[i]
	ec.FirstSeq = first
	ec.ReplayTopicFrame = topicFrame
	eng, err := enginesim.New(ec)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { eng.Close() })
	be := &bindEngine{pod: pod, engine: eng, wl: enginesim.NewWorkload(uint64(10+i), enginesim.WorkloadConfig{Capacity: 64})}
	e.engines = append(e.engines, be)
	return be
}

func (e *bindEnv) bridgeAddr() string {
	a := e.running.B.Addr()
	if a == "" {
		e.t.Fatal("bridge has no address")
	}
	return a[len("tcp://"):]
}

// publish publishes n workload batches on be and notes their records.
func (e *bindEnv) publish(be *bindEngine, n int) {
	e.t.Helper()
	for range n {
		p := be.wl.Next().MustEncode()
		seq, err := be.engine.Publish(e.ctx, p)
		if err != nil {
			e.t.Fatal(err)
		}
		be.want = append(be.want, bridgetest.BatchRecord(be.pod, model, 0, seq, p))
	}
}

// waitConnected waits until the bridge has subscribed be's connection
// number n (counting from 1).
func (e *bindEnv) waitConnected(be *bindEngine, n uint64) {
	e.t.Helper()
	if err := be.engine.WaitSubscriptions(e.ctx, n); err != nil {
		e.t.Fatal(err)
	}
}

// readByPod reads n records and groups them by key, each pod's in the
// order produced.
func (e *bindEnv) readByPod(n int) map[string][]rec {
	e.t.Helper()
	got, err := e.consumer.Read(e.ctx, n)
	if err != nil {
		e.t.Fatalf("%v; got:\n%s", err, describe(got))
	}
	return byPod(got)
}

func byPod(rs []rec) map[string][]rec {
	out := map[string][]rec{}
	for _, r := range rs {
		r.Partition = 0
		out[r.Key] = append(out[r.Key], r)
	}
	return out
}

func (e *bindEnv) checkAll(got map[string][]rec) {
	e.t.Helper()
	for _, be := range e.engines {
		check(e.t, "records of "+be.pod, be.want, got[be.pod])
	}
	if len(got) != len(e.engines) {
		e.t.Errorf("records for %d pods, want %d", len(got), len(e.engines))
	}
}

func TestBindManyPods(t *testing.T) {
	// Three pods connect and publish; each one's batches come out in its
	// own order under its own key, the model taken from the topic. Pods 0
	// and 1 number from 1 and answer replays with the topic frame
	// (llm-d-inference-sim), pod 2 numbers from 0 without it (vLLM).
	e := newBindEnv(t, nil)
	for i := range 3 {
		be := e.addPod(i, uint64(1-i/2), i < 2)
		e.waitConnected(be, 1)
	}
	total := 0
	for round := range 3 {
		for _, be := range e.engines {
			e.publish(be, 5+round)
			total += 5 + round
		}
	}
	e.checkAll(e.readByPod(total))
	if err := e.running.Stop(); err != nil {
		t.Fatal(err)
	}
	check(t, "records after the last batch", nil, e.consumerRest())
	checkMetrics(t, e.cfg, map[string]float64{
		"kvindex_bridge_pods":                 3,
		"kvindex_bridge_resyncs_total":        0,
		"kvindex_bridge_gaps_total":           0,
		"kvindex_bridge_unknown_topics_total": 0,
	})
}

func (e *bindEnv) consumerRest() []rec {
	e.t.Helper()
	got, err := e.consumer.ReadAll(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	for i := range got {
		got[i].Partition = 0
	}
	return got
}

func TestBindCatchUpGapAndReconnect(t *testing.T) {
	// Per pod: batches published before its first message reached the
	// bridge are caught up by replay; a gap in one pod is healed from that
	// pod's replay socket alone; a dropped connection is redialed by the
	// pod and caught up. No resync anywhere.
	e := newBindEnv(t, nil)
	a := e.addPod(0, 1, true)
	b := e.addPod(1, 1, true)
	e.waitConnected(a, 1)
	e.waitConnected(b, 1)
	// a's first batches go out before the bridge knows pod a; the PUB
	// socket drops nothing (the connection is up) but the first message
	// triggers the catch-up, which must not duplicate anything.
	e.publish(a, 4)
	e.publish(b, 3)
	e.checkAll(e.readByPod(7))

	a.want, b.want = nil, nil
	a.engine.DropNext(3)
	e.publish(a, 6) // 3 dropped on PUB, healed by replay
	e.publish(b, 2)
	e.checkAll(e.readByPod(8))

	a.want, b.want = nil, nil
	a.engine.DisconnectAll() // a redials: a new connection takes the pod over
	a.engine.DropNext(2)
	e.publish(a, 2) // published while reconnecting: only in the buffer
	e.waitConnected(a, 2)
	e.publish(a, 3)
	e.publish(b, 1)
	e.checkAll(e.readByPod(6))
	if err := e.running.Stop(); err != nil {
		t.Fatal(err)
	}
	check(t, "records after the last batch", nil, e.consumerRest())
	checkMetrics(t, e.cfg, map[string]float64{
		"kvindex_bridge_resyncs_total":                        0,
		"kvindex_bridge_replay_requests_total{outcome=error}": 0,
	})
	if metric(t, e.cfg, "kvindex_bridge_batches_replayed_total") < 5 {
		t.Error("fewer than the 5 dropped batches were replayed")
	}
}

func TestBindNoReplayResyncsOnlyThatPod(t *testing.T) {
	// Without a replay pattern, a gap costs that pod a resync, and no
	// other pod anything.
	e := newBindEnv(t, func(c *bridge.Config) { c.ReplayPattern = "" })
	a := e.addPod(0, 1, true)
	b := e.addPod(1, 1, true)
	e.waitConnected(a, 1)
	e.waitConnected(b, 1)
	e.publish(a, 2)
	e.publish(b, 2)
	e.checkAll(e.readByPod(4))
	a.want, b.want = nil, nil
	a.engine.DropNext(1)
	if _, err := a.engine.Publish(e.ctx, a.wl.Next().MustEncode()); err != nil {
		t.Fatal(err)
	}
	a.want = append(a.want, bridgetest.ControlRecord(a.pod, model, 0, contract.KindResync))
	e.publish(a, 2)
	e.publish(b, 2)
	e.checkAll(e.readByPod(5))
	checkMetrics(t, e.cfg, map[string]float64{
		"kvindex_bridge_resyncs_total{reason=no_replay_socket}": 1,
	})
}

func TestBindUnknownTopicsAndPodLimit(t *testing.T) {
	// Topics that do not fit the pattern, and pods past MaxPods, are
	// skipped and counted; the pods within the limit go on. A topic that
	// fits no pattern is warned of once per 10 s, not per message.
	var logs testutil.LogBuffer
	e := newBindEnv(t, func(c *bridge.Config) {
		c.MaxPods = 2
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	a := e.addPod(0, 1, true)
	b := e.addPod(1, 1, true)
	e.waitConnected(a, 1)
	e.waitConnected(b, 1)
	e.publish(a, 1)
	e.publish(b, 1)
	e.checkAll(e.readByPod(2))
	// A third pod, over the limit.
	c := e.addPod(2, 1, true)
	e.engines = e.engines[:2]
	e.waitConnected(c, 1)
	for range 3 {
		if _, err := c.engine.Publish(e.ctx, c.wl.Next().MustEncode()); err != nil {
			t.Fatal(err)
		}
	}
	// A publisher whose topic has the prefix but not the shape.
	ec := enginesim.DefaultConfig()
	ec.Connect = e.bridgeAddr()
	ec.Topic = "kv@no-model-separator"
	ec.ReplayAddr = ""
	odd, err := enginesim.New(ec)
	if err != nil {
		t.Fatal(err)
	}
	defer odd.Close()
	if err := odd.WaitSubscriptions(e.ctx, 1); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := odd.Publish(e.ctx, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	a.want, b.want = nil, nil
	e.publish(a, 2)
	e.publish(b, 2)
	e.checkAll(e.readByPod(4))
	waitMetric(t, e.ctx, e.cfg, "kvindex_bridge_unknown_topics_total", 3, "reason", "too_many_pods")
	waitMetric(t, e.ctx, e.cfg, "kvindex_bridge_unknown_topics_total", 3, "reason", "no_match")
	if n := strings.Count(logs.String(), `level=WARN msg="message skipped: topic does not match the pattern`); n != 1 {
		t.Errorf("%d warnings of the off-pattern topic's 3 messages, want 1:\n%s", n, logs.String())
	}
	if err := e.running.Stop(); err != nil {
		t.Fatal(err)
	}
	check(t, "records after the last batch", nil, e.consumerRest())
}

// waitMetric polls a metric until it reaches want (the bridge counts
// skipped messages asynchronously to anything a test can wait on).
func waitMetric(t *testing.T, ctx context.Context, cfg bridge.Config, name string, want float64, labels ...string) {
	t.Helper()
	for {
		got := metric(t, cfg, name, labels...)
		if got >= want {
			if got > want {
				t.Errorf("%s%v = %v, want %v", name, labels, got, want)
			}
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s%v = %v, want %v", name, labels, got, want)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func TestBindConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*bridge.Config)
		ok   bool
	}{
		{"defaults", func(*bridge.Config) {}, true},
		{"every_interface", func(c *bridge.Config) { c.Listen = "tcp://*:5557" }, true},
		{"with_endpoint", func(c *bridge.Config) { c.Endpoint = "tcp://engine:5557" }, false},
		{"not_tcp", func(c *bridge.Config) { c.Listen = "ipc:///tmp/x" }, false},
		{"pattern_without_pod", func(c *bridge.Config) { c.TopicPattern = "kv@{model}" }, false},
		{"pattern_unknown_placeholder", func(c *bridge.Config) { c.TopicPattern = "kv@{pod}@{rank}" }, false},
		{"pattern_adjacent_placeholders", func(c *bridge.Config) { c.TopicPattern = "kv@{pod}{model}" }, false},
		{"pattern_without_model_needs_model", func(c *bridge.Config) { c.TopicPattern = "{pod}" }, false},
		{"pattern_without_model_with_model", func(c *bridge.Config) { c.TopicPattern = "{pod}"; c.Model = model }, true},
		{"replay_pattern", func(c *bridge.Config) { c.ReplayPattern = "tcp://{host}:5558" }, true},
		{"replay_pattern_bad", func(c *bridge.Config) { c.ReplayPattern = "tcp://{host}" }, false},
		{"replay_pattern_unknown", func(c *bridge.Config) { c.ReplayPattern = "tcp://{ip}:5558" }, false},
		{"max_pods_0", func(c *bridge.Config) { c.MaxPods = 0 }, false},
		{"idle_0", func(c *bridge.Config) { c.PodIdleTimeout = 0 }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := bridge.DefaultConfig()
			cfg.Listen = "tcp://127.0.0.1:0"
			cfg.Brokers, cfg.Topic = []string{"127.0.0.1:9092"}, topic
			tc.mod(&cfg)
			err := cfg.Validate()
			if (err == nil) != tc.ok {
				t.Errorf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// TestBindTakenOverPodComesBack: a second connection with a pod's topic
// takes the pod over; once it goes, the pod's first connection, still
// publishing, carries it again. Its messages were all dropped as stale
// before (a fault attack: the real pod left the index within 35 s).
func TestBindTakenOverPodComesBack(t *testing.T) {
	e := newBindEnv(t, nil)
	a := e.addPod(0, 1, true)
	e.waitConnected(a, 1)
	e.publish(a, 2)
	e.checkAll(e.readByPod(2))

	// The impostor: another publisher with a's topic, dialing the bridge,
	// its replay socket its own.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ec := enginesim.DefaultConfig()
	ec.Connect = e.bridgeAddr()
	ec.Topic = "kv@" + a.pod + "@" + model
	ec.ReplayListener = l
	ec.FirstSeq = a.engine.NextSeq()
	imp, err := enginesim.New(ec)
	if err != nil {
		t.Fatal(err)
	}
	if err := imp.WaitSubscriptions(e.ctx, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := imp.Publish(e.ctx, enginesim.NewWorkload(99, enginesim.WorkloadConfig{Capacity: 8}).Next().MustEncode()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.consumer.Read(e.ctx, 1); err != nil { // the impostor's batch, a's pod taken over
		t.Fatal(err)
	}
	imp.Close()

	// a goes on publishing: its messages must reach Kafka again.
	deadline := time.Now().Add(testutil.Timeout(20 * time.Second))
	for {
		p := a.wl.Next().MustEncode()
		if _, err := a.engine.Publish(e.ctx, p); err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithTimeout(e.ctx, 500*time.Millisecond)
		got, _ := e.consumer.Read(rctx, 1)
		cancel()
		if len(got) == 1 && got[0].Key == a.pod {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s's own connection never carried it again: %v messages dropped as stale", a.pod, metric(t, e.cfg, "kvindex_bridge_messages_skipped_total", "reason", "stale_connection"))
		}
	}
}
