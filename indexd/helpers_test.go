package indexd

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvindex/kvindex/internal/index"
	"github.com/kvindex/kvindex/internal/index/indextest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testutil.LeakOptions()...)
}

// The models and pods the randomized tests draw from.
var (
	testModels = []string{"meta-llama/Llama-3.1-8B-Instruct", "m2"}
	testPods   = []string{"vllm-0", "team-a/vllm 1@10.0.0.5:8000", "p2", "p3", "p4", "p5", "p6", "p7", "p8", "p9", "p10", "p11"}
)

// testTimeout bounds every wait of these tests (scaled by
// KVINDEX_TEST_TIMEOUT_SCALE, testutil.Timeout).
var testTimeout = testutil.Timeout(30 * time.Second)

// replica is a running indexd Server with a gRPC client to it.
type replica struct {
	srv    *Server
	reg    *prometheus.Registry
	api    kvindexv1.IndexServiceClient
	health healthpb.HealthClient
	conn   *grpc.ClientConn
	stop   func()
}

// startReplica runs an indexd Server on a free loopback port against
// etcdCli until the test ends (or r.stop).
func startReplica(t *testing.T, etcdCli *clientv3.Client, mods ...func(*Config)) *replica {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := DefaultConfig()
	cfg.Etcd = etcdCli
	cfg.ListenAddr = "127.0.0.1:0"
	cfg.BackoffMin, cfg.BackoffMax = 5*time.Millisecond, 100*time.Millisecond
	cfg.ShutdownGrace = 2 * time.Second
	cfg.Registry = reg
	for _, m := range mods {
		m(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	conn, err := grpc.NewClient(srv.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{srv: srv, reg: reg, api: kvindexv1.NewIndexServiceClient(conn), health: healthpb.NewHealthClient(conn), conn: conn}
	stopped := false
	r.stop = func() {
		if stopped {
			return
		}
		stopped = true
		conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	t.Cleanup(r.stop)
	return r
}

// waitServing blocks until the replica's health service says SERVING.
func (r *replica) waitServing(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	stream, err := r.health.Watch(ctx, &healthpb.HealthCheckRequest{Service: serviceName})
	if err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("waiting for SERVING: %v", err)
		}
		if resp.Status == healthpb.HealthCheckResponse_SERVING {
			return
		}
	}
}

// counter reads a counter of the replica's registry.
func (r *replica) counter(t *testing.T, c prometheus.Collector) float64 {
	t.Helper()
	return promtest.ToFloat64(c)
}

// writer writes etcd keys as the ingester does: chunk values on a lease
// (through indextest.Chunker, the chunk rule of DESIGN "The chunk rule
// (writer)"), endpoints/ records and offsets/ next offsets, one
// transaction per commit, each advancing one partition's offset.
type writer struct {
	t      *testing.T
	cli    *clientv3.Client
	ks     keyspace.Keyspace
	lease  clientv3.LeaseID
	part   keyspace.Partition
	next   int64
	chunks *indextest.Chunker
	// shuffle, when set, puts each transaction's chunk ops in a random
	// order (else key order), so the tests see a merge's put and delete
	// both ways round within one revision.
	shuffle *rand.Rand
}

func newWriter(t *testing.T, cli *clientv3.Client) *writer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	l, err := cli.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	ks := keyspace.Default()
	return &writer{t: t, cli: cli, ks: ks, lease: l.ID, part: keyspace.Partition{Topic: "kvindex-events", Partition: 0},
		chunks: indextest.NewChunker(ks)}
}

// blockOp is a block store, removal or endpoint drop, which commit turns
// into chunk writes.
type blockOp struct {
	b      keyspace.Block
	engine uint64
	remove bool
	drop   bool
}

// commit writes ops (clientv3.Op values and blockOps, the latter as the
// chunk puts and deletes they come to) and the partition's next offset in
// one transaction, and returns the offset of the "record" it stands for
// and the revision.
func (w *writer) commit(ops ...any) (int64, int64) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	var plain []clientv3.Op
	for _, op := range ops {
		switch op := op.(type) {
		case clientv3.Op:
			plain = append(plain, op)
		case blockOp:
			switch {
			case op.drop:
				w.chunks.Drop(op.b.Endpoint)
			case op.remove:
				w.chunks.Remove(op.b.Endpoint, op.b.Tier, op.b.Hash)
			default:
				w.chunks.Store(op.b.Endpoint, op.b.Tier, op.b.Hash, op.engine)
			}
		default:
			w.t.Fatalf("commit: %T is not an op", op)
		}
	}
	var txn []clientv3.Op
	for _, c := range w.chunks.Flush() {
		if c.Value == nil {
			txn = append(txn, clientv3.OpDelete(c.Key))
		} else {
			txn = append(txn, clientv3.OpPut(c.Key, string(c.Value), clientv3.WithLease(w.lease)))
		}
	}
	if w.shuffle != nil {
		w.shuffle.Shuffle(len(txn), func(i, j int) { txn[i], txn[j] = txn[j], txn[i] })
	}
	w.next++
	txn = append(txn, plain...)
	txn = append(txn, clientv3.OpPut(w.ks.OffsetKey(w.part), keyspace.FormatOffset(w.next)))
	resp, err := w.cli.Txn(ctx).Then(txn...).Commit()
	if err != nil {
		w.t.Fatalf("txn: %v", err)
	}
	return w.next - 1, resp.Header.Revision
}

