package bridge_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/kvindex/kvindex/bridge"
	"github.com/kvindex/kvindex/bridge/bridgetest"
	"github.com/kvindex/kvindex/internal/sim/enginesim"
	"github.com/kvindex/kvindex/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testutil.LeakOptions()...) }

// rec is a record as consumed.
type rec = bridgetest.Record

const (
	pod   = "default/vllm-0"
	model = "meta-llama/Llama-3.1-8B-Instruct"
	topic = "kvindex-events"
)

// env is one test's world: a simulated engine, a kfake broker with a
// 4-partition topic, and a consumer reading it from the start.
type env struct {
	t        *testing.T
	ctx      context.Context
	engine   *enginesim.Engine
	kafka    *testutil.Kafka
	consumer *bridgetest.Consumer
	workload *enginesim.Workload
	// payloads[p][seq] is what engine process p published at seq.
	payloads [][][]byte
	// partition is where the pod's records go, once seen (-1 before).
	partition int32
	// rank is the endpoint's data-parallel rank.
	rank uint32
	// subs is how many subscriptions the engine must have received once
	// the bridge's latest connection is live (see reconnecting).
	subs uint64
}

func newEnv(t *testing.T, mod func(*enginesim.Config)) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	t.Cleanup(cancel)
	cfg := enginesim.DefaultConfig()
	if mod != nil {
		mod(&cfg)
	}
	eng, err := enginesim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	k := testutil.StartKafka(t, topic, 4)
	return &env{
		t: t, ctx: ctx, engine: eng, kafka: k,
		consumer:  bridgetest.NewConsumer(t, k.Brokers, topic),
		workload:  enginesim.NewWorkload(7, enginesim.WorkloadConfig{Capacity: 64}),
		payloads:  [][][]byte{nil},
		partition: -1,
	}
}

// config is a bridge config for the env's engine and broker, with short
// timings and no heartbeats or grace period unless a test sets them.
func (e *env) config(mod func(*bridge.Config)) bridge.Config {
	cfg := bridge.DefaultConfig()
	cfg.Endpoint = e.engine.PubEndpoint()
	cfg.ReplayEndpoint = e.engine.ReplayEndpoint()
	cfg.Pod, cfg.Model = pod, model
	cfg.Brokers, cfg.Topic = e.kafka.Brokers, topic
	cfg.HeartbeatInterval = time.Hour
	cfg.GracePeriod = 0
	cfg.ProbeInterval = 50 * time.Millisecond
	cfg.ReconnectBackoff = 10 * time.Millisecond
	cfg.MaxReconnectBackoff = 50 * time.Millisecond
	cfg.ReplayTimeout = 2 * time.Second
	cfg.Registry = prometheus.NewRegistry()
	if mod != nil {
		mod(&cfg)
	}
	return cfg
}

// start runs a bridge and, when live, waits until it is ready and the
// engine has its subscription, so what is published next goes out live.
func (e *env) start(cfg bridge.Config, live bool) *bridgetest.Running {
	e.t.Helper()
	b, err := bridge.New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	r := bridgetest.Start(e.t, b)
	e.subs++
	if live {
		e.waitLive(r)
	}
	return r
}

func (e *env) waitLive(r *bridgetest.Running) {
	e.t.Helper()
	if err := bridgetest.WaitReady(e.ctx, r.B); err != nil {
		e.t.Fatal(err)
	}
	if err := e.engine.WaitSubscriptions(e.ctx, e.subs); err != nil {
		e.t.Fatal(err)
	}
}

// reconnecting notes that the bridge will make a new connection (after a
// blip, an engine restart, a dropped connection).
func (e *env) reconnecting() { e.subs++ }

// publishRaw publishes payloads as they are (the bridge never decodes
// them) and returns their records.
func (e *env) publishRaw(payloads ...[]byte) []rec {
	e.t.Helper()
	var want []rec
	for _, p := range payloads {
		seq, err := e.engine.Publish(e.ctx, p)
		if err != nil {
			e.t.Fatal(err)
		}
		proc := len(e.payloads) - 1
		e.payloads[proc] = append(e.payloads[proc], p)
		want = append(want, bridgetest.BatchRecord(pod, model, e.rank, seq, p))
	}
	return want
}

// publish publishes n workload batches and returns their records, as the
// bridge must produce them.
func (e *env) publish(n int) []bridgetest.Record {
	e.t.Helper()
	var want []bridgetest.Record
	for range n {
		p := e.workload.Next().MustEncode()
		seq, err := e.engine.Publish(e.ctx, p)
		if err != nil {
			e.t.Fatal(err)
		}
		proc := len(e.payloads) - 1
		if uint64(len(e.payloads[proc])) != seq {
			e.t.Fatalf("engine gave seq %d, the test expected %d", seq, len(e.payloads[proc]))
		}
		e.payloads[proc] = append(e.payloads[proc], p)
		want = append(want, bridgetest.BatchRecord(pod, model, e.rank, seq, p))
	}
	return want
}

