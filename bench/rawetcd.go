package bench

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/ingester"
	"github.com/kvindex/kvindex/internal/keyspace"
)

// txnCapture records, per partition, the guarded write transactions an
// ingester commits through one etcd client: it is a gRPC interceptor on
// that client, so what it records is exactly what went over the wire.
// A write transaction is recognised by its one guard, a compare on
// ModRevision(owners/{topic}/{partition}) (DESIGN "Writes"); claims and
// lease calls are not recorded. Only transactions that succeeded are kept,
// so a retried send is recorded once.
type txnCapture struct {
	ks keyspace.Keyspace
	mu sync.Mutex
	// txns holds copies of the requests, per partition, in commit order.
	txns map[int32][]*pb.TxnRequest
	// writerTime is, after rawWrite, when each partition's writer finished
	// (from the start of the writing).
	writerTime map[int32]time.Duration
}

func newTxnCapture(ks keyspace.Keyspace) *txnCapture {
	return &txnCapture{ks: ks, txns: map[int32][]*pb.TxnRequest{}}
}

// dialOption installs the capture on a client.
func (c *txnCapture) dialOption() grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(c.intercept)
}

func (c *txnCapture) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	t, ok := req.(*pb.TxnRequest)

	if !ok || len(t.Compare) != 1 || t.Compare[0].Target != pb.Compare_MOD {
		return err
	}
	// A transaction that failed on the client may still have been applied:
	// a worker stopped by a rebalance cancels its call after etcd took it,
	// and its successor then starts past the offset it stored. Such a
	// transaction is kept too; where etcd did not apply it, writing it
	// again is harmless, since the successor replays the same records
	// from the stored offset and its transactions come after it.
	if resp, ok := reply.(*pb.TxnResponse); err == nil && (!ok || !resp.Succeeded) {
		return err
	}
	p, perr := c.ks.ParseOwnerKey(string(t.Compare[0].Key))
	if perr != nil {
		return err
	}
	cp := proto.Clone(t).(*pb.TxnRequest) // the ingester reuses its request memory
	c.mu.Lock()
	c.txns[p.Partition] = append(c.txns[p.Partition], cp)
	c.mu.Unlock()
	return err
}

// dataKey reports whether key holds index data: a v2 chunk key
// (internal/keyspace) or a v1 block key (the v1 writer's, v1layout.go).
func (c *txnCapture) dataKey(key []byte) bool {
	return bytes.HasPrefix(key, []byte(c.ks.ChunksPrefix())) || bytes.HasPrefix(key, []byte(v1BlocksPrefix(c.ks)))
}

// opKey is the key an op writes, and whether it is a delete.
func opKey(op *pb.RequestOp) (key []byte, del bool) {
	switch r := op.Request.(type) {
	case *pb.RequestOp_RequestPut:
		return r.RequestPut.Key, false
	case *pb.RequestOp_RequestDeleteRange:
		return r.RequestDeleteRange.Key, true
	}
	return nil, false
}

// captureCounts are a capture's totals: transactions, all their
// operations, and the data operations among them (puts and deletes of
// chunk keys in v2, of block keys in v1; a range drop counts as one).
type captureCounts struct {
	Txns, Ops, DataOps int64
	// PartitionDataOps are the data operations per partition.
	PartitionDataOps map[int32]int64
	// Layout is "v2" when the transactions write chunk keys, else "v1".
	Layout string
}

// counts totals the captured transactions.
func (c *txnCapture) counts() captureCounts {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := captureCounts{PartitionDataOps: map[int32]int64{}, Layout: "v1"}
	chunks := []byte(c.ks.ChunksPrefix())
	for p, txns := range c.txns {
		for _, t := range txns {
			out.Txns++
			out.Ops += int64(len(t.Success))
			for _, op := range t.Success {
				k, _ := opKey(op)
				if c.dataKey(k) {
					out.DataOps++
					out.PartitionDataOps[p]++
				}
				if bytes.HasPrefix(k, chunks) {
					out.Layout = "v2"
				}
			}
		}
	}
	return out
}

