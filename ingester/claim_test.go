package ingester

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
)

// readCounter is a gRPC interceptor that counts the keys etcd range reads
// return (plain ranges and the ranges inside transactions) and the calls
// of each method.
type readCounter struct {
	mu    sync.Mutex
	keys  int
	calls map[string]int
}

func (c *readCounter) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls[method]++
	switch r := reply.(type) {
	case *pb.RangeResponse:
		c.keys += len(r.Kvs)
	case *pb.TxnResponse:
		for _, op := range r.Responses {
			c.keys += len(op.GetResponseRange().GetKvs())
		}
	}
	return err
}

func (c *readCounter) read() (int, map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	calls := make(map[string]int, len(c.calls))
	for m, n := range c.calls {
		calls[m] = n
	}
	return c.keys, calls
}

// TestClaimCostsItsPartition: claiming a partition reads the partition's
// own endpoints, not every endpoint record of the keyspace, and never lists
// the cluster's leases (an etcd role scoped to the prefix may not, and the
// cost would grow with the cluster). Many endpoints of another topic, each
// on a lease of its own, share the keyspace.
func TestClaimCostsItsPartition(t *testing.T) {
	t.Parallel()
	const topic, others = "claim", 300
	e := newEnv(t, 1, []string{topic})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(60*time.Second))
	defer cancel()
	cfg := e.config(t, topic, "g-claim", "/kvindex/claim/")
	ks := cfg.Keyspace
	for i := range others {
		lease, err := e.etcd.Client.Grant(ctx, 60)
		if err != nil {
			t.Fatal(err)
		}
		rec := keyspace.EndpointRecord{HashMode: keyspace.HashModeEngine, Topic: "elsewhere", Partition: 0, Lease: keyspace.LeaseID(lease.ID), LastRecord: time.Now().UTC()}
		v, err := rec.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		id := keyspace.Endpoint{Model: "m", Pod: fmt.Sprintf("other-%d", i)}
		if _, err := e.etcd.Client.Put(ctx, ks.EndpointKey(id), string(v), clientv3.WithLease(lease.ID)); err != nil {
			t.Fatal(err)
		}
	}

	// A first owner writes two endpoints of the partition, then stops.
	now := time.Now()
	r := start(t, cfg)
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, ks, topic,
		ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{store(t, "a", now, 1, 2), store(t, "b", now, 3)}))
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}

	// The next owner claims it through a client that counts what it reads.
	reads := &readCounter{calls: map[string]int{}}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   e.etcd.Endpoints,
		DialTimeout: testutil.Timeout(5 * time.Second),
		DialOptions: []grpc.DialOption{
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithChainUnaryInterceptor(reads.intercept),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	cfg.Etcd = cli
	r = start(t, cfg)
	r.waitOwned(t, ctx, 1)
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, ks, topic,
		ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{store(t, "a", now, 4)}))
	keys, calls := reads.read()
	t.Logf("keys read %d, calls %v", keys, calls)
	if n := calls["/etcdserverpb.Lease/LeaseLeases"]; n > 0 {
		t.Errorf("the claim listed the cluster's leases %d times, want never", n)
	}
	// The partition has two endpoints, each record found through one
	// key, plus its offset: a handful of keys, whatever else the cluster
	// holds.
	if keys > 20 {
		t.Errorf("claiming a partition of 2 endpoints read %d keys (the keyspace holds %d other endpoints), want at most 20", keys, others)
	}
	if ok, n := present(t, ctx, e, ks, "a"); !ok || n != 3 {
		t.Errorf("endpoint a after the new owner's write: record %v, %d blocks, want its 3 blocks kept", ok, n)
	}
}
