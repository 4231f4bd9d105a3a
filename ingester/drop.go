package ingester

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/internal/backoff"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// writeDrops writes the window's range drops, in the order they were
// decided, before any of its block ops: a drop voided the ops of its
// endpoint queued before it, and the ones queued after it must land after
// it. Drops of different endpoints touch disjoint keys.
func (w *worker) writeDrops(ctx context.Context) error {
	for k := range w.win.drops {
		if err := w.writeDrop(ctx, w.win.drops[k]); err != nil {
			// Keep the ones not written: release hands their leases back.
			w.win.drops = slices.Delete(w.win.drops, 0, k)
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
	if !d.all {
		return w.writeTierDrop(ctx, d)
	}
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

// writeTierDrop writes a tier clear: the block keys of d.ep in each tier
// set in d.tiers, in guarded pages of at most DropPageSize keys. The
// record and the other tiers stay; each cleared tier keeps one (empty)
// lease shard.
func (w *worker) writeTierDrop(ctx context.Context, d dropOp) error {
	ep := d.ep
	for _, t := range tier.All {
		if !d.tiers[t] {
			continue
		}
		if ep.mayHaveBlocks {
			prefix := w.cfg.Keyspace.TierBlocksPrefix(ep.id, t)
			end := []byte(keyspace.RangeEnd(prefix))
			for {
				resp, err := w.rangeKeys(ctx, prefix, end)
				if err != nil {
					return err
				}
				if len(resp.Kvs) == 0 {
					break
				}
				b := w.b
				b.reset(w.claimRev)
				if resp.More {
					w.keyBuf = append(append(w.keyBuf[:0], resp.Kvs[len(resp.Kvs)-1].Key...), 0)
					b.del(b.key([]byte(prefix)), b.key(w.keyBuf))
				} else {
					b.del(b.key([]byte(prefix)), end)
				}
				if err := w.sendUnleased(ctx, TxnDrop); err != nil {
					return err
				}
				if !resp.More {
					break
				}
			}
		}
		if w.leases.emptiedTier(ctx, ep, t) {
			w.win.markDirty(ep)
		}
	}
	return nil
}

// rangeResponseBytes bounds the encoded size of one drop listing: half of
// gRPC's default 4 MiB receive limit, which the etcd client keeps. A page
// of 10,000 keys of an endpoint with long escaped names (an 89-character
// CJK model is 801 bytes escaped) is far over it.
const rangeResponseBytes = 2 << 20

// rangeKVOverhead bounds what a keys-only KeyValue costs in a
// RangeResponse beyond its key: its field tags, the key's length, and four
// varint revisions, versions and lease.
const rangeKVOverhead = 64

// blockKeySuffixMax bounds what a block key adds to its endpoint's prefix:
// the tier name, a slash and 16 hex digits.
const blockKeySuffixMax = 32

// dropPageKeys is how many keys one listing of ep's blocks asks for:
// DropPageSize, lowered so the response stays under rangeResponseBytes
// however long the endpoint's escaped names are.
func dropPageKeys(pageSize int, blocksPrefix string) int64 {
	perKey := len(blocksPrefix) + blockKeySuffixMax + rangeKVOverhead
	return int64(max(1, min(pageSize, rangeResponseBytes/perKey)))
}

// rangeKeys lists a page of keys of [prefix, end), keys only
// (dropPageKeys), retrying transient etcd errors until ctx ends. An error
// no retry fixes (permanentEtcdError) is counted, logged at ERROR and
// returned, which stops the ingester: retrying it would stall the
// partition forever behind one record.
func (w *worker) rangeKeys(ctx context.Context, prefix string, end []byte) (*pb.RangeResponse, error) {
	var resp *pb.RangeResponse
	var permanent error
	req := &pb.RangeRequest{Key: []byte(prefix), RangeEnd: end, Limit: dropPageKeys(w.cfg.DropPageSize, prefix), KeysOnly: true}
	err := backoff.Retry(ctx, w.backoff(), func(ctx context.Context) error {
		var err error
		resp, err = w.kv.Range(ctx, req)
		if err != nil && permanentEtcdError(err) {
			permanent = err
			return nil // stop retrying; reported below
		}
		return err
	}, func(err error, d time.Duration) {
		w.log.Warn("etcd range failed; retrying", "prefix", prefix, "err", err, "backoff", d)
	})
	if permanent != nil {
		w.m.etcdFailures.WithLabelValues("range").Inc()
		w.log.Error("etcd refused a drop listing; no retry can succeed", "prefix", prefix, "limit", req.Limit, "err", permanent)
		return nil, fmt.Errorf("ingester: listing the blocks under %q to drop them (page of %d keys): %w", prefix, req.Limit, permanent)
	}
	return resp, err
}

// permanentEtcdError reports an etcd (or gRPC) error that the same
// request cannot overcome by retrying: a size limit (tooBig), a malformed
// or unsupported request, or a refusal of permission. Everything else
// (no leader, timeouts, a restarting member, too many requests) is
// transient.
func permanentEtcdError(err error) bool {
	if errors.Is(rpctypes.Error(err), rpctypes.ErrTooManyRequests) {
		return false // etcd's apply backlog: RESOURCE_EXHAUSTED, but it passes
	}
	if tooBig(err) {
		return true
	}
	switch status.Code(err) {
	case codes.InvalidArgument, codes.OutOfRange, codes.Unimplemented, codes.PermissionDenied:
		return true
	}
	return false
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