// restartEngine restarts the simulated engine (a new process).
func (e *env) restartEngine() {
	e.t.Helper()
	if err := e.engine.Restart(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	e.payloads = append(e.payloads, nil)
	e.reconnecting()
}

// batches rebuilds the records of engine process proc's seqs [from, to].
func (e *env) batches(proc int, from, to uint64) []bridgetest.Record {
	var out []bridgetest.Record
	for s := from; s <= to; s++ {
		out = append(out, bridgetest.BatchRecord(pod, model, e.rank, s, e.payloads[proc][s]))
	}
	return out
}

func control(kind string) bridgetest.Record { return bridgetest.ControlRecord(pod, model, 0, kind) }

func cat(parts ...[]bridgetest.Record) []bridgetest.Record {
	var out []bridgetest.Record
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// read reads n records and checks they all came from one partition.
func (e *env) read(n int) []bridgetest.Record {
	e.t.Helper()
	got, err := e.consumer.Read(e.ctx, n)
	if err != nil {
		e.t.Fatalf("%v; got:\n%s", err, describe(got))
	}
	return e.samePartition(got)
}

// readAll reads every record left in the topic.
func (e *env) readAll() []bridgetest.Record {
	e.t.Helper()
	got, err := e.consumer.ReadAll(e.ctx)
	if err != nil {
		e.t.Fatalf("%v; got:\n%s", err, describe(got))
	}
	return e.samePartition(got)
}

func (e *env) samePartition(rs []bridgetest.Record) []bridgetest.Record {
	e.t.Helper()
	for i := range rs {
		if e.partition < 0 {
			e.partition = rs[i].Partition
		}
		if rs[i].Partition != e.partition {
			e.t.Fatalf("record %d is on partition %d, earlier ones on %d: one pod must stay in one partition", i, rs[i].Partition, e.partition)
		}
		rs[i].Partition = 0
	}
	return rs
}

// view is a record with its value reduced to length and digest, so that
// comparing hundreds of payloads stays cheap and a diff stays readable.
type view struct {
	Key     string
	Headers map[string]string
	Value   string
}

func views(rs []rec) []view {
	out := make([]view, len(rs))
	for i, r := range rs {
		out[i] = view{Key: r.Key, Headers: r.Headers}
		if r.Value != nil {
			out[i].Value = fmt.Sprintf("%d bytes, sha256 %x", len(r.Value), sha256.Sum256(r.Value))
		}
	}
	return out
}

// check compares records: keys, headers and values byte for byte.
func check(t *testing.T, what string, want, got []rec) {
	t.Helper()
	if d := cmp.Diff(views(want), views(got), cmpopts.EquateEmpty()); d != "" {
		t.Errorf("%s differ:\nwant:\n%s\ngot:\n%s\ndiff (-want +got):\n%s", what, describe(want), describe(got), d)
	}
}

func describe(rs []bridgetest.Record) string {
	var b strings.Builder
	for i, r := range rs {
		fmt.Fprintf(&b, "  %d: key=%s headers=%v value=%d bytes\n", i, r.Key, r.Headers, len(r.Value))
	}
	return b.String()
}

// metric sums the samples of the named metric whose labels include
// labels (name=value pairs). It fails the test when no sample matches (a
// renamed metric or label value must not read as 0): the bridge starts
// every series it uses at 0.
func metric(t testing.TB, cfg bridge.Config, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := cfg.Registry.(*prometheus.Registry).Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	matched := 0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			matched++
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	if matched == 0 {
		t.Fatalf("no sample of metric %s with labels %v", name, labels)
	}
	return sum
}

// metrics checks several metrics at once: name{label=value,...} → value.
func checkMetrics(t *testing.T, cfg bridge.Config, want map[string]float64) {
	t.Helper()
	got := map[string]float64{}
	for k := range want {
		name, labels := k, []string(nil)
		if i := strings.IndexByte(k, '{'); i >= 0 {
			name = k[:i]
			for _, kv := range strings.Split(strings.TrimSuffix(k[i+1:], "}"), ",") {
				l, v, _ := strings.Cut(kv, "=")
				labels = append(labels, l, v)
			}
		}
		got[k] = metric(t, cfg, name, labels...)
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("metrics (-want +got):\n%s", d)
	}
}