// rawWrite is the reference writer (DESIGN "Performance goals": the same
// transactions written straight to the same etcd by the same number of
// concurrent writers). It writes c's transactions to cli with one writer
// per partition, each sending its partition's transactions in order
// through the same raw gRPC KV client the ingester uses, and returns the
// time that took. Like the ingester's partition worker, a writer keeps up
// to inFlight block transactions in flight, and sends a transaction that
// stores an offset or deletes a range or a record (a window's commit, a
// drop) alone, once every earlier one has committed (see barrier). Before timing, the captured leases are replaced by
// leases granted in this etcd and every guard is re-pointed at an owner
// key written for it.
func (c *txnCapture) rawWrite(ctx context.Context, cli *clientv3.Client, topic string, inFlight int) (time.Duration, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	leases := map[int64]int64{}
	ttl := int64(ingester.DefaultLeaseTTL / time.Second)
	for p, txns := range c.txns {
		resp, err := cli.Put(ctx, c.ks.OwnerKey(keyspace.Partition{Topic: topic, Partition: p}), "reference")
		if err != nil {
			return 0, fmt.Errorf("bench: reference owner key: %w", err)
		}
		for _, t := range txns {
			for _, cmp := range t.Compare {
				cmp.TargetUnion = &pb.Compare_ModRevision{ModRevision: resp.Header.Revision}
			}
			for _, op := range t.Success {
				put, ok := op.Request.(*pb.RequestOp_RequestPut)
				if !ok || put.RequestPut.Lease == 0 {
					continue
				}
				id := put.RequestPut.Lease
				if _, ok := leases[id]; !ok {
					g, err := cli.Grant(ctx, ttl)
					if err != nil {
						return 0, fmt.Errorf("bench: reference lease: %w", err)
					}
					leases[id] = int64(g.ID)
				}
				put.RequestPut.Lease = leases[id]
			}
		}
	}
	kv := clientv3.RetryKVClient(cli)
	g, gctx := errgroup.WithContext(ctx)
	began := time.Now()
	c.writerTime = map[int32]time.Duration{}
	var wmu sync.Mutex
	for p, txns := range c.txns {
		g.Go(func() error {
			defer func() {
				d := time.Since(began)
				wmu.Lock()
				c.writerTime[p] = d
				wmu.Unlock()
			}()
			send := func(t *pb.TxnRequest) error {
				resp, err := kv.Txn(gctx, t)
				if err != nil {
					return fmt.Errorf("bench: reference transaction: %w", err)
				}
				if !resp.Succeeded {
					return fmt.Errorf("bench: reference transaction's guard failed")
				}
				return nil
			}
			flights := new(errgroup.Group)
			flights.SetLimit(max(inFlight, 1))
			for _, t := range txns {
				if !c.barrier(t) {
					flights.Go(func() error { return send(t) })
					continue
				}
				if err := flights.Wait(); err != nil {
					return err
				}
				if err := send(t); err != nil {
					return err
				}
				flights = new(errgroup.Group)
				flights.SetLimit(max(inFlight, 1))
			}
			return flights.Wait()
		})
	}
	err := g.Wait()
	return time.Since(began), err
}

// barrier reports whether the ingester sends t only once every earlier
// transaction of its partition has committed, and none after it until it
// has: t stores an offset (a window's commit), or deletes a range or an
// endpoint record (a drop). Other transactions put and delete single data
// keys (v2 chunks, v1 blocks) and put endpoint records, and go out without
// waiting.
func (c *txnCapture) barrier(t *pb.TxnRequest) bool {
	offsets := []byte(c.ks.OffsetsPrefix())
	for _, op := range t.Success {
		switch r := op.Request.(type) {
		case *pb.RequestOp_RequestPut:
			if bytes.HasPrefix(r.RequestPut.Key, offsets) {
				return true
			}
		case *pb.RequestOp_RequestDeleteRange:
			if len(r.RequestDeleteRange.RangeEnd) > 0 || !c.dataKey(r.RequestDeleteRange.Key) {
				return true
			}
		default:
			return true
		}
	}
	return false
}
