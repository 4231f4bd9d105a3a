package ingester

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// maxTierLen is the longest tier segment ("disk") plus its slash, for size
// estimates.
const maxTierLen = 5

// commit writes the open window: its block ops in transactions of at most
// MaxTxnOps ops and MaxTxnBytes bytes, and in a last transaction, sent
// once all the others have committed, the records of every endpoint the
// window touched and the partition's next offset (DESIGN "Writes"). Up to
// MaxTxnsInFlight of the block transactions are in flight at once: after
// coalescing they touch distinct keys, so their order does not change the
// result (docs/semantics.md, "Write order inside a window"). Until the last
// transaction commits, everything written is idempotent and replaying from
// the stored offset reproduces it.
func (w *worker) commit(ctx context.Context) error {
	if w.ops.len() == 0 && len(w.dirty) == 0 && w.next == w.committed {
		w.windowRecords = 0
		return nil
	}
	w.window++
	ops := w.ops.ops
	i := 0
	for {
		w.b = w.idleBuilder()
		w.b.reset(w.claimRev)
		j, err := w.fill(ctx, ops, i)
		if err != nil {
			return w.abandon(err)
		}
		final := false
		if j == len(ops) {
			if final, err = w.addCommitPart(ctx); err != nil {
				return w.abandon(err)
			}
		}
		if !final {
			// A block transaction: launched without waiting for the
			// window's earlier ones.
			if w.b.n() > 0 {
				repaired, err := w.launch(ctx, ops, i, j)
				if err != nil {
					return err
				}
				if repaired {
					continue // rebuild it with live leases
				}
			}
			i = j
			continue
		}
		// The commit transaction goes out alone, after every block
		// transaction of the window has committed.
		repaired, err := w.land(ctx, ops)
		if err != nil {
			return err
		}
		if repaired {
			continue // leases were replaced: rebuild it with live ones
		}
		err = w.send(ctx, TxnCommit)
		if errors.Is(err, errLeaseGone) {
			if err := w.fixLeases(ctx); err != nil {
				return err
			}
			continue // rebuild the same transaction with live leases
		}
		if err != nil {
			return err
		}
		w.afterTxn(w.b, ops[i:j])
		break
	}
	for _, ep := range w.dirty {
		if ep.gone {
			continue
		}
		base := ep.cur
		ep.base = &base
		ep.dirty = false
	}
	w.dirty = w.dirty[:0]
	w.ops.reset()
	w.windowRecords = 0
	w.committed = w.next
	if w.tokenMode() {
		w.m.mapEntries.WithLabelValues(partitionLabel(w.p.Partition)).Set(float64(w.maps.entries))
	}
	if w.hwm > 0 {
		w.m.lag.WithLabelValues(partitionLabel(w.p.Partition)).Set(float64(max(w.hwm-w.committed, 0)))
	}
	if w.onCommit != nil {
		w.onCommit(w.committed)
	}
	return nil
}

// fill adds ops[i:] to the transaction being built until it is full and
// returns the index of the first op left out. A put of an endpoint whose
// record is not in etcd, or whose record does not list the put's lease,
// brings a record put along (readers list endpoints/ before blocks/).
func (w *worker) fill(ctx context.Context, ops []pendingOp, i int) (int, error) {
	b := w.b
	maxOps, maxBytes := w.cfg.MaxTxnOps, w.cfg.MaxTxnBytes
	for ; i < len(ops); i++ {
		op := &ops[i]
		if !op.live() {
			continue
		}
		ep := op.ep
		keyLen := len(ep.blocksPrefix) + maxTierLen + 16
		if op.del {
			if b.n()+1 > maxOps || b.bytes+keyLen+txnOverhead > maxBytes {
				return i, nil
			}
			b.del(w.blockKey(ep, op.tier, op.hash), nil)
			b.blockOps++
			continue
		}
		needRec := ep.recTxn != b.seq && (!ep.inEtcd || ep.leasesDirty() || (op.lease == 0 && w.rotates(ep, op.tier)))
		var rec []byte
		need, bytes := 1, keyLen+keyspace.EngineHashLen+txnOverhead
		if needRec {
			var err error
			if rec, err = w.marshalBase(ep); err != nil {
				return i, err
			}
			need++
			bytes += len(ep.key) + len(rec) + txnOverhead + 32 // the record may grow by a lease shard
		}
		if b.n()+need > maxOps || b.bytes+bytes > maxBytes {
			return i, nil
		}
		if ep.lease == 0 {
			id, err := w.grant(ctx)
			if err != nil {
				return i, err
			}
			ep.lease = id
			ep.leasesChanged()
		}
		if op.lease == 0 {
			id, err := w.assignLease(ctx, ep, op.tier)
			if err != nil {
				return i, err
			}
			op.lease = id
		}
		if needRec || (ep.recTxn == b.seq && ep.recGen != ep.leaseGen) {
			// (Re)write the record with the current leases.
			var err error
			if rec, err = w.marshalBase(ep); err != nil {
				return i, err
			}
			if ep.recTxn == b.seq {
				b.setRecord(ep, rec)
			} else {
				b.putRecord(ep, rec)
			}
		}
		b.put(w.blockKey(ep, op.tier, op.hash), w.blockValue(op), op.lease)
		b.blockOps++
	}
	return i, nil
}

