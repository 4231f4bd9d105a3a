package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kvindex/kvindex/bridge"
	"github.com/kvindex/kvindex/bridge/bridgetest"
	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/ingester"
	"github.com/kvindex/kvindex/internal/contract"
	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/scenario"
	"github.com/kvindex/kvindex/internal/sim/enginesim"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
	"github.com/kvindex/kvindex/wiring/replay"
)

// This file runs the bridge in the whole pipeline: a simulated vLLM engine
// (internal/sim/enginesim: PUB + ROUTER replay sockets, drops on demand,
// restarts with seq 0) → bridge → kfake → ingester → etcd → indexd →
// client. Every check is a Lookup (or ListEndpoints) through the client
// with a read-your-events barrier on the offsets the bridge's records
// landed at, which a Kafka consumer reads back (tail); nothing sleeps to
// wait for something it can observe.

// bridgeCtx bounds one (sub)test's waits.
func bridgeCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(45*time.Second))
	t.Cleanup(cancel)
	return ctx
}

// tailRecord is a record the tail consumed.
type tailRecord struct {
	Key     string
	Headers map[string]string
	Value   []byte
}

// tail consumes the topic from its start (no group) and keeps every
// record, so tests can wait for the records a bridge must produce and name
// their offsets in a barrier. It feeds every record, in partition order, to
// a reference model: what the ingester must make of exactly the records
// the bridges produced. Not safe for concurrent use.
type tail struct {
	cl   *kgo.Client
	recs []tailRecord
	// last is the highest offset consumed per partition: a barrier on it
	// covers every record consumed.
	last  ingesttest.Offsets
	model *refmodel.Model
}

func newTail(t *testing.T, brokers []string) *tail {
	t.Helper()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(50*time.Millisecond),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &tail{cl: cl, last: ingesttest.Offsets{}, model: refmodel.New(refmodel.Config{})}
}

// pos is the number of records consumed so far: records produced after a
// call to pos are found at or after it.
func (tl *tail) pos() int { return len(tl.recs) }

// poll consumes what one fetch returns; false when ctx ended.
func (tl *tail) poll(t *testing.T, ctx context.Context) bool {
	t.Helper()
	fs := tl.cl.PollFetches(ctx)
	if ctx.Err() != nil {
		return false
	}
	for _, e := range fs.Errors() {
		if !errors.Is(e.Err, context.Canceled) && !errors.Is(e.Err, context.DeadlineExceeded) {
			t.Fatalf("consuming %s/%d: %v", e.Topic, e.Partition, e.Err)
		}
	}
	fs.EachRecord(func(r *kgo.Record) {
		rec := tailRecord{Key: string(r.Key), Headers: map[string]string{}, Value: r.Value}
		for _, h := range r.Headers {
			rec.Headers[h.Key] = string(h.Value)
		}
		tl.recs = append(tl.recs, rec)
		tl.last.Merge(ingesttest.Offsets{r.Partition: r.Offset})
		tl.model.Apply(refmodel.Record{Key: rec.Key, Headers: rec.Headers, Value: rec.Value, Time: r.Timestamp})
	})
	return true
}

// waitFor consumes until a record at or after index from satisfies match
// and returns its index; the test fails when ctx ends first.
func (tl *tail) waitFor(t *testing.T, ctx context.Context, from int, what string, match func(tailRecord) bool) int {
	t.Helper()
	for i := from; ; i++ {
		for i >= len(tl.recs) {
			if !tl.poll(t, ctx) {
				t.Fatalf("waiting for %s in Kafka: %v", what, ctx.Err())
			}
		}
		if match(tl.recs[i]) {
			return i
		}
	}
}

// drain consumes every record up to the partitions' current end offsets.
func (tl *tail) drain(t *testing.T, ctx context.Context) {
	t.Helper()
	ends, err := kadm.NewClient(tl.cl).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("end offsets: %v", err)
	}
	behind := func() bool {
		b := false
		ends.Each(func(o kadm.ListedOffset) {
			if last, ok := tl.last[o.Partition]; o.Offset > 0 && (!ok || last < o.Offset-1) {
				b = true
			}
		})
		return b
	}
	for behind() {
		if !tl.poll(t, ctx) {
			t.Fatalf("draining the topic to %v: consumed %v: %v", ends, tl.last, ctx.Err())
		}
	}
}

// barrier names every record consumed so far.
func (tl *tail) barrier() client.LookupOption {
	return client.WithBarrier(30*time.Second, barrier(tl.last)...)
}

// endpointRecord reports whether r is a record of endpoint ep, as the
// bridge writes it (key, model header, dp_rank header).
func endpointRecord(r tailRecord, ep keyspace.Endpoint) bool {
	return r.Key == ep.Pod && r.Headers[contract.HeaderModel] == ep.Model && r.Headers[contract.HeaderDPRank] == strconv.FormatUint(uint64(ep.Rank), 10)
}

// isBatch reports whether r is ep's batch record for seq with payload.
func isBatch(r tailRecord, ep keyspace.Endpoint, seq uint64, payload []byte) bool {
	return endpointRecord(r, ep) && r.Headers[contract.HeaderKind] == "" &&
		r.Headers[contract.HeaderSeq] == strconv.FormatUint(seq, 10) && bytes.Equal(r.Value, payload)
}

// isControl reports whether r is ep's control record of kind.
func isControl(r tailRecord, ep keyspace.Endpoint, kind string) bool {
	return endpointRecord(r, ep) && r.Headers[contract.HeaderKind] == kind && len(r.Value) == 0
}

