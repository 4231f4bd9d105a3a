package ingester

import (
	"context"
	"errors"
	"slices"
)

// flight is one block transaction of the open window, sent without waiting
// for the window's earlier ones. Its goroutine sets err and closes done;
// the worker reads the outcome only after done is closed.
type flight struct {
	b *txnBuilder
	// from and to delimit the window's ops it carries.
	from, to int
	err      error
	done     chan struct{}
}

// idleBuilder returns the builder to fill next: w.b when it is not in
// flight, else an idle one from the pool, else a new one. The pool holds
// at most MaxTxnsInFlight+1 builders.
func (w *worker) idleBuilder() *txnBuilder {
	if w.b != nil {
		return w.b
	}
	if n := len(w.idle); n > 0 {
		b := w.idle[n-1]
		w.idle = w.idle[:n-1]
		return b
	}
	return newTxnBuilder(w.cfg.MaxTxnOps, w.ownerKey)
}

// launch sends w.b's block transaction, which carries ops[from:to], in a
// goroutine of its own, once fewer than MaxTxnsInFlight are in flight. If a
// transaction launched earlier failed, it launches nothing: it lands every
// flight and returns land's result, and when that is repaired the caller
// rebuilds w.b's transaction (its leases may be gone).
func (w *worker) launch(ctx context.Context, ops []pendingOp, from, to int) (repaired bool, err error) {
	for len(w.flights) >= w.cfg.MaxTxnsInFlight {
		w.landOldest(ops)
	}
	if len(w.failed) > 0 {
		return w.land(ctx, ops)
	}
	b := w.b
	if err := w.beforeTxn(ctx, b, TxnBlocks); err != nil {
		return false, w.abandon(err)
	}
	f := &flight{b: b, from: from, to: to, done: make(chan struct{})}
	w.flights = append(w.flights, f)
	w.b = nil
	go func() {
		defer close(f.done)
		f.err = w.exec(ctx, b, TxnBlocks)
	}()
	return false, nil
}

// landOldest waits for the oldest flight and records its outcome: a
// committed transaction updates what the worker knows of etcd (afterTxn),
// a failed one is kept in w.failed for land.
func (w *worker) landOldest(ops []pendingOp) {
	f := w.flights[0]
	<-f.done
	w.flights = slices.Delete(w.flights, 0, 1)
	if f.err == nil {
		w.afterTxn(f.b, ops[f.from:f.to])
	} else {
		w.failed = append(w.failed, f)
	}
	w.idle = append(w.idle, f.b)
	f.b = nil
}

// land waits for every flight of the window. When all committed it reports
// false. When some failed only because a lease expired, it replaces the
// expired leases (repairLeases), sends the failed ranges again one
// transaction at a time, and reports true (any transaction built
// meanwhile names leases that may be gone and must be rebuilt). Any other failure (fenced, too big, the
// hook, ctx) is returned.
func (w *worker) land(ctx context.Context, ops []pendingOp) (repaired bool, err error) {
	for len(w.flights) > 0 {
		w.landOldest(ops)
	}
	if len(w.failed) == 0 {
		return false, nil
	}
	failed := w.failed
	w.failed = nil
	for _, f := range failed {
		if !errors.Is(f.err, errLeaseGone) {
			return false, f.err
		}
	}
	if err := w.repairLeases(ctx); err != nil {
		return false, err
	}
	for _, f := range failed {
		if err := w.resend(ctx, ops, f.from, f.to); err != nil {
			return false, err
		}
	}
	return true, nil
}

// resend writes ops[from:to] again, one transaction at a time, repairing
// leases that expire meanwhile.
func (w *worker) resend(ctx context.Context, ops []pendingOp, from, to int) error {
	for i := from; i < to; {
		w.b = w.idleBuilder()
		w.b.reset(w.claimRev)
		j, err := w.fill(ops[:to], i)
		if err != nil {
			return err
		}
		if w.b.n() > 0 {
			err = w.send(ctx, w.b, TxnBlocks)
			if errors.Is(err, errLeaseGone) {
				if err := w.repairLeases(ctx); err != nil {
					return err
				}
				continue
			}
			if err != nil {
				return err
			}
			w.afterTxn(w.b, ops[i:j])
		}
		i = j
	}
	return nil
}

// abandon waits for every flight, discarding their outcomes, and returns
// err: the worker is stopping, and a successor replays the window.
func (w *worker) abandon(err error) error {
	for _, f := range w.flights {
		<-f.done
		w.idle = append(w.idle, f.b)
	}
	clear(w.flights)
	w.flights = w.flights[:0]
	w.failed = nil
	if w.b == nil {
		w.b = w.idleBuilder()
	}
	return err
}
