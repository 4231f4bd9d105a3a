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

	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
)

// slowTxns is a gRPC interceptor that delays every etcd Txn call and
// records the most calls it saw at once.
type slowTxns struct {
	delay time.Duration

	mu       sync.Mutex
	now, max int
}

func (s *slowTxns) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if _, ok := req.(*pb.TxnRequest); !ok {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	s.mu.Lock()
	s.now++
	s.max = max(s.max, s.now)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.now--
		s.mu.Unlock()
	}()
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return ctx.Err()
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (s *slowTxns) maxInFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.max
}

// TestWindowTransactionsInFlight: a window's block transactions go out up
// to MaxTxnsInFlight at a time and land whole, also when every one of them
// is refused because the lease they name expired (each failed range is
// sent again with a fresh lease, and the commit transaction still comes
// last). The etcd client delays each transaction, so a worker that waited
// for each before sending the next would never have two in flight.
func TestWindowTransactionsInFlight(t *testing.T) {
	for _, inFlight := range []int{1, 4} {
		t.Run(fmt.Sprintf("in_flight_%d", inFlight), func(t *testing.T) {
			topic := fmt.Sprintf("inflight-%d", inFlight)
			e := newEnv(t, 1, []string{topic})
			ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(60*time.Second))
			defer cancel()

			slow := &slowTxns{delay: 10 * time.Millisecond}
			cli, err := clientv3.New(clientv3.Config{
				Endpoints:   e.etcd.Endpoints,
				DialTimeout: 5 * time.Second,
				DialOptions: []grpc.DialOption{
					grpc.WithTransportCredentials(insecure.NewCredentials()),
					grpc.WithChainUnaryInterceptor(slow.intercept),
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()

			cfg := e.config(t, topic, "g-"+topic, "/kvindex/"+topic+"/")
			cfg.Etcd = cli
			cfg.MaxTxnOps = 16
			cfg.MaxTxnsInFlight = inFlight
			start(t, cfg)

			now := time.Now()
			first, second := chain(300, 1), chain(300, 2)
			stored := func(hashes []uint64) refmodel.Record {
				return batchRecord(t, "m", "pod", now, events.Event{Type: events.BlockStored, BlockHashes: hashes, Medium: "GPU"})
			}
			ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic,
				ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{stored(first)}))
			id := keyspace.Endpoint{Model: "m", Pod: "pod"}
			if n := blockCount(t, ctx, e, cfg.Keyspace, id); n != len(first) {
				t.Fatalf("after the first record: %d block keys, want %d", n, len(first))
			}

			// Expire the endpoint's GPU lease behind the ingester's back:
			// every block transaction of the next window names it.
			old := ingesttest.Endpoints(t, ctx, e.etcd.Client, cfg.Keyspace)[id].TierLeases["gpu"][0].ID
			if _, err := e.etcd.Client.Revoke(ctx, clientv3.LeaseID(old)); err != nil {
				t.Fatal(err)
			}
			ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic,
				ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{stored(second)}))
			if n := blockCount(t, ctx, e, cfg.Keyspace, id); n != len(second) {
				t.Errorf("after the lease expired: %d block keys, want the second record's %d (the expired lease took the first's)", n, len(second))
			}
			rec := ingesttest.Endpoints(t, ctx, e.etcd.Client, cfg.Keyspace)[id]
			recorded := map[int64]bool{}
			for _, s := range rec.TierLeases["gpu"] {
				if int64(s.ID) == int64(old) {
					t.Errorf("the record still names the expired lease %v", old)
				}
				recorded[int64(s.ID)] = true
			}
			for _, h := range second {
				lease, err := ingesttest.LeaseOf(ctx, e.etcd.Client, cfg.Keyspace.BlockKey(id, tier.GPU, h))
				if err != nil || !recorded[int64(lease)] {
					t.Fatalf("block %x hangs on lease %x (%v), which the endpoint record (%+v) does not name", h, lease, err, rec.TierLeases)
				}
			}

			got := slow.maxInFlight()
			t.Logf("at most %d transactions in flight", got)
			if got > inFlight {
				t.Errorf("%d transactions in flight at once, want at most MaxTxnsInFlight = %d", got, inFlight)
			}
			if inFlight > 1 && got < 2 {
				t.Errorf("never more than one transaction in flight with MaxTxnsInFlight = %d", inFlight)
			}
		})
	}
}

// blockCount counts the block keys of id.
func blockCount(t *testing.T, ctx context.Context, e *env, ks keyspace.Keyspace, id keyspace.Endpoint) int {
	t.Helper()
	resp, err := e.etcd.Client.Get(ctx, ks.EndpointBlocksPrefix(id), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return int(resp.Count)
}