// bridgeConfig is a bridge for engine e and endpoint ep with short
// timings: no heartbeats and no grace period (so no goodbye) unless the
// caller sets them.
func bridgeConfig(e *enginesim.Engine, brokers []string, ep keyspace.Endpoint) bridge.Config {
	cfg := bridge.DefaultConfig()
	cfg.Endpoint, cfg.ReplayEndpoint = e.PubEndpoint(), e.ReplayEndpoint()
	cfg.Pod, cfg.Model, cfg.DPRank = ep.Pod, ep.Model, ep.Rank
	cfg.Brokers, cfg.Topic = brokers, topic
	cfg.HeartbeatInterval = time.Hour
	cfg.GracePeriod = 0
	// Three failed probes 250 ms apart mean the engine is gone (a closed
	// engine refuses at once: about 500 ms); a live engine on loopback
	// answers a probe in far less than 250 ms, even on a loaded machine.
	cfg.ProbeInterval = 250 * time.Millisecond
	cfg.ProbeFailures = 3
	cfg.ReconnectBackoff = 10 * time.Millisecond
	cfg.MaxReconnectBackoff = 100 * time.Millisecond
	cfg.Registry = prometheus.NewRegistry()
	return cfg
}

// startBridge runs a bridge and, when live, waits until it is ready and
// engine e has received subs subscriptions in all (this bridge's included),
// so that what e publishes next goes out live.
func startBridge(t *testing.T, ctx context.Context, cfg bridge.Config, e *enginesim.Engine, subs uint64, live bool) *bridgetest.Running {
	t.Helper()
	b, err := bridge.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := bridgetest.Start(t, b)
	if live {
		waitLive(t, ctx, r, e, subs)
	}
	return r
}

func waitLive(t *testing.T, ctx context.Context, r *bridgetest.Running, e *enginesim.Engine, subs uint64) {
	t.Helper()
	if err := bridgetest.WaitReady(ctx, r.B); err != nil {
		t.Fatal(err)
	}
	if err := e.WaitSubscriptions(ctx, subs); err != nil {
		t.Fatal(err)
	}
}

// metricValue sums the counters of metric name in reg whose label label
// (if given) has value value. It fails the test when no sample matches:
// a renamed metric or label value must not read as 0.
func metricValue(t *testing.T, reg prometheus.Gatherer, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	matched := 0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			ok := label == ""
			for _, lp := range m.GetLabel() {
				ok = ok || (lp.GetName() == label && lp.GetValue() == value)
			}
			if ok {
				matched++
				sum += m.GetCounter().GetValue()
			}
		}
	}
	if matched == 0 {
		t.Fatalf("no sample of metric %s with %s=%q", name, label, value)
	}
	return sum
}

// checkMetrics compares bridge counters: "name" or "name{label=value}" →
// value.
func checkMetrics(t *testing.T, cfg bridge.Config, want map[string]float64) {
	t.Helper()
	got := map[string]float64{}
	for k := range want {
		name, labels, _ := strings.Cut(strings.TrimSuffix(k, "}"), "{")
		label, value, _ := strings.Cut(labels, "=")
		got[k] = metricValue(t, cfg.Registry.(prometheus.Gatherer), name, label, value)
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("bridge metrics (-want +got):\n%s", d)
	}
}

