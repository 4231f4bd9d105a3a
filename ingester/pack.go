package ingester

import (
	"fmt"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// maxTierLen is the longest tier segment ("disk") plus its slash, for size
// estimates.
const maxTierLen = 5

// The second part of the write path packs a written-out window into
// bounded transactions: fill and addCommitPart below, into the worker's
// builder w.b. Packing makes no RPC: every lease it names was settled by
// the lease manager first, so a lease problem can only show up when a
// transaction is sent (errLeaseGone), never while one is built.

// fill adds ops[i:] to the transaction being built until it is full and
// returns the index of the first op left out. A put of an endpoint whose
// record is not in etcd, or whose stored record does not list the current
// leases, brings a record put along (readers list endpoints/ before
// blocks/); one record put per transaction is enough, since the leases do
// not change while a window is packed.
func (w *worker) fill(ops []pendingOp, i int) (int, error) {
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
		if op.lease == 0 || ep.lease == 0 {
			return i, fmt.Errorf("ingester: packing a put of %s whose lease was not settled", ep.id.String())
		}
		_, inTxn := b.record(ep)
		needRec := !inTxn && (!ep.inEtcd || ep.leasesDirty())
		var rec []byte
		need, bytes := 1, keyLen+keyspace.EngineHashLen+txnOverhead
		if needRec {
			var err error
			if rec, err = w.marshalBase(ep); err != nil {
				return i, err
			}
			need++
			bytes += len(ep.key) + len(rec) + txnOverhead
			if !ep.inEtcd {
				need++
				bytes += len(ep.memberKey) + txnOverhead
			}
		}
		if b.n()+need > maxOps || b.bytes+bytes > maxBytes {
			return i, nil
		}
		if needRec {
			b.putRecord(ep, rec)
		}
		b.put(w.blockKey(ep, op.tier, op.hash), w.blockValue(op), op.lease)
		b.blockOps++
	}
	return i, nil
}

// blockValue builds a block put's value in the builder's arena: the engine
// hash in token mode (so a new owner can rebuild the map), empty in
// engine-hash mode.
func (w *worker) blockValue(op *pendingOp) []byte {
	if w.cfg.HashMode != keyspace.HashModeToken {
		return nil
	}
	start := len(w.b.arena)
	w.b.arena = keyspace.AppendEngineHash(w.b.arena, op.engine)
	return w.b.arena[start:len(w.b.arena):len(w.b.arena)]
}

// blockKey builds a block key in the builder's arena.
func (w *worker) blockKey(ep *endpoint, t tier.Tier, hash uint64) []byte {
	start := len(w.b.arena)
	w.b.arena = keyspace.AppendBlockKey(w.b.arena, ep.blocksPrefix, t, hash)
	return w.b.arena[start:len(w.b.arena):len(w.b.arena)]
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
// Alone in a transaction they always fit the op bound: a window touches at
// most maxDirty endpoints, two ops each (record and member key).
func (w *worker) addCommitPart() (bool, error) {
	b := w.b
	need, bytes := 1, len(w.offsetKey)+20+txnOverhead
	w.vals = w.vals[:0]
	for _, ep := range w.win.dirty {
		if ep.gone {
			w.vals = append(w.vals, nil)
			continue
		}
		if ep.lease == 0 {
			return false, fmt.Errorf("ingester: packing the record of %s whose lease was not settled", ep.id.String())
		}
		r := ep.record(&ep.cur, w.p)
		v, err := r.Marshal()
		if err != nil {
			return false, err
		}
		w.vals = append(w.vals, v)
		if k, ok := b.record(ep); ok {
			bytes += len(v) - b.recordLen(k)
		} else {
			need++
			bytes += len(ep.key) + len(v) + txnOverhead
			if !ep.inEtcd {
				need++
				bytes += len(ep.memberKey) + txnOverhead
			}
		}
	}
	if b.n() > 0 && (b.n()+need > w.cfg.MaxTxnOps || b.bytes+bytes > w.cfg.MaxTxnBytes) {
		return false, nil
	}
	for k, ep := range w.win.dirty {
		if ep.gone {
			continue
		}
		if r, ok := b.record(ep); ok {
			b.setRecord(r, w.vals[k])
		} else {
			b.putRecord(ep, w.vals[k])
		}
	}
	b.put(b.key(w.offsetKey), []byte(keyspace.FormatOffset(w.next)), 0)
	b.offset = w.next
	return true, nil
}
