package e2e

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/indexd"
	"github.com/kvindex/kvindex/ingester"
	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/scenario"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
	"github.com/kvindex/kvindex/wiring/replay"
)

const topic = "kvindex-events"

// pipeline is a deployment in miniature, built from the public packages:
// embedded etcd, a kfake broker, ingesters and indexd replicas, each
// started and stopped by the test.
type pipeline struct {
	t     *testing.T
	etcd  *testutil.Etcd
	kafka *testutil.Kafka
	prod  *kgo.Client
	ks    keyspace.Keyspace
}

func newPipeline(t *testing.T, partitions int32) *pipeline {
	t.Helper()
	e := testutil.StartEtcd(t)
	k := testutil.StartKafka(t, topic, partitions, kfake.GroupMinSessionTimeout(time.Second))
	return &pipeline{t: t, etcd: e, kafka: k, prod: ingesttest.NewProducer(t, k.Brokers), ks: keyspace.Default()}
}

// running is a component started by the test: stop cancels it and waits.
type running struct {
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func (r *running) stop(t *testing.T) {
	t.Helper()
	r.once.Do(func() {
		r.cancel()
		if err := <-r.done; err != nil {
			t.Errorf("component stopped with: %v", err)
		}
	})
}

func start(t *testing.T, run func(context.Context) error) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// ingester starts an ingester in the group; tune adjusts its config.
func (p *pipeline) ingester(id string, tune func(*ingester.Config)) *running {
	p.t.Helper()
	cfg := ingester.DefaultConfig()
	cfg.Etcd = p.etcd.Client
	cfg.Brokers = p.kafka.Brokers
	cfg.Topic = topic
	cfg.ID = id
	cfg.SessionTimeout, cfg.RebalanceTimeout, cfg.LeaseTTL = 2*time.Second, 3*time.Second, 30*time.Second
	// The random streams below carry no heartbeats on purpose: liveness
	// has tests of its own (ingester package), so keep it out of the way.
	cfg.LivenessWindow = time.Hour
	// The random streams and the engine-hash fixtures name blocks by
	// engine hash; token-mode runs say so in tune.
	cfg.HashMode = keyspace.HashModeEngine
	if tune != nil {
		tune(&cfg)
	}
	in, err := ingester.New(cfg)
	if err != nil {
		p.t.Fatal(err)
	}
	return start(p.t, in.Run)
}

// replica is a running indexd replica.
type replica struct {
	*running
	srv  *indexd.Server
	addr string
	reg  *prometheus.Registry
}

// waitReady waits until the replica has applied its first list of etcd
// (indexd.Server.Ready), so a Lookup is answered, not refused
// UNAVAILABLE "index not loaded yet" (a client tries DefaultMaxAttempts
// times, which a busy machine's first list can outlast).
func (r *replica) waitReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(testutil.Timeout(time.Minute))
	for r.srv.Ready() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("replica %s not ready after a minute: %v", r.addr, r.srv.Ready())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// replica starts an indexd replica on a free port with its own etcd client
// to endpoints (default: etcd itself) and its own metrics registry, and
// returns once it has applied its first list (waitReady).
func (p *pipeline) replica(endpoints ...string) *replica {
	p.t.Helper()
	if len(endpoints) == 0 {
		endpoints = p.etcd.Endpoints
	}
	cli, err := testutil.NewEtcdClient(endpoints)
	if err != nil {
		p.t.Fatal(err)
	}
	cfg := indexd.DefaultConfig()
	cfg.Etcd = cli
	cfg.ListenAddr = "127.0.0.1:0"
	cfg.BackoffMax = 500 * time.Millisecond
	reg := prometheus.NewRegistry()
	cfg.Registry = reg
	srv, err := indexd.New(cfg)
	if err != nil {
		cli.Close()
		p.t.Fatal(err)
	}
	r := start(p.t, func(ctx context.Context) error {
		defer cli.Close()
		return srv.Run(ctx)
	})
	rep := &replica{running: r, srv: srv, addr: srv.Addr().String(), reg: reg}
	rep.waitReady(p.t)
	return rep
}

// lists is how many complete lists of etcd the replica has applied.
func (r *replica) lists(t *testing.T) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == "kvindex_indexd_lists_total" {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

func newClient(t *testing.T, target string) *client.Client {
	t.Helper()
	c, err := client.New(target, client.WithTimeout(testutil.Timeout(30*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// produce sends recs with current timestamps and returns the last offset
// per partition.
func (p *pipeline) produce(recs []refmodel.Record) ingesttest.Offsets {
	p.t.Helper()
	now := time.Now()
	out := make([]refmodel.Record, len(recs))
	for i, r := range recs {
		r.Time = now
		out[i] = r
	}
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(time.Minute))
	defer cancel()
	return ingesttest.Produce(p.t, ctx, p.prod, topic, out)
}

func barrier(offs ingesttest.Offsets) []client.PartitionOffset {
	out := make([]client.PartitionOffset, 0, len(offs))
	for part, off := range offs {
		out = append(out, client.PartitionOffset{Topic: topic, Partition: part, Offset: off})
	}
	return out
}

// queries builds prefix lookups that cover the model's state: for every
// model, windows of 6 consecutive hashes over the sorted union of every
// hash present, plus each endpoint's own hashes in order.
func queries(m *refmodel.Model) map[string][][]uint64 {
	per := map[string]map[uint64]bool{}
	own := map[keyspace.Endpoint][]uint64{}
	for _, b := range m.Blocks() {
		if per[b.Endpoint.Model] == nil {
			per[b.Endpoint.Model] = map[uint64]bool{}
		}
		per[b.Endpoint.Model][b.Hash] = true
		own[b.Endpoint] = append(own[b.Endpoint], b.Hash)
	}
	out := map[string][][]uint64{}
	for model, set := range per {
		hs := slices.Sorted(maps.Keys(set))
		for i := 0; i < len(hs); i += 3 {
			out[model] = append(out[model], hs[i:min(i+6, len(hs))])
		}
	}
	for ep, hs := range own {
		out[ep.Model] = append(out[ep.Model], slices.Compact(hs))
	}
	return out
}

// checkAgainstModel compares a replica's answers with the model's: every
// query's Lookup (after a barrier on offs), and ListEndpoints' per-tier
// block counts of every endpoint.
func checkAgainstModel(t *testing.T, c *client.Client, m *refmodel.Model, offs ingesttest.Offsets, label string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(time.Minute))
	defer cancel()
	n := 0
	for model, qs := range queries(m) {
		for _, q := range qs {
			got, err := c.Lookup(ctx, model, q, client.WithBarrier(30*time.Second, barrier(offs)...))
			if err != nil {
				t.Fatalf("%s: lookup: %v", label, err)
			}
			if diffs := scenario.Compare(m.Lookup(model, q), replay.Matches(got)); diffs != nil {
				t.Fatalf("%s: lookup %s %x differs from the reference model: %v", label, model, q, diffs)
			}
			n++
		}
	}
	if n == 0 {
		t.Fatalf("%s: nothing to look up: the model holds no block", label)
	}
	type counts [tier.Count]uint64
	want := map[keyspace.Endpoint]counts{}
	for _, ep := range m.Endpoints() {
		want[ep] = counts{}
	}
	for _, b := range m.Blocks() {
		c := want[b.Endpoint]
		c[b.Tier-1]++
		want[b.Endpoint] = c
	}
	list, err := c.ListEndpoints(ctx, "")
	if err != nil {
		t.Fatalf("%s: ListEndpoints: %v", label, err)
	}
	got := map[keyspace.Endpoint]counts{}
	for _, e := range list.Endpoints {
		got[keyspace.Endpoint{Model: e.Model, Pod: e.Endpoint.Pod, Rank: e.Endpoint.DPRank}] = counts{e.GPUBlocks, e.CPUBlocks, e.DiskBlocks}
	}
	if !maps.Equal(want, got) {
		t.Fatalf("%s: endpoints and per-tier block counts differ from the reference model:\n model: %v\n index: %v", label, describeCounts(want), describeCounts(got))
	}
}

func describeCounts[C any](m map[keyspace.Endpoint]C) string {
	keys := slices.SortedFunc(maps.Keys(m), func(a, b keyspace.Endpoint) int {
		return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.Pod, b.Pod), cmp.Compare(a.Rank, b.Rank))
	})
	s := ""
	for _, k := range keys {
		s += fmt.Sprintf("\n   %v: %v", k, m[k])
	}
	return s
}

func genSeed(t *testing.T) uint64 {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("failed with seed %d", seed)
		}
	})
	return seed
}