// storedIn returns the hashes the BlockStored events of payloads store.
func storedIn(t *testing.T, payloads [][]byte) map[uint64]bool {
	t.Helper()
	dec := events.NewDecoder(nil)
	out := map[uint64]bool{}
	for _, p := range payloads {
		b, err := dec.Decode(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range b.Events {
			if ev.Type == events.BlockStored {
				for _, h := range ev.BlockHashes {
					out[h] = true
				}
			}
		}
	}
	return out
}

// minus returns the sorted hashes of a that are not in b.
func minus(a []uint64, b map[uint64]bool) []uint64 {
	var out []uint64
	for _, h := range a {
		if !b[h] {
			out = append(out, h)
		}
	}
	slices.Sort(out)
	return out
}

func set(hs []uint64) map[uint64]bool {
	out := make(map[uint64]bool, len(hs))
	for _, h := range hs {
		out[h] = true
	}
	return out
}

// bridgeRig is one pipeline (etcd, kfake, an ingester, an indexd replica,
// a client) shared by the subtests of a test, each on a model of its own,
// plus the tail that reads back what the bridges produced.
type bridgeRig struct {
	p    *pipeline
	c    *client.Client
	tail *tail
}

func newBridgeRig(t *testing.T) *bridgeRig { return newBridgeRigMode(t, keyspace.HashModeEngine) }

// newBridgeRigMode is newBridgeRig with its ingester in hash mode mode.
func newBridgeRigMode(t *testing.T, mode keyspace.HashMode) *bridgeRig {
	t.Helper()
	p := newPipeline(t, 4)
	p.ingester("ingester-a", func(c *ingester.Config) { c.HashMode = mode })
	rep := p.replica()
	return &bridgeRig{p: p, c: newClient(t, rep.addr), tail: newTail(t, p.kafka.Brokers)}
}

// simEndpoint is one endpoint fed by a simulated engine through bridges.
type simEndpoint struct {
	rig    *bridgeRig
	ctx    context.Context
	ep     keyspace.Endpoint
	engine *enginesim.Engine
	work   *enginesim.Workload
	// procs[p][seq] is what engine process p published at seq.
	procs [][][]byte
	// subs is how many subscriptions the engine must have received once
	// the current bridge's latest connection is live.
	subs   uint64
	bridge *bridgetest.Running
	cfg    bridge.Config
}

// workloadConfig gives evictions (BlockRemoved) within a few dozen batches.
var workloadConfig = enginesim.WorkloadConfig{Capacity: 128}

func (r *bridgeRig) endpoint(t *testing.T, ctx context.Context, seed uint64, mod func(*enginesim.Config)) *simEndpoint {
	t.Helper()
	cfg := enginesim.DefaultConfig()
	if mod != nil {
		mod(&cfg)
	}
	eng, err := enginesim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	return &simEndpoint{
		rig: r, ctx: ctx, engine: eng,
		ep:    keyspace.Endpoint{Model: "bridge-e2e/" + t.Name(), Pod: "default/vllm-0"},
		work:  enginesim.NewWorkload(seed, workloadConfig),
		procs: [][][]byte{nil},
	}
}

// startBridge starts a new bridge for the endpoint with grace as its
// GracePeriod.
func (e *simEndpoint) startBridge(t *testing.T, grace time.Duration, live bool) {
	t.Helper()
	e.cfg = bridgeConfig(e.engine, e.rig.p.kafka.Brokers, e.ep)
	e.cfg.GracePeriod = grace
	e.subs++
	e.bridge = startBridge(t, e.ctx, e.cfg, e.engine, e.subs, live)
}

// publish publishes n workload batches and returns the last seq.
func (e *simEndpoint) publish(t *testing.T, n int) uint64 {
	t.Helper()
	var seq uint64
	for range n {
		p := e.work.Next().MustEncode()
		var err error
		if seq, err = e.engine.Publish(e.ctx, p); err != nil {
			t.Fatal(err)
		}
		proc := len(e.procs) - 1
		if uint64(len(e.procs[proc])) != seq {
			t.Fatalf("engine gave seq %d, the test expected %d", seq, len(e.procs[proc]))
		}
		e.procs[proc] = append(e.procs[proc], p)
	}
	return seq
}

// landed waits until the bridge's record of the current engine process's
// batch seq is in Kafka, looking at records from tail index from on.
func (e *simEndpoint) landed(t *testing.T, from int, seq uint64) {
	t.Helper()
	proc := len(e.procs) - 1
	payload := e.procs[proc][seq]
	e.rig.tail.waitFor(t, e.ctx, from, fmt.Sprintf("%v batch seq %d", e.ep, seq), func(r tailRecord) bool {
		return isBatch(r, e.ep, seq, payload)
	})
}

// stream describes every record of the endpoint consumed so far, in order:
// "p<process> seq <n>" for a batch (the engine process whose payload it
// carries), the kind for a control record.
func (e *simEndpoint) stream() []string {
	var out []string
	for _, r := range e.rig.tail.recs {
		if !endpointRecord(r, e.ep) {
			continue
		}
		if k := r.Headers[contract.HeaderKind]; k != "" {
			out = append(out, k)
			continue
		}
		seq, _ := strconv.ParseUint(r.Headers[contract.HeaderSeq], 10, 64)
		desc := fmt.Sprintf("seq %d with bytes no engine process published", seq)
		for p := len(e.procs) - 1; p >= 0; p-- {
			if seq < uint64(len(e.procs[p])) && bytes.Equal(e.procs[p][seq], r.Value) {
				desc = fmt.Sprintf("p%d seq %d", p, seq)
				break
			}
		}
		out = append(out, desc)
	}
	return out
}

// seqs describes batches [from, to] of engine process proc as stream does.
func seqs(proc int, from, to uint64) []string {
	var out []string
	for s := from; s <= to; s++ {
		out = append(out, fmt.Sprintf("p%d seq %d", proc, s))
	}
	return out
}

func (e *simEndpoint) checkStream(t *testing.T, want ...[]string) {
	t.Helper()
	if d := cmp.Diff(slices.Concat(want...), e.stream()); d != "" {
		t.Errorf("records of %v in Kafka (-want +got):\n%s", e.ep, d)
	}
}

// checkIndex drains the topic and checks, through the client, that the
// index answers exactly as the reference model fed every record consumed
// (checkAgainstModel: Lookups over every endpoint's blocks, ListEndpoints'
// per-tier counts). It returns the reference model's gpu blocks of the
// endpoint, sorted.
func (e *simEndpoint) checkIndex(t *testing.T, label string) []uint64 {
	t.Helper()
	e.rig.tail.drain(t, e.ctx)
	checkAgainstModel(t, e.rig.c, e.rig.tail.model, e.rig.tail.last, label)
	var out []uint64
	for _, b := range e.rig.tail.model.Blocks() {
		if b.Endpoint == e.ep {
			if b.Tier != tier.GPU {
				t.Fatalf("%s: the reference model holds %v on tier %v; the workload stores on gpu only", label, b, b.Tier)
			}
			out = append(out, b.Hash)
		}
	}
	return out
}

// checkEngine checks that the index holds exactly what the engine's cache
// holds (its workload's resident blocks): the index answers as the
// reference model, the reference model holds the engine's blocks, and a
// router's Lookup of every resident block matches all of them on gpu.
func (e *simEndpoint) checkEngine(t *testing.T, label string) {
	t.Helper()
	resident := e.work.Resident()
	if len(resident) == 0 {
		t.Fatalf("%s: the engine holds no block: nothing to check", label)
	}
	if d := cmp.Diff(resident, e.checkIndex(t, label)); d != "" {
		t.Fatalf("%s: the index (as the reference model) differs from the engine's cache (-engine +index):\n%s", label, d)
	}
	got, err := e.rig.c.Lookup(e.ctx, e.ep.Model, resident, e.rig.tail.barrier())
	if err != nil {
		t.Fatalf("%s: lookup: %v", label, err)
	}
	tiers := slices.Repeat([]string{"gpu"}, len(resident))
	want := []scenario.Match{{Pod: e.ep.Pod, DPRank: e.ep.Rank, Blocks: len(resident), Tiers: tiers}}
	if diffs := scenario.Compare(want, replay.Matches(got)); diffs != nil {
		t.Fatalf("%s: Lookup of the engine's %d resident blocks: %v", label, len(resident), diffs)
	}
}

// checkAbsent looks each hash up alone: none may match the endpoint.
func (e *simEndpoint) checkAbsent(t *testing.T, label string, hashes []uint64) {
	t.Helper()
	for _, h := range hashes {
		got, err := e.rig.c.Lookup(e.ctx, e.ep.Model, []uint64{h}, e.rig.tail.barrier())
		if err != nil {
			t.Fatalf("%s: lookup: %v", label, err)
		}
		for _, m := range got.Matches {
			if m.Endpoint.Pod == e.ep.Pod && m.Endpoint.DPRank == e.ep.Rank {
				t.Fatalf("%s: block %016x still matches %v", label, h, m.Endpoint)
			}
		}
	}
}

// checkResynced checks the index after batches were lost and a resync
// dropped the endpoint: it answers as the reference model of the records
// produced, holds no block the engine does not hold (no ghost), and misses
// some the engine still holds (a missed hit is the price of the loss).
func (e *simEndpoint) checkResynced(t *testing.T, label string) {
	t.Helper()
	indexed := e.checkIndex(t, label)
	resident := e.work.Resident()
	if extra := minus(indexed, set(resident)); len(extra) > 0 {
		t.Fatalf("%s: ghost blocks: the index holds %016x, which the engine does not", label, extra)
	}
	missed := minus(resident, set(indexed))
	if len(missed) == 0 {
		t.Fatalf("%s: the index holds every block of the engine although its blocks were dropped", label)
	}
	e.checkAbsent(t, label, missed)
}

// TestBridgeThroughPipeline runs the bridge's life cycle end to end, each
// case on an endpoint (and model) of its own in one shared pipeline, and
// checks after each step that indexd answers exactly as the engine's
// cache (or, after lost batches, as the reference model of the records
// the bridge produced, never holding a block the engine does not hold).
func TestBridgeThroughPipeline(t *testing.T) {
	t.Parallel()
	seed := genSeed(t)
	rig := newBridgeRig(t)

	t.Run("gapless_delivery", func(t *testing.T) {
		e := rig.endpoint(t, bridgeCtx(t), seed, nil)
		e.startBridge(t, 0, true)
		from := rig.tail.pos()
		e.landed(t, from, e.publish(t, 100))
		e.checkEngine(t, "after 100 live batches")
		e.checkStream(t, seqs(0, 0, 99))
		checkMetrics(t, e.cfg, map[string]float64{
			"kvindex_bridge_gaps_total":             0,
			"kvindex_bridge_resyncs_total":          0,
			"kvindex_bridge_batches_replayed_total": 0,
		})
	})

	t.Run("bridge_started_after_the_engine_published", func(t *testing.T) {
		e := rig.endpoint(t, bridgeCtx(t), seed+1, nil)
		e.publish(t, 60) // nobody subscribed: the PUB socket sends nothing
		from := rig.tail.pos()
		e.startBridge(t, 0, true)
		e.landed(t, from, 59)
		e.checkEngine(t, "caught up by replay")
		e.landed(t, from, e.publish(t, 20))
		e.checkEngine(t, "then live")
		e.checkStream(t, seqs(0, 0, 79))
		checkMetrics(t, e.cfg, map[string]float64{
			"kvindex_bridge_batches_replayed_total": 60,
			"kvindex_bridge_resyncs_total":          0,
		})
	})

	t.Run("forced_gap_healed_by_replay", func(t *testing.T) {
		e := rig.endpoint(t, bridgeCtx(t), seed+2, nil)
		e.startBridge(t, 0, true)
		from := rig.tail.pos()
		e.landed(t, from, e.publish(t, 20))
		e.checkEngine(t, "before the gap")
		e.engine.DropNext(15) // seqs 20-34 never reach the bridge live
		e.landed(t, from, e.publish(t, 25))
		e.checkEngine(t, "after the gap")
		// Blocks stored before the gap and never again: a resync (or an
		// ingester that saw the gap) would have dropped them.
		before := minus(e.work.Resident(), storedIn(t, e.procs[0][20:]))
		if len(before) == 0 {
			t.Fatal("no resident block comes from before the gap only: the check above proves nothing about the gap")
		}
		e.checkStream(t, seqs(0, 0, 44))
		checkMetrics(t, e.cfg, map[string]float64{
			"kvindex_bridge_gaps_total":    1,
			"kvindex_bridge_resyncs_total": 0,
		})
	})

	// A bridge restart must not look like an engine restart: both start
	// from the same history (40 batches, a replay buffer of 25), and
	// differ in which side restarts.
	t.Run("bridge_restart_keeps_the_endpoint_blocks", func(t *testing.T) {
		e := rig.endpoint(t, bridgeCtx(t), seed+3, func(c *enginesim.Config) { c.BufferSize = 25 })
		e.startBridge(t, time.Second, true)
		from := rig.tail.pos()
		e.landed(t, from, e.publish(t, 40))
		e.checkEngine(t, "first bridge")
		first := e.cfg
		if err := e.bridge.Stop(); err != nil { // the engine is still there: no goodbye
			t.Fatal(err)
		}
		checkMetrics(t, first, map[string]float64{"kvindex_bridge_shutdowns_total{outcome=engine_still_there}": 1})
		e.publish(t, 10) // seqs 40-49 while no bridge runs
		from = rig.tail.pos()
		e.startBridge(t, 0, true)
		e.landed(t, from, 49)
		e.landed(t, from, e.publish(t, 10))
		// The engine buffers seqs 25-49 when the second bridge starts:
		// blocks stored by seqs 0-24 only reach the index through the
		// first bridge, so they stay only if nothing dropped the endpoint.
		early := minus(e.work.Resident(), storedIn(t, e.procs[0][25:]))
		if len(early) == 0 {
			t.Fatal("no resident block was stored by seqs 0-24 only: the check below proves nothing about the restart")
		}
		e.checkEngine(t, "second bridge")
		// The second bridge replays the buffer (25-39 again: duplicates
		// the ingester skips), then goes on; no goodbye, resync or gap.
		e.checkStream(t, seqs(0, 0, 39), seqs(0, 25, 59))
		checkMetrics(t, e.cfg, map[string]float64{
			"kvindex_bridge_batches_replayed_total": 25,
			"kvindex_bridge_resyncs_total":          0,
			"kvindex_bridge_engine_restarts_total":  0,
		})
	})

	t.Run("engine_restart_drops_the_old_blocks", func(t *testing.T) {
		e := rig.endpoint(t, bridgeCtx(t), seed+4, func(c *enginesim.Config) { c.BufferSize = 25 })
		e.startBridge(t, 0, true)
		from := rig.tail.pos()
		e.landed(t, from, e.publish(t, 40))
		e.checkEngine(t, "first engine process")
		old := e.work.Resident()

		// A new process: seq back to 0, an empty cache, newer batch ts.
		if err := e.engine.Restart(e.ctx); err != nil {
			t.Fatal(err)
		}
		e.procs = append(e.procs, nil)
		cfg := workloadConfig
		cfg.StartTS = enginesim.DefaultWorkloadConfig().StartTS + 3600
		e.work = enginesim.NewWorkload(seed+5, cfg)
		e.subs++
		from = rig.tail.pos()
		e.publish(t, 5) // while the bridge reconnects: the replay delivers them
		waitLive(t, e.ctx, e.bridge, e.engine, e.subs)
		e.landed(t, from, e.publish(t, 15))
		gone := minus(old, set(e.work.Resident()))
		if len(gone) == 0 {
			t.Fatal("the new process holds every block of the old one: the check below proves nothing about the restart")
		}
		e.checkEngine(t, "new engine process")
		e.checkAbsent(t, "the old process's blocks", gone)
		e.checkStream(t, seqs(0, 0, 39), seqs(1, 0, 19))
		checkMetrics(t, e.cfg, map[string]float64{
			"kvindex_bridge_engine_restarts_total": 1,
			"kvindex_bridge_resyncs_total":         0,
		})
	})

	t.Run("unrecoverable_gap_gives_a_resync", func(t *testing.T) {
		e := rig.endpoint(t, bridgeCtx(t), seed+6, func(c *enginesim.Config) { c.BufferSize = 8 })
		e.startBridge(t, 0, true)
		from := rig.tail.pos()
		e.landed(t, from, e.publish(t, 30))
		e.checkEngine(t, "before the gap")
		// Seqs 30-49 never reach the bridge live; 50 does and shows the
		// gap, when the engine buffers only 43-50.
		e.engine.DropNext(20)
		e.landed(t, from, e.publish(t, 21))
		e.checkStream(t, seqs(0, 0, 29), []string{contract.KindResync}, seqs(0, 43, 50))
		checkMetrics(t, e.cfg, map[string]float64{
			"kvindex_bridge_gaps_total":                           1,
			"kvindex_bridge_resyncs_total{reason=replay_overrun}": 1,
		})
		// The seq jump (29 → 43) alone makes the ingester drop the
		// endpoint too (semantics 7); the next case is one only the resync
		// catches.
		e.checkResynced(t, "after the resync")
		e.landed(t, from, e.publish(t, 5))
		e.checkResynced(t, "live again after the resync")
	})

	t.Run("reconnect_without_replay_gives_a_resync", func(t *testing.T) {
		e := rig.endpoint(t, bridgeCtx(t), seed+8, func(c *enginesim.Config) { c.ReplayAddr = "" })
		e.startBridge(t, 0, true)
		from := rig.tail.pos()
		e.landed(t, from, e.publish(t, 20))
		e.checkEngine(t, "before the blip")
		// A network blip: the bridge cannot know what it missed (here:
		// nothing, so the seq chain stays unbroken and only the resync
		// can make the ingester drop the endpoint's blocks).
		e.engine.DisconnectAll()
		e.subs++
		waitLive(t, e.ctx, e.bridge, e.engine, e.subs)
		rig.tail.waitFor(t, e.ctx, from, "resync", func(r tailRecord) bool { return isControl(r, e.ep, contract.KindResync) })
		if got := e.checkIndex(t, "after the resync"); len(got) > 0 {
			t.Fatalf("the reference model holds %d blocks of %v after its resync", len(got), e.ep)
		}
		e.checkAbsent(t, "after the resync", e.work.Resident())
		e.landed(t, from, e.publish(t, 10))
		e.checkResynced(t, "live again after the resync")
		e.checkStream(t, seqs(0, 0, 19), []string{contract.KindResync}, seqs(0, 20, 29))
		checkMetrics(t, e.cfg, map[string]float64{
			"kvindex_bridge_resyncs_total{reason=reconnect_no_replay}": 1,
			"kvindex_bridge_resyncs_total":                             1,
		})
	})

	t.Run("goodbye_drops_the_endpoint", func(t *testing.T) {
		e := rig.endpoint(t, bridgeCtx(t), seed+7, nil)
		e.startBridge(t, 5*time.Second, true)
		from := rig.tail.pos()
		e.landed(t, from, e.publish(t, 20))
		e.checkEngine(t, "before the engine goes")
		resident := e.work.Resident()
		if err := e.engine.Close(); err != nil {
			t.Fatal(err)
		}
		if err := e.bridge.Stop(); err != nil {
			t.Fatal(err)
		}
		rig.tail.waitFor(t, e.ctx, from, "goodbye", func(r tailRecord) bool { return isControl(r, e.ep, contract.KindGoodbye) })
		if got := e.checkIndex(t, "after the goodbye"); len(got) > 0 {
			t.Fatalf("the reference model still holds %d blocks of %v after its goodbye", len(got), e.ep)
		}
		e.checkAbsent(t, "after the goodbye", resident)
		list, err := rig.c.ListEndpoints(e.ctx, e.ep.Model)
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Endpoints) > 0 {
			t.Fatalf("endpoints of %s after the goodbye: %+v", e.ep.Model, list.Endpoints)
		}
		e.checkStream(t, seqs(0, 0, 19), []string{contract.KindGoodbye})
		checkMetrics(t, e.cfg, map[string]float64{"kvindex_bridge_shutdowns_total{outcome=engine_gone}": 1})
	})
}

