package ingester

import (
	"context"
	"errors"
	"fmt"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/kvindex/kvindex/internal/backoff"
	"github.com/kvindex/kvindex/internal/keyspace"
)

// writeDrops writes the window's range drops, in the order they were
// decided, before any of its block ops: a drop voided the ops of its
// endpoint queued before it, and the ones queued after it must land after
// it. Drops of different endpoints touch disjoint keys.
func (w *worker) writeDrops(ctx context.Context) error {
	for k := range w.win.drops {
		if err := w.writeDrop(ctx, w.win.drops[k]); err != nil {
			return err
		}
	}
	clear(w.win.drops)
	w.win.drops = w.win.drops[:0]
	return nil
}

// writeDrop deletes every block key of d.ep in guarded pages of at most
// DropPageSize keys; with deleteRecord it also deletes the endpoint record
// and its member key in the last page. Then the lease manager settles what
// the drop emptied: shards beyond one per tier (or, with the record, every
// lease of the endpoint) are revoked.
func (w *worker) writeDrop(ctx context.Context, d dropOp) error {
	ep := d.ep
	end := []byte(keyspace.RangeEnd(ep.blocksPrefix))
	for {
		all := true
		var last []byte
		hasKeys := false
		if ep.mayHaveBlocks {
			resp, err := w.rangeKeys(ctx, ep.blocksPrefix, end)
			if err != nil {
				return err
			}
			if len(resp.Kvs) > 0 {
				hasKeys = true
				if resp.More {
					all = false
					last = resp.Kvs[len(resp.Kvs)-1].Key
				}
			}
		}
		b := w.b
		b.reset(w.claimRev)
		if hasKeys {
			if all {
				b.del(b.key([]byte(ep.blocksPrefix)), end)
			} else {
				w.keyBuf = append(append(w.keyBuf[:0], last...), 0)
				b.del(b.key([]byte(ep.blocksPrefix)), b.key(w.keyBuf))
			}
		}
		if all && d.deleteRecord && ep.inEtcd {
			b.del(b.key([]byte(ep.key)), nil)
			b.del(b.key([]byte(ep.memberKey)), nil)
		}
		if b.n() > 0 {
			if err := w.sendUnleased(ctx, TxnDrop); err != nil {
				return err
			}
		}
		if all {
			break
		}
	}
	ep.mayHaveBlocks = false
	if !d.deleteRecord {
		if w.leases.emptied(ctx, ep) {
			w.win.markDirty(ep)
		}
		return nil
	}
	ep.inEtcd = false
	w.leases.forget(ctx, ep)
	return nil
}

// rangeKeys lists up to DropPageSize keys of [prefix, end), keys only,
// retrying etcd errors until ctx ends.
func (w *worker) rangeKeys(ctx context.Context, prefix string, end []byte) (*pb.RangeResponse, error) {
	var resp *pb.RangeResponse
	err := backoff.Retry(ctx, w.backoff(), func(ctx context.Context) error {
		var err error
		resp, err = w.kv.Range(ctx, &pb.RangeRequest{Key: []byte(prefix), RangeEnd: end, Limit: int64(w.cfg.DropPageSize), KeysOnly: true})
		return err
	}, func(err error, d time.Duration) {
		w.log.Warn("etcd range failed; retrying", "prefix", prefix, "err", err, "backoff", d)
	})
	return resp, err
}

// sendUnleased sends a transaction that attaches no lease (drops, resets):
// errLeaseGone cannot happen, and would be a bug.
func (w *worker) sendUnleased(ctx context.Context, kind TxnKind) error {
	err := w.send(ctx, w.b, kind)
	if errors.Is(err, errLeaseGone) {
		return fmt.Errorf("ingester: %s transaction reported a missing lease: %w", kind, err)
	}
	return err
}
