package ingester

import (
	"context"
	"errors"
)

// commit writes the open window, in three steps that each have one owner:
// the window's range drops (writeDrops); the lease decisions of its puts
// and records (the lease manager's settle, the only step that waits on
// lease RPCs); then its block ops, packed without RPCs into transactions
// of at most MaxTxnOps ops and MaxTxnBytes bytes, and in a last
// transaction, sent once all the others have committed, the records of
// every endpoint the window touched and the partition's next offset
// (DESIGN "Writes"). Up to MaxTxnsInFlight of the block transactions are
// in flight at once: after coalescing they touch distinct keys, so their
// order does not change the result (docs/semantics.md, "Write order inside
// a window"). Until the last transaction commits, everything written is
// idempotent and replaying from the stored offset reproduces it.
func (w *worker) commit(ctx context.Context) error {
	if w.win.empty() && w.next == w.committed {
		w.win.records = 0
		return nil
	}
	w.window++
	if err := w.writeDrops(ctx); err != nil {
		return err
	}
	if w.win.empty() && w.next == w.committed {
		// Only drops (an expiry on a tick): nothing else to store.
		w.win.reset()
		return nil
	}
	ops := w.win.ops.ops
	if err := w.leases.settle(ctx, w.win.dirty, ops, w.window); err != nil {
		return err
	}
	i := 0
	for {
		w.b = w.idleBuilder()
		w.b.reset(w.claimRev)
		j, err := w.fill(ops, i)
		if err != nil {
			return w.abandon(err)
		}
		final := false
		if j == len(ops) {
			if final, err = w.addCommitPart(); err != nil {
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
		err = w.send(ctx, w.b, TxnCommit)
		if errors.Is(err, errLeaseGone) {
			if err := w.repairLeases(ctx); err != nil {
				return w.abandon(err)
			}
			continue // rebuild the same transaction with live leases
		}
		if err != nil {
			return err
		}
		w.afterTxn(w.b, ops[i:j])
		break
	}
	for _, ep := range w.win.dirty {
		if ep.gone {
			continue
		}
		base := ep.cur
		ep.base = &base
		ep.dirty = false
	}
	w.win.reset()
	w.committed = w.next
	if w.ap.tokenMode() {
		w.m.mapEntries.WithLabelValues(partitionLabel(w.p.Partition)).Set(float64(w.ap.maps.entries))
	}
	if w.hwm > 0 {
		w.m.lag.WithLabelValues(partitionLabel(w.p.Partition)).Set(float64(max(w.hwm-w.committed, 0)))
	}
	if w.onCommit != nil {
		w.onCommit(w.committed)
	}
	return nil
}

// repairLeases replaces the leases etcd no longer has (a transaction was
// refused for one) and settles the window's leases again, so the next
// transactions packed name live ones.
func (w *worker) repairLeases(ctx context.Context) error {
	if err := w.leases.repair(ctx, w.endpoints(), w.win); err != nil {
		return err
	}
	return w.leases.settle(ctx, w.win.dirty, w.win.ops.ops, w.window)
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