// put stores b (its engine hash is its key hash, engine-hash mode).
func (w *writer) put(b keyspace.Block) blockOp { return blockOp{b: b, engine: b.Hash} }

// del removes b.
func (w *writer) del(b keyspace.Block) blockOp { return blockOp{b: b, remove: true} }

// drop deletes every chunk of ep (AllBlocksCleared, resync, restarts).
func (w *writer) drop(ep keyspace.Endpoint) blockOp {
	return blockOp{b: keyspace.Block{Endpoint: ep}, drop: true}
}

func (w *writer) record(ep keyspace.Endpoint, rec keyspace.EndpointRecord) clientv3.Op {
	if rec.HashMode == "" {
		rec.HashMode = keyspace.HashModeEngine
	}
	v, err := rec.Marshal()
	if err != nil {
		w.t.Fatal(err)
	}
	return clientv3.OpPut(w.ks.EndpointKey(ep), string(v), clientv3.WithLease(w.lease))
}

// barrier is a Lookup barrier on the writer's last committed record.
func (w *writer) barrier() *kvindexv1.Barrier {
	return &kvindexv1.Barrier{Records: []*kvindexv1.PartitionOffset{{Topic: w.part.Topic, Partition: w.part.Partition, Offset: w.next - 1}}}
}

// lookup calls Lookup after the writer's last commit is applied and
// returns the matches in the index's terms.
func lookup(t *testing.T, r *replica, w *writer, model string, hashes []uint64, cands []keyspace.Endpoint) ([]index.Match, *kvindexv1.LookupResponse) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	req := &kvindexv1.LookupRequest{Model: model, BlockHashes: hashes, Barrier: w.barrier()}
	for _, c := range cands {
		req.Candidates = append(req.Candidates, &kvindexv1.Endpoint{Pod: c.Pod, DpRank: c.Rank})
	}
	resp, err := r.api.Lookup(ctx, req)
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	return matchesOf(model, resp), resp
}

func matchesOf(model string, resp *kvindexv1.LookupResponse) []index.Match {
	var out []index.Match
	for _, m := range resp.Matches {
		ts := make([]tier.Tier, len(m.Tiers))
		for i, x := range m.Tiers {
			ts[i] = tier.Tier(x)
		}
		out = append(out, index.Match{Endpoint: keyspace.Endpoint{Model: model, Pod: m.Endpoint.Pod, Rank: m.Endpoint.DpRank}, Blocks: int(m.MatchedBlocks), Tiers: ts})
	}
	return out
}

// etcdState reads what etcd holds under the default prefix into a
// reference model.
func etcdState(t *testing.T, cli *clientv3.Client) *indextest.Reference {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	ks := keyspace.Default()
	resp, err := cli.Get(ctx, ks.Prefix(), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	ref := indextest.NewReference()
	for _, kv := range resp.Kvs {
		switch ks.KindOf(string(kv.Key)) {
		case keyspace.KindChunk:
			c, err := ks.ParseChunkKey(string(kv.Key))
			if err != nil {
				continue
			}
			cv, err := keyspace.ParseChunkValue(kv.Value)
			if err != nil {
				continue
			}
			for i := range cv.Len() {
				ref.Present[keyspace.Block{Endpoint: c.Endpoint, Tier: c.Tier, Hash: cv.Key(i)}] = true
			}
		case keyspace.KindEndpoint:
			if ep, err := ks.ParseEndpointKey(string(kv.Key)); err == nil {
				ref.Records[ep] = true
			}
		}
	}
	return ref
}

// ownClient dials a client of its own to endpoints (one the test's etcd
// restarts do not close), closed when the test ends.
func ownClient(t *testing.T, endpoints []string) *clientv3.Client {
	t.Helper()
	cli, err := testutil.NewEtcdClient(endpoints)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}
