package ingester

import (
	"context"
	"errors"
	"fmt"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/kvindex/kvindex/internal/backoff"
)

// minTxnOps is the smallest MaxTxnOps Validate accepts: a commit
// transaction needs room for an endpoint record, its member key and the
// offset, and a few block ops beside them.
const minTxnOps = 8

// etcdDefaultMaxTxnOps is etcd's --max-txn-ops when nobody raised it.
const etcdDefaultMaxTxnOps = 128

// errEtcdTxnLimit reports an etcd that refuses even minTxnOps operations
// per transaction.
var errEtcdTxnLimit = errors.New("ingester: etcd accepts fewer operations per transaction than the ingester needs")

// etcdTxnLimit returns the most operations per transaction etcd accepts,
// up to want (etcd's --max-txn-ops; it has no API that reports it). It
// asks with read-only probes: a transaction of n range reads of key under
// a compare that never holds. etcd checks the op count against its limit
// before anything else; a read-only transaction adds no entry to the raft
// log, and with the compare false its range reads are not run. want is
// tried first, so an etcd that takes it costs one probe; then etcd's
// default (128) and one more, which settle an untuned etcd; otherwise a
// bisection takes at most log2(want) more. It returns errEtcdTxnLimit
// when etcd refuses minTxnOps, or the first error that is not a refusal
// for size (the caller retries those).
func etcdTxnLimit(ctx context.Context, kv pb.KVClient, key []byte, want int) (int, error) {
	accepts := func(n int) (bool, error) {
		ops := make([]*pb.RequestOp, n)
		for i := range ops {
			ops[i] = &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: key, CountOnly: true}}}
		}
		// A version is never negative: the compare fails, and the empty
		// failure branch runs.
		never := &pb.Compare{Target: pb.Compare_VERSION, Result: pb.Compare_LESS, Key: key, TargetUnion: &pb.Compare_Version{Version: 0}}
		_, err := kv.Txn(ctx, &pb.TxnRequest{Compare: []*pb.Compare{never}, Success: ops})
		switch {
		case err == nil:
			return true, nil
		case errors.Is(rpctypes.Error(err), rpctypes.ErrTooManyOps):
			return false, nil
		default:
			return false, err
		}
	}
	// lo is the largest size known to be accepted (0: none yet), hi the
	// smallest known to be refused. want comes first, then etcd's default
	// and one more (what an etcd nobody tuned takes), then the least the
	// ingester needs; sizes the earlier answers settle are skipped.
	lo, hi := 0, want+1
	try := func(n int) error {
		ok, err := accepts(n)
		if err == nil {
			if ok {
				lo = n
			} else {
				hi = n
			}
		}
		return err
	}
	for _, n := range []int{want, etcdDefaultMaxTxnOps, etcdDefaultMaxTxnOps + 1, minTxnOps} {
		if n > lo && n < hi {
			if err := try(n); err != nil {
				return 0, err
			}
		}
	}
	if lo == 0 {
		return 0, fmt.Errorf("%w: it refuses %d (raise etcd's --max-txn-ops)", errEtcdTxnLimit, minTxnOps)
	}
	for hi-lo > 1 {
		if err := try(lo + (hi-lo)/2); err != nil {
			return 0, err
		}
	}
	return lo, nil
}

// sizeTxns lowers cfg.MaxTxnOps to what etcd accepts, before any worker
// builds a transaction, retrying etcd errors until ctx ends. A lowered
// bound is logged once at WARN: the ingester then writes more, smaller
// transactions than it was configured for.
func (in *Ingester) sizeTxns(ctx context.Context) error {
	want := in.cfg.MaxTxnOps
	key := []byte(in.cfg.Keyspace.OffsetsPrefix())
	var got int
	var refused error // etcd takes fewer than minTxnOps: no retry helps
	err := backoff.Retry(ctx, backoff.New(20*time.Millisecond, time.Second, nil), func(ctx context.Context) error {
		n, err := etcdTxnLimit(ctx, in.kv, key, want)
		if errors.Is(err, errEtcdTxnLimit) {
			refused = err
			return nil
		}
		got = n
		return err
	}, func(err error, delay time.Duration) {
		in.log.Warn("asking etcd how many operations a transaction may hold failed; retrying", "err", err, "backoff", delay)
	})
	if err != nil {
		return fmt.Errorf("ingester: sizing transactions: %w", err)
	}
	if refused != nil {
		return refused
	}
	if got < want {
		in.log.Warn("etcd accepts fewer operations per transaction than --max-txn-ops; writing smaller transactions (raise etcd's --max-txn-ops to match)",
			"max_txn_ops", want, "etcd_accepts", got)
	} else {
		in.log.Info("transactions sized", "max_txn_ops", got)
	}
	in.cfg.MaxTxnOps = got
	in.m.txnOpsWanted.Set(float64(want))
	in.m.txnOpsLimit.Set(float64(got))
	return nil
}
