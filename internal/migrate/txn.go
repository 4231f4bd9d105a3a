package migrate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// batcher packs writes, in the order they are given, into transactions of
// at most maxOps operations (the guards included) and about maxBytes of
// keys and values, each guarded by the absence of every ingesters/ key
// under both prefixes. Order matters: an endpoint's record is given
// before its chunks and deleted after them, so a reader never sees a
// chunk without its record.
type batcher struct {
	kv       clientv3.KV
	guards   []clientv3.Cmp
	maxOps   int
	maxBytes int
	dry      bool
	log      *slog.Logger

	ops   []clientv3.Op
	bytes int
	// txns, puts and deletes count what was sent (or, dry, would be);
	// committed the transactions etcd applied.
	txns, puts, deletes, committed int
	// timeout bounds each transaction (Config.CallTimeout).
	timeout time.Duration
}

// opOverhead is what an operation costs in a request beside its key and
// value (field tags, lengths, the lease), for the byte bound.
const opOverhead = 16

func (b *batcher) put(ctx context.Context, key, value string, lease clientv3.LeaseID) error {
	var opts []clientv3.OpOption
	if lease != 0 {
		opts = append(opts, clientv3.WithLease(lease))
	}
	b.puts++
	return b.add(ctx, clientv3.OpPut(key, value, opts...), len(key)+len(value))
}

func (b *batcher) del(ctx context.Context, key string) error {
	b.deletes++
	return b.add(ctx, clientv3.OpDelete(key), len(key))
}

func (b *batcher) add(ctx context.Context, op clientv3.Op, size int) error {
	size += opOverhead
	if len(b.ops) > 0 && (len(b.ops)+len(b.guards) >= b.maxOps || b.bytes+size > b.maxBytes) {
		if err := b.flush(ctx); err != nil {
			return err
		}
	}
	b.ops = append(b.ops, op)
	b.bytes += size
	return nil
}

// flush sends the pending operations as one guarded transaction.
func (b *batcher) flush(ctx context.Context) error {
	if len(b.ops) == 0 {
		return nil
	}
	n := len(b.ops)
	b.txns++
	if !b.dry {
		cctx, cancel := call(ctx, b.timeout)
		resp, err := b.kv.Txn(cctx).If(b.guards...).Then(b.ops...).Commit()
		cancel()
		switch e := rpctypes.Error(err); {
		case err == nil && !resp.Succeeded:
			return fmt.Errorf("%w: an ingesters/ key appeared during the migration (transaction %d refused)", ErrIngesterAlive, b.txns)
		case errors.Is(e, rpctypes.ErrLeaseNotFound):
			return fmt.Errorf("%w: %v", errLeaseGone, err)
		case errors.Is(e, rpctypes.ErrTooManyOps), errors.Is(e, rpctypes.ErrRequestTooLarge):
			return fmt.Errorf("%w (%d operations, about %d bytes): lower --max-txn-ops or --max-txn-bytes: %v", ErrTxnTooBig, n+len(b.guards), b.bytes, err)
		case err != nil:
			return fmt.Errorf("migrate: transaction %d: %w", b.txns, err)
		}
		b.committed++
		b.log.Debug("transaction committed", "txn", b.txns, "ops", n, "bytes", b.bytes, "revision", resp.Header.Revision)
	}
	b.ops, b.bytes = b.ops[:0], 0
	return nil
}