// blockKey builds a block key in the builder's arena.
func (w *worker) blockKey(ep *endpoint, t tier.Tier, hash uint64) []byte {
	start := len(w.b.arena)
	w.b.arena = keyspace.AppendBlockKey(w.b.arena, ep.blocksPrefix, t, hash)
	return w.b.arena[start:len(w.b.arena):len(w.b.arena)]
}

// blockValue builds a block put's value in the builder's arena: the engine
// hash in token mode (so a new owner can rebuild the map), empty in
// engine-hash mode.
func (w *worker) blockValue(op *pendingOp) []byte {
	if !w.tokenMode() {
		return nil
	}
	start := len(w.b.arena)
	w.b.arena = keyspace.AppendEngineHash(w.b.arena, op.engine)
	return w.b.arena[start:len(w.b.arena):len(w.b.arena)]
}

// rotates reports whether a put to (ep, t) needs a new lease shard.
func (w *worker) rotates(ep *endpoint, t tier.Tier) bool {
	s := ep.tiers[t]
	return len(s) == 0 || s[len(s)-1].keys >= w.cfg.KeysPerLease
}

// marshalBase encodes the record a transaction other than the commit
// writes: the state as of the stored offset (or, for an endpoint that did
// not exist then, a zero last-record time, which makes a successor drop
// it before replaying) with the current leases.
func (w *worker) marshalBase(ep *endpoint) ([]byte, error) {
	var st seqState
	if ep.base != nil {
		st = *ep.base
	}
	r := ep.record(&st, w.p)
	return r.Marshal()
}

// addCommitPart adds the window's endpoint records and the next offset to
// the transaction being built, if they fit; it reports whether they did.
func (w *worker) addCommitPart(ctx context.Context) (bool, error) {
	b := w.b
	need, bytes := 1, len(w.offsetKey)+20+txnOverhead
	w.vals = w.vals[:0]
	for _, ep := range w.dirty {
		if ep.gone {
			w.vals = append(w.vals, nil)
			continue
		}
		if ep.lease == 0 {
			id, err := w.grant(ctx)
			if err != nil {
				return false, err
			}
			ep.lease = id
			ep.leasesChanged()
		}
		r := ep.record(&ep.cur, w.p)
		v, err := r.Marshal()
		if err != nil {
			return false, err
		}
		w.vals = append(w.vals, v)
		if ep.recTxn == b.seq {
			bytes += len(v) - len(b.puts[ep.recOp].Value)
		} else {
			need++
			bytes += len(ep.key) + len(v) + txnOverhead
		}
	}
	if b.n() > 0 && (b.n()+need > w.cfg.MaxTxnOps || b.bytes+bytes > w.cfg.MaxTxnBytes) {
		return false, nil
	}
	for k, ep := range w.dirty {
		if ep.gone {
			continue
		}
		if ep.recTxn == b.seq {
			b.setRecord(ep, w.vals[k])
		} else {
			b.putRecord(ep, w.vals[k])
		}
	}
	b.put(b.key(w.offsetKey), []byte(keyspace.FormatOffset(w.next)), 0)
	b.offset = w.next
	return true, nil
}

// afterTxn records what b's committed transaction, which carried ops, put
// in etcd. Two transactions of a window may carry copies of one endpoint's
// record, and the older copy may commit last; storedGen then runs ahead of
// etcd until the window's offset transaction, which rewrites the record of
// every endpoint the window touched after all the others have committed.
// A crash before it replays the window, which puts the window's keys again
// under leases the successor's records name.
func (w *worker) afterTxn(b *txnBuilder, ops []pendingOp) {
	for _, r := range b.recs {
		r.ep.inEtcd = true
		r.ep.storedGen = max(r.ep.storedGen, r.gen)
	}
	for k := range ops {
		if op := &ops[k]; op.live() && !op.del {
			op.ep.mayHaveBlocks = true
		}
	}
}