// fixtureEndpoint is one (model, pod, rank) of a scenario fixture: its own
// simulated engine and bridge.
type fixtureEndpoint struct {
	// ep is the endpoint as the bridge names it (the model prefixed).
	ep     keyspace.Endpoint
	engine *enginesim.Engine
	// replay says whether the engine has a replay socket.
	replay bool
	cfg    bridge.Config
	run    *bridgetest.Running
	// payloads[seq] is what the current engine process published.
	payloads [][]byte
	subs     uint64
	// gone is set once the endpoint said goodbye (engine and bridge
	// stopped).
	gone bool
}

// fixtureStep is a scenario publish step as the bridge path sees it.
type fixtureStep struct {
	// id is the endpoint the record belongs to, with the fixture's model.
	id keyspace.Endpoint
	// kind is the control kind, "" for a batch.
	kind string
	// seq is the batch's seq header, when hasSeq.
	seq    uint64
	hasSeq bool
	// leftOut says why the record has no counterpart on the bridge path;
	// "" when it has one.
	leftOut string
}

// classify maps a fixture's publish step to the bridge path. A header the
// mapping does not know fails the test, so a new fixture that needs a new
// mapping is noticed rather than silently passed.
func classify(t *testing.T, dec *events.Decoder, st scenario.Step) fixtureStep {
	t.Helper()
	p := st.Publish
	for h := range p.Headers {
		switch h {
		case contract.HeaderModel, contract.HeaderSeq, contract.HeaderKind, contract.HeaderDPRank:
		default:
			t.Fatalf("line %d: header %q has no mapping to the bridge path", st.Line, h)
		}
	}
	id := keyspace.Endpoint{Model: p.Headers[contract.HeaderModel], Pod: p.Key}
	if kind, ok := p.Headers[contract.HeaderKind]; ok {
		if _, ok := p.Headers[contract.HeaderSeq]; ok {
			t.Fatalf("line %d: a control record with a seq header has no mapping to the bridge path", st.Line)
		}
		rank, err := strconv.ParseUint(p.Headers[contract.HeaderDPRank], 10, 32)
		if p.Headers[contract.HeaderDPRank] == "" {
			rank, err = 0, nil // no header: rank 0
		}
		if err != nil {
			t.Fatalf("line %d: dp_rank: %v", st.Line, err)
		}
		id.Rank = uint32(rank)
		switch kind {
		case contract.KindHeartbeat, contract.KindGoodbye, contract.KindResync:
		default:
			t.Fatalf("line %d: kind %q has no mapping to the bridge path", st.Line, kind)
		}
		return fixtureStep{id: id, kind: kind}
	}
	if len(p.Value) == 0 {
		return fixtureStep{leftOut: "a batch record without a value is not something an engine publishes"}
	}
	b, err := dec.Decode(p.Value)
	if err != nil {
		return fixtureStep{leftOut: "bytes that do not decode as a batch are not something an engine publishes (the direct path skips them as malformed)"}
	}
	id.Rank = b.Rank
	if h, ok := p.Headers[contract.HeaderDPRank]; ok && h != strconv.FormatUint(uint64(b.Rank), 10) {
		t.Fatalf("line %d: a dp_rank header that disagrees with the batch has no mapping to the bridge path", st.Line)
	}
	fs := fixtureStep{id: id}
	if s, ok := p.Headers[contract.HeaderSeq]; ok {
		if fs.seq, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("line %d: seq: %v", st.Line, err)
		}
		fs.hasSeq = true
	}
	return fs
}

