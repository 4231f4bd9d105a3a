package ingester

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/backoff"
)

// txnOverhead approximates the protobuf framing of one request op (tags,
// lengths, the lease varint) when estimating a transaction's size.
const txnOverhead = 24

// txnBuilder builds one guarded write transaction at a time, reusing its
// memory: request structs live in arrays sized for MaxTxnOps, keys in an
// arena. A built request is valid until the next reset. A worker's packer
// owns one. What a transaction carries is the builder's state alone: the
// packer asks it (record) instead of keeping marks on the endpoints.
type txnBuilder struct {
	req  pb.TxnRequest
	cmp  pb.Compare
	cmpu pb.Compare_ModRevision
	cmps [1]*pb.Compare

	ops   []*pb.RequestOp
	reqs  []pb.RequestOp
	puts  []pb.PutRequest
	putw  []pb.RequestOp_RequestPut
	dels  []pb.DeleteRangeRequest
	delw  []pb.RequestOp_RequestDeleteRange
	arena []byte
	bytes int

	// offset is the next offset this transaction stores, or -1.
	offset int64
	// chunkOps counts the chunk puts and deletes added.
	chunkOps int
	// recs are the endpoint records the transaction puts, recDels the
	// endpoints whose records it deletes.
	recs    []recPut
	recDels []*endpoint
	// last is the index in recs of the record found by the last record
	// call (a window's ops come endpoint by endpoint).
	last int
}

// recPut is an endpoint record put by a transaction: the op that puts it,
// and the endpoint's lease generation it was written with (landed needs it
// once the transaction commits).
type recPut struct {
	ep  *endpoint
	op  int
	gen uint64
}

func newTxnBuilder(maxOps int, ownerKey string) *txnBuilder {
	b := &txnBuilder{
		ops:   make([]*pb.RequestOp, 0, maxOps),
		reqs:  make([]pb.RequestOp, maxOps),
		puts:  make([]pb.PutRequest, maxOps),
		putw:  make([]pb.RequestOp_RequestPut, maxOps),
		dels:  make([]pb.DeleteRangeRequest, maxOps),
		delw:  make([]pb.RequestOp_RequestDeleteRange, maxOps),
		arena: make([]byte, 0, 64<<10),
	}
	b.cmp = pb.Compare{Result: pb.Compare_EQUAL, Target: pb.Compare_MOD, Key: []byte(ownerKey), TargetUnion: &b.cmpu}
	b.cmps[0] = &b.cmp
	return b
}

// reset starts a new transaction guarded by ModRevision(owner) == claimRev.
func (b *txnBuilder) reset(claimRev int64) {
	clear(b.recs)
	b.recs = b.recs[:0]
	clear(b.recDels)
	b.recDels = b.recDels[:0]
	b.cmpu.ModRevision = claimRev
	clear(b.ops)
	b.ops = b.ops[:0]
	b.arena = b.arena[:0]
	b.bytes = len(b.cmp.Key) + 16
	b.offset = -1
	b.chunkOps = 0
}

func (b *txnBuilder) n() int { return len(b.ops) }

// key copies k into the arena and returns the copy.
func (b *txnBuilder) key(k []byte) []byte {
	start := len(b.arena)
	b.arena = append(b.arena, k...)
	return b.arena[start:len(b.arena):len(b.arena)]
}

// put adds a put of key (in the arena: see key and packer.chunkKey) and returns
// the op's index.
func (b *txnBuilder) put(key, value []byte, lease clientv3.LeaseID) int {
	i := len(b.ops)
	b.puts[i] = pb.PutRequest{Key: key, Value: value, Lease: int64(lease)}
	b.putw[i] = pb.RequestOp_RequestPut{RequestPut: &b.puts[i]}
	b.reqs[i] = pb.RequestOp{Request: &b.putw[i]}
	b.ops = append(b.ops, &b.reqs[i])
	b.bytes += len(key) + len(value) + txnOverhead
	return i
}

// del adds a delete of [key, end) (end nil: key alone).
func (b *txnBuilder) del(key, end []byte) {
	i := len(b.ops)
	b.dels[i] = pb.DeleteRangeRequest{Key: key, RangeEnd: end}
	b.delw[i] = pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &b.dels[i]}
	b.reqs[i] = pb.RequestOp{Request: &b.delw[i]}
	b.ops = append(b.ops, &b.reqs[i])
	b.bytes += len(key) + len(end) + txnOverhead
}

// record returns the index in recs of ep's record put in this transaction,
// if there is one.
func (b *txnBuilder) record(ep *endpoint) (int, bool) {
	if b.last < len(b.recs) && b.recs[b.last].ep == ep {
		return b.last, true
	}
	for k := range b.recs {
		if b.recs[k].ep == ep {
			b.last = k
			return k, true
		}
	}
	return 0, false
}