// TestRandomStreamThroughPipeline sends a seeded random stream (stores,
// removals, clears, control records, duplicates, engine restarts, gaps,
// garbage) through Kafka → ingester → etcd → two indexd replicas, in three
// phases with restarts between them: an indexd replica restarted while
// records flow (it must catch up and answer as the one that never
// stopped), the ingester restarted, and the router's client restarted. At
// every checkpoint both replicas must answer exactly as the reference
// model.
func TestRandomStreamThroughPipeline(t *testing.T) {
	t.Parallel()
	seed := genSeed(t)
	recs := refmodel.Generate(refmodel.GenConfig{Seed: seed, Records: 3000, Pods: 5})
	model := refmodel.New(refmodel.Config{})
	p := newPipeline(t, 4)
	ing := p.ingester("ingester-a", nil)
	replicaA, replicaB := p.replica(), p.replica()
	ca, cb := newClient(t, replicaA.addr), newClient(t, replicaB.addr)

	phase := func(part []refmodel.Record) ingesttest.Offsets {
		for _, r := range part {
			model.Apply(r)
		}
		return p.produce(part)
	}
	offs := ingesttest.Offsets{}
	third := len(recs) / 3

	offs.Merge(phase(recs[:third]))
	checkAgainstModel(t, ca, model, offs, "phase 1 replica A")
	checkAgainstModel(t, cb, model, offs, "phase 1 replica B")

	// Replica B stops; records flow; a new replica B starts and catches up.
	replicaB.stop(t)
	offs.Merge(phase(recs[third : 2*third]))
	replicaB = p.replica()
	cb = newClient(t, replicaB.addr)
	checkAgainstModel(t, ca, model, offs, "phase 2 replica A")
	checkAgainstModel(t, cb, model, offs, "phase 2 restarted replica B")

	// The ingester restarts (a new member takes the partitions back from
	// the stored offsets), and the router's client restarts.
	ing.stop(t)
	p.ingester("ingester-b", nil)
	offs.Merge(phase(recs[2*third:]))
	ca.Close()
	ca = newClient(t, replicaA.addr)
	checkAgainstModel(t, ca, model, offs, "phase 3 replica A, new client")
	checkAgainstModel(t, cb, model, offs, "phase 3 replica B")
}