// prefixed returns a copy of s with every model under prefix and, for
// lookup i, expect[i] as its expectation.
func prefixed(s *scenario.Scenario, prefix string, expect [][]scenario.Match) *scenario.Scenario {
	out := *s
	out.Steps = make([]scenario.Step, len(s.Steps))
	n := 0
	for i, st := range s.Steps {
		switch st.Kind {
		case scenario.KindPublish:
			p := *st.Publish
			p.Headers = maps.Clone(p.Headers)
			p.Headers[contract.HeaderModel] = prefix + p.Headers[contract.HeaderModel]
			st.Publish = &p
		case scenario.KindLookup:
			l := *st.Lookup
			l.Model = prefix + l.Model
			l.Expect = expect[n]
			n++
			st.Lookup = &l
		}
		out.Steps[i] = st
	}
	return &out
}

// TestFixturesThroughBridge replays every scenario fixture through
// simulated engines and bridges, and checks every lookup step's answer
// against the fixture's expectation and against the answer of the same
// fixture produced straight into Kafka (wiring/replay), in the same
// pipeline. Each fixture runs under model names of its own ("bridge/<name>/"
// and "direct/<name>/" before the fixture's model), so fixtures and the two
// paths never share entries: each starts from an empty index.
//
// How each fixture record is mapped to the bridge path:
//   - A batch (a value that decodes): published by the engine of its
//     (model, pod, rank) (one engine and one bridge per endpoint, seq from
//     0). A seq header is honoured as an engine would: the next seq is
//     published; an earlier seq with the bytes already published at it (a
//     replayed duplicate) is a bridge restart (the new bridge replays the
//     engine's buffer, the ingester skips what it applied); an earlier seq
//     with other bytes (a newer ts) is an engine restart (Restart, then the
//     new process publishes it at seq 0).
//   - kind=heartbeat: the bridge produces heartbeats itself (every 200 ms
//     here); the step waits for the endpoint's next one.
//   - kind=goodbye: the bridge produces it at shutdown when the engine is
//     gone: the engine is closed, then the bridge stopped.
//   - kind=resync: the bridge produces it when it cannot know what it
//     missed: an endpoint that gets a resync has an engine without a
//     replay socket, and the step drops the engine's connections
//     (DisconnectAll), so the reconnecting bridge produces the resync.
//   - Left out: values that do not decode (garbage, truncated batches) and
//     batch records without a value, which no engine publishes. Left out
//     on the bridge path, each would break its endpoint's seq chain (a
//     skipped record looks like a gap), so a fixture mixing them with seq
//     headers would need another mapping; none does.
func TestFixturesThroughBridge(t *testing.T) {
	t.Parallel()
	scenarios, err := scenario.Glob(testutil.ScenarioGlob(t))
	if err != nil {
		t.Fatal(err)
	}
	rigs := map[string]*bridgeRig{} // one per hash mode: each file runs in its own
	for _, s := range scenarios {
		rig := rigs[s.HashMode]
		if rig == nil {
			rig = newBridgeRigMode(t, keyspace.HashMode(s.HashMode))
			rigs[s.HashMode] = rig
		}
		t.Run(s.Name, func(t *testing.T) {
			ctx := bridgeCtx(t)
			answers := runFixtureThroughBridges(t, ctx, rig, s, "bridge/"+s.Name+"/")
			// The same fixture straight into Kafka, expecting exactly the
			// bridge path's answers (tiers included). Run even when the
			// bridge path differed from the fixture: it tells which side
			// is wrong.
			res, err := replay.Run(ctx, replay.Target{Producer: rig.p.prod, Topic: topic, Index: rig.c}, prefixed(s, "direct/"+s.Name+"/", answers))
			if err != nil {
				t.Fatalf("direct replay: %v", err)
			}
			if res.Lookups != len(answers) {
				t.Fatalf("direct replay ran %d lookups, the bridge path %d", res.Lookups, len(answers))
			}
			for _, m := range res.Mismatches {
				t.Errorf("line %d: straight into Kafka the answer differs from the bridge path's: %v\n bridge: %+v\n direct: %+v", m.Line, m.Diffs, m.Expected, m.Actual)
			}
		})
	}
}