// putRecord adds the put of ep's record rec, on ep's record lease, with its
// member key when etcd may not have it (a record not in etcd), and
// remembers it for packer.landed.
func (b *txnBuilder) putRecord(ep *endpoint, rec []byte) {
	if !ep.inEtcd {
		b.put(b.key([]byte(ep.memberKey)), nil, ep.lease)
	}
	op := b.put(b.key([]byte(ep.key)), rec, ep.lease)
	b.recs = append(b.recs, recPut{ep: ep, op: op, gen: ep.leaseGen})
	b.last = len(b.recs) - 1
}

// request returns the built request.
func (b *txnBuilder) request() *pb.TxnRequest {
	b.req = pb.TxnRequest{Compare: b.cmps[:], Success: b.ops}
	return &b.req
}

// errLeaseGone reports that a transaction named a lease etcd no longer has.
var errLeaseGone = errors.New("ingester: lease not found")

// send commits the packer's transaction, retrying transient etcd errors
// until ctx ends. It returns ErrFenced when the guard fails, errLeaseGone
// when a lease expired (the caller repairs the leases and rebuilds), the
// BeforeTxn hook's error, or ctx's error.
func (pk *packer) send(ctx context.Context, kind TxnKind) error {
	b := pk.b
	if pk.cfg.BeforeTxn != nil {
		if err := pk.cfg.BeforeTxn(ctx, TxnInfo{Partition: pk.p.Partition, Kind: kind, Ops: b.n(), ChunkOps: b.chunkOps, Offset: b.offset}); err != nil {
			return &hookError{err}
		}
	}
	req := b.request()
	bo := retryBackoff()
	for {
		start := time.Now()
		resp, err := pk.kv.Txn(ctx, req)
		if err == nil {
			if !resp.Succeeded {
				pk.m.guardFailures.Inc()
				return ErrFenced
			}
			pk.m.txnSeconds.Observe(time.Since(start).Seconds())
			pk.m.txns.WithLabelValues(kind.String()).Inc()
			pk.m.txnOps.Observe(float64(b.n()))
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(rpctypes.Error(err), rpctypes.ErrLeaseNotFound) {
			return errLeaseGone
		}
		if tooBig(err) {
			pk.m.etcdFailures.WithLabelValues("txn").Inc()
			// Retrying the same request cannot succeed: the configured
			// bounds exceed etcd's. Stop loudly instead of stalling the
			// partition behind it forever.
			return fmt.Errorf("ingester: etcd refused a %s transaction of %d ops, about %d bytes: %w (keep --max-txn-ops within etcd's --max-txn-ops and --max-txn-bytes under its --max-request-bytes)",
				kind, b.n(), b.bytes, err)
		}
		pk.m.txnRetries.Inc()
		d := bo.Next()
		if isEtcdErr(err, rpctypes.ErrGRPCNoSpace) {
			// etcd's NOSPACE alarm refuses every write until an operator
			// frees space: waiting is right, and the log says what to do.
			pk.log.Warn("etcd is out of space (its NOSPACE alarm is raised); writes wait until it is compacted, defragmented and the alarm disarmed (runbook: KvindexEtcdDBNearQuota)",
				"kind", kind.String(), "ops", b.n(), "err", err, "backoff", d)
		} else {
			pk.log.Warn("etcd transaction failed; retrying", "kind", kind.String(), "ops", b.n(), "err", err, "backoff", d)
		}
		if err := backoff.Sleep(ctx, bo.Clock, d); err != nil {
			return err
		}
	}
}

// tooBig reports an etcd refusal that no retry of the same transaction can
// overcome: too many operations, or a request over etcd's or gRPC's size
// limit. etcd also answers ResourceExhausted for states of its own that
// pass (a full database under the NOSPACE alarm, too many requests in
// flight): those are retried like any other failure.
func tooBig(err error) bool {
	switch {
	case isEtcdErr(err, rpctypes.ErrGRPCTooManyOps), isEtcdErr(err, rpctypes.ErrGRPCRequestTooLarge):
		return true
	case isEtcdErr(err, rpctypes.ErrGRPCNoSpace), isEtcdErr(err, rpctypes.ErrGRPCRequestTooManyRequests):
		return false
	}
	return status.Code(err) == codes.ResourceExhausted // gRPC's message size limits
}

// isEtcdErr reports whether err is etcd's gRPC error grpcErr (one of
// rpctypes.ErrGRPC...), as the server sent it, wrapped, or as the client
// converts it (rpctypes.Error).
func isEtcdErr(err, grpcErr error) bool {
	return errors.Is(err, grpcErr) || errors.Is(rpctypes.Error(err), rpctypes.Error(grpcErr))
}

// hookError carries Config.BeforeTxn's error: it aborts the ingester.
type hookError struct{ err error }

func (e *hookError) Error() string { return "ingester: BeforeTxn hook: " + e.err.Error() }
func (e *hookError) Unwrap() error { return e.err }