// assignLease picks the lease shard a new key of (ep, t) attaches to,
// starting a new shard once the last holds KeysPerLease keys (after
// counting what etcd really has attached: deletes do not decrement the
// counts, so churn would otherwise grow shards without bound).
func (w *worker) assignLease(ctx context.Context, ep *endpoint, t tier.Tier) (clientv3.LeaseID, error) {
	rotate := false
	if w.rotates(ep, t) && len(ep.tiers[t]) > 0 {
		if err := w.reconcile(ctx, ep, t); err != nil {
			return 0, err
		}
		// A shard still at least half full after the recount is closed
		// too: otherwise, with an endpoint's live keys near the bound (an
		// LRU cache churning at its capacity), every put would recount,
		// and a recount is a TimeToLive listing every attached key. So a
		// tier recounts at most once per KeysPerLease/2 puts.
		s := ep.tiers[t]
		rotate = len(s) > 0 && s[len(s)-1].keys >= (w.cfg.KeysPerLease+1)/2
	}
	if rotate || w.rotates(ep, t) {
		id, err := w.grant(ctx)
		if err != nil {
			return 0, err
		}
		ep.tiers[t] = append(ep.tiers[t], shard{id: id})
		ep.leasesChanged()
	}
	s := &ep.tiers[t][len(ep.tiers[t])-1]
	s.keys++
	if s.window != w.window {
		s.window, s.unsent = w.window, 0
	}
	s.unsent++
	return s.id, nil
}

// reconcile replaces the key counts of (ep, t)'s shards with what etcd has
// attached, and revokes the shards (but the last) that hold no key.
func (w *worker) reconcile(ctx context.Context, ep *endpoint, t tier.Tier) error {
	shards := ep.tiers[t]
	kept := shards[:0]
	for k, s := range shards {
		w.m.leaseRecounts.Inc()
		resp, err := w.etcd.TimeToLive(ctx, s.id, clientv3.WithAttachedKeys())
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			kept = append(kept, s) // keep the bound as it was
			continue
		}
		if resp.TTL <= 0 {
			w.keeper.remove(s.id)
			ep.leasesChanged()
			continue
		}
		real := len(resp.Keys)
		if s.window == w.window {
			// Keys of this window: some may be in etcd already (and so
			// counted twice), which only makes the shard rotate early.
			real += s.unsent
		}
		if real == 0 && k < len(shards)-1 {
			w.revoke(ctx, s.id)
			ep.leasesChanged()
			continue
		}
		s.keys = real
		kept = append(kept, s)
	}
	clear(shards[len(kept):])
	ep.tiers[t] = kept
	return nil
}

// grant grants a lease of LeaseTTL and keeps it alive.
func (w *worker) grant(ctx context.Context) (clientv3.LeaseID, error) {
	backoff := 20 * time.Millisecond
	for {
		resp, err := w.etcd.Grant(ctx, int64(w.cfg.LeaseTTL/time.Second))
		if err == nil {
			w.m.leaseGrants.Inc()
			w.keeper.add(resp.ID)
			return resp.ID, nil
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		w.log.Warn("granting a lease failed; retrying", "err", err)
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// fixLeases handles a transaction refused for a lease etcd no longer has
// (it expired: the ingester could not renew it for a TTL). Expired leases
// are forgotten; the writes that named them get fresh ones. The keys etcd
// deleted with them are lost (missed hits, never ghost hits).
func (w *worker) fixLeases(ctx context.Context) error {
	resp, err := w.etcd.Leases(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("ingester: listing leases after a lease-not-found error: %w", err)
	}
	live := make(map[clientv3.LeaseID]bool, len(resp.Leases))
	for _, l := range resp.Leases {
		live[l.ID] = true
	}
	dead := func(id clientv3.LeaseID) bool { return id != 0 && !live[id] }
	for _, ep := range w.eps {
		if dead(ep.lease) {
			w.m.leaseRegrants.Inc()
			w.keeper.remove(ep.lease)
			ep.lease = 0
			ep.inEtcd = false // the record went with its lease
			w.markDirty(ep)
		}
		for _, t := range tier.All {
			kept := ep.tiers[t][:0]
			for _, s := range ep.tiers[t] {
				if dead(s.id) {
					w.m.leaseRegrants.Inc()
					w.keeper.remove(s.id)
					ep.leasesChanged()
					continue
				}
				kept = append(kept, s)
			}
			ep.tiers[t] = kept
		}
	}
	for k := range w.ops.ops {
		if op := &w.ops.ops[k]; dead(op.lease) {
			op.lease = 0
		}
	}
	w.log.Warn("leases expired under this ingester; granted new ones")
	return nil
}