// runFixtureThroughBridges runs scenario s through engines and bridges
// with every model under prefix, checks each lookup against the fixture,
// and returns each lookup's answer.
func runFixtureThroughBridges(t *testing.T, ctx context.Context, rig *bridgeRig, s *scenario.Scenario, prefix string) [][]scenario.Match {
	t.Helper()
	dec := events.NewDecoder(nil)
	steps := make(map[int]fixtureStep)
	endpoints := map[keyspace.Endpoint]*fixtureEndpoint{}
	for i, st := range s.Steps {
		if st.Kind != scenario.KindPublish {
			continue
		}
		fs := classify(t, dec, st)
		steps[i] = fs
		if fs.leftOut != "" {
			continue
		}
		fe := endpoints[fs.id]
		if fe == nil {
			fe = &fixtureEndpoint{ep: fs.id, replay: true}
			fe.ep.Model = prefix + fs.id.Model
			endpoints[fs.id] = fe
		}
		if fs.kind == contract.KindResync {
			fe.replay = false
		}
	}
	// Start every engine and its bridge, live, before the first step.
	for _, id := range slices.SortedFunc(maps.Keys(endpoints), func(a, b keyspace.Endpoint) int {
		return strings.Compare(fmt.Sprint(a), fmt.Sprint(b))
	}) {
		fe := endpoints[id]
		ecfg := enginesim.DefaultConfig()
		if !fe.replay {
			ecfg.ReplayAddr = ""
		}
		eng, err := enginesim.New(ecfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { eng.Close() })
		fe.engine = eng
		fe.cfg = bridgeConfig(eng, rig.p.kafka.Brokers, fe.ep)
		fe.cfg.HeartbeatInterval = 200 * time.Millisecond
		fe.cfg.GracePeriod = 1500 * time.Millisecond
		fe.subs = 1
		fe.run = startBridge(t, ctx, fe.cfg, eng, fe.subs, true)
	}
	defer stopFixtureBridges(t, endpoints)

	var answers [][]scenario.Match
	for i, st := range s.Steps {
		if st.Kind == scenario.KindLookup {
			l := st.Lookup
			var got *client.LookupResult
			var err error
			if l.Tokens != nil {
				got, err = rig.c.LookupTokens(ctx, prefix+l.Model, l.Prompt(), rig.tail.barrier())
			} else {
				got, err = rig.c.Lookup(ctx, prefix+l.Model, l.Hashes, rig.tail.barrier())
			}
			if err != nil {
				t.Fatalf("line %d: lookup: %v", st.Line, err)
			}
			actual := replay.Matches(got)
			if diffs := l.Check(actual); diffs != nil {
				t.Errorf("line %d (%s): through the bridge the answer differs from the fixture's: %v", st.Line, l.Describe, diffs)
			}
			answers = append(answers, actual)
			continue
		}
		fs := steps[i]
		if fs.leftOut != "" {
			t.Logf("line %d (%s) left out: %s", st.Line, st.Publish.Describe, fs.leftOut)
			continue
		}
		fe := endpoints[fs.id]
		if fe.gone {
			t.Fatalf("line %d: a record for %v after its goodbye has no mapping to the bridge path", st.Line, fs.id)
		}
		from := rig.tail.pos()
		switch fs.kind {
		case contract.KindHeartbeat:
			rig.tail.waitFor(t, ctx, from, "heartbeat", func(r tailRecord) bool { return isControl(r, fe.ep, contract.KindHeartbeat) })
		case contract.KindGoodbye:
			if err := fe.engine.Close(); err != nil {
				t.Fatal(err)
			}
			if err := fe.run.Stop(); err != nil {
				t.Fatal(err)
			}
			fe.gone = true
			rig.tail.waitFor(t, ctx, from, "goodbye", func(r tailRecord) bool { return isControl(r, fe.ep, contract.KindGoodbye) })
		case contract.KindResync:
			fe.engine.DisconnectAll()
			fe.subs++
			rig.tail.waitFor(t, ctx, from, "resync", func(r tailRecord) bool { return isControl(r, fe.ep, contract.KindResync) })
			// Without a replay socket, only a live subscription delivers
			// what the engine publishes next.
			waitLive(t, ctx, fe.run, fe.engine, fe.subs)
		default:
			publishFixtureBatch(t, ctx, rig, fe, fs, st)
		}
	}
	return answers
}

