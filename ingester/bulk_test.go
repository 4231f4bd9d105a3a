package ingester

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
)

// bulkTxns is a gRPC interceptor that delays every etcd Txn call and
// records the most block-transaction operations in flight at once, and
// how many commit transactions (those that store an offset) were sent
// while block transactions held at least limit operations.
type bulkTxns struct {
	delay   time.Duration
	offsets string // the keyspace's offsets prefix
	limit   int

	mu             sync.Mutex
	now, max       int
	commitsAtLimit int
}

func (s *bulkTxns) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	txn, ok := req.(*pb.TxnRequest)
	if !ok {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	commit := false
	for _, op := range txn.Success {
		if put := op.GetRequestPut(); put != nil && strings.HasPrefix(string(put.Key), s.offsets) {
			commit = true
		}
	}
	n := len(txn.Success)
	s.mu.Lock()
	if commit {
		if s.now >= s.limit {
			s.commitsAtLimit++
		}
	} else {
		s.now += n
		s.max = max(s.max, s.now)
	}
	s.mu.Unlock()
	defer func() {
		if !commit {
			s.mu.Lock()
			s.now -= n
			s.mu.Unlock()
		}
	}()
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return ctx.Err()
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (s *bulkTxns) stats() (maxOps, commitsAtLimit int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.max, s.commitsAtLimit
}

// TestBulkBudget: MaxBlockOpsInFlight bounds the block-transaction
// operations in flight across all of a member's partitions, while commit
// transactions are not held by it; every block still lands. Unbounded,
// the same load puts more than the budget in flight, so the bound is what
// the first case measures.
func TestBulkBudget(t *testing.T) {
	const (
		partitions = 4
		maxTxnOps  = 16
		budget     = 2 * maxTxnOps
		pods       = 8
		blocks     = 200
	)
	for _, bulk := range []int{budget, -1} {
		t.Run(fmt.Sprintf("budget_%d", bulk), func(t *testing.T) {
			topic := fmt.Sprintf("bulk-%d", max(bulk, 0))
			e := newEnv(t, partitions, []string{topic})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()

			cfg := e.config(t, topic, "g-"+topic, "/kvindex/"+topic+"/")
			slow := &bulkTxns{delay: 5 * time.Millisecond, offsets: cfg.Keyspace.OffsetsPrefix(), limit: budget}
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
			reg := prometheus.NewRegistry()
			cfg.Etcd = cli
			cfg.Registry = reg
			cfg.MaxTxnOps = maxTxnOps
			cfg.MaxTxnsInFlight = 4
			cfg.MaxBlockOpsInFlight = bulk
			start(t, cfg)

			now := time.Now()
			var recs []refmodel.Record
			for round := range 3 {
				for p := range pods {
					hs := chain(blocks, uint64(round*pods+p+1))
					recs = append(recs, batchRecord(t, "m", fmt.Sprintf("pod-%d", p), now,
						events.Event{Type: events.BlockStored, BlockHashes: hs, Medium: "GPU"}))
				}
			}
			ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic, ingesttest.Produce(t, ctx, e.prod, topic, recs))
			for p := range pods {
				id := keyspace.Endpoint{Model: "m", Pod: fmt.Sprintf("pod-%d", p)}
				if n := blockCount(t, ctx, e, cfg.Keyspace, id); n != 3*blocks {
					t.Errorf("%s: %d block keys, want %d", id.Pod, n, 3*blocks)
				}
			}

			got, commits := slow.stats()
			waits := testutil.HistogramCount(t, reg, "kvindex_ingester_block_txn_wait_seconds", nil)
			t.Logf("at most %d block ops in flight; %d commit transactions sent at the budget; %d waits", got, commits, waits)
			if bulk < 0 {
				if got <= budget {
					t.Fatalf("unbounded, at most %d block ops were in flight: the load never exceeds the budget %d, so the bounded case proves nothing", got, budget)
				}
				if waits != 0 {
					t.Errorf("unbounded, %d block transactions waited", waits)
				}
				return
			}
			if got > bulk {
				t.Errorf("%d block ops in flight at once, want at most MaxBlockOpsInFlight = %d", got, bulk)
			}
			if waits == 0 {
				t.Error("no block transaction waited for the budget")
			}
			if commits == 0 {
				t.Error("no commit transaction was sent while the block transactions held the whole budget: commits wait for it")
			}
		})
	}
}