// TestCompactionWhileIndexdDisconnected cuts a replica off etcd, changes
// and compacts etcd's history past what the replica has seen, and
// reconnects it: it must re-list (the only way past a compaction) and
// converge to the reference model with no stale entry, while a replica that
// stayed connected agrees throughout.
func TestCompactionWhileIndexdDisconnected(t *testing.T) {
	t.Parallel()
	seed := genSeed(t)
	recs := refmodel.Generate(refmodel.GenConfig{Seed: seed, Records: 1500, Pods: 4})
	model := refmodel.New(refmodel.Config{})
	p := newPipeline(t, 2)
	p.ingester("ingester-a", nil)
	px := testutil.StartProxy(t, testutil.HostPort(p.etcd.Endpoints[0]))
	cutReplica, steadyReplica := p.replica(px.Endpoint()), p.replica()
	cut, steady := newClient(t, cutReplica.addr), newClient(t, steadyReplica.addr)

	half := len(recs) / 2
	for _, r := range recs[:half] {
		model.Apply(r)
	}
	offs := p.produce(recs[:half])
	checkAgainstModel(t, cut, model, offs, "before the cut")
	listsBefore := cutReplica.lists(t)

	px.Cut()
	for _, r := range recs[half:] {
		model.Apply(r)
	}
	offs.Merge(p.produce(recs[half:]))
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(time.Minute))
	defer cancel()
	ingesttest.WaitApplied(t, ctx, p.etcd.Client, p.ks, topic, offs)
	resp, err := p.etcd.Client.Get(ctx, "compact-me")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.etcd.Client.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	checkAgainstModel(t, steady, model, offs, "steady replica after compaction")
	px.Restore(p.etcd.Endpoints[0])
	checkAgainstModel(t, cut, model, offs, "reconnected replica after compaction")
	if after := cutReplica.lists(t); after <= listsBefore {
		t.Fatalf("the reconnected replica answered without re-listing (lists %v → %v): it cannot have seen the compacted history", listsBefore, after)
	}
}