// publishFixtureBatch maps one fixture batch to its engine and bridge (see
// TestFixturesThroughBridge) and waits until its record is in Kafka.
func publishFixtureBatch(t *testing.T, ctx context.Context, rig *bridgeRig, fe *fixtureEndpoint, fs fixtureStep, st scenario.Step) {
	t.Helper()
	payload := st.Publish.Value
	next := fe.engine.NextSeq()
	from := rig.tail.pos()
	switch {
	case !fs.hasSeq || fs.seq == next:
	case fs.seq < next && bytes.Equal(payload, fe.payloads[fs.seq]):
		// A replayed duplicate: what a bridge restart produces. The old
		// bridge stops with the engine still there (no goodbye); the new
		// one replays the engine's buffer from its start.
		old := fe.cfg
		if err := fe.run.Stop(); err != nil {
			t.Fatal(err)
		}
		checkMetrics(t, old, map[string]float64{"kvindex_bridge_shutdowns_total{outcome=engine_still_there}": 1})
		fe.cfg = bridgeConfig(fe.engine, rig.p.kafka.Brokers, fe.ep)
		fe.cfg.HeartbeatInterval, fe.cfg.GracePeriod = old.HeartbeatInterval, old.GracePeriod
		fe.subs++
		fe.run = startBridge(t, ctx, fe.cfg, fe.engine, fe.subs, true)
		last := next - 1
		at := rig.tail.waitFor(t, ctx, from, fmt.Sprintf("replayed seq %d after the bridge restart", last), func(r tailRecord) bool {
			return isBatch(r, fe.ep, last, fe.payloads[last])
		})
		for _, r := range rig.tail.recs[from:at] {
			if isControl(r, fe.ep, contract.KindGoodbye) || isControl(r, fe.ep, contract.KindResync) {
				t.Fatalf("line %d: the bridge restart produced a %s", st.Line, r.Headers[contract.HeaderKind])
			}
		}
		return
	case fs.seq == 0:
		// seq 0 again with other bytes: a new engine process.
		if err := fe.engine.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		fe.payloads = nil
		fe.subs++
	default:
		t.Fatalf("line %d: seq %d after the engine's %d has no mapping to the bridge path", st.Line, fs.seq, next)
	}
	seq, err := fe.engine.Publish(ctx, payload)
	if err != nil {
		t.Fatal(err)
	}
	if fs.hasSeq && seq != fs.seq {
		t.Fatalf("line %d: the engine published at seq %d, the fixture has %d", st.Line, seq, fs.seq)
	}
	fe.payloads = append(fe.payloads, payload)
	rig.tail.waitFor(t, ctx, from, fmt.Sprintf("line %d, seq %d", st.Line, seq), func(r tailRecord) bool {
		return isBatch(r, fe.ep, seq, payload)
	})
}

// stopFixtureBridges closes every engine still running, then stops every
// bridge at once (each says goodbye within two probes instead of waiting
// out its grace period).
func stopFixtureBridges(t *testing.T, endpoints map[keyspace.Endpoint]*fixtureEndpoint) {
	t.Helper()
	errs := make(chan error, len(endpoints))
	n := 0
	for _, fe := range endpoints {
		if fe.gone {
			continue
		}
		fe.engine.Close()
		n++
		go func() { errs <- fe.run.Stop() }()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("bridge: %v", err)
		}
	}
}
