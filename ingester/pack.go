package ingester

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/kvindex/kvindex/internal/keyspace"
)

// maxTierLen is the longest tier segment ("disk") plus its slash, for size
// estimates.
const maxTierLen = 5

// packer is the second part of the write path: it writes a window in one
// fenced transaction (DESIGN "Writes (ingester)"), split into parts only
// past etcd's accepted op count (Config.MaxTxnOps, lowered at start to
// what etcd accepts) or Config.MaxTxnBytes. A window's ops go in this
// order: its chunk writes (each chunk once, at its final state: a put of
// the whole value, or a delete), the deletes of the records of endpoints
// dropped with them, then, always together in the last transaction, the
// records of every endpoint the window touched and the partition's next
// offset. A part before the last carries, with the first chunk put of an
// endpoint whose record etcd may lack or names other leases, that record
// as of the stored offset (readers meet a record before its chunks).
//
// Packing makes no RPC: the lease manager settles every lease first. The
// one loop that sends (write) also repairs: a transaction refused because
// a lease expired makes the lease manager replace the expired leases,
// settle again, and the packer rebuild the refused part from its start.
type packer struct {
	cfg    *Config
	log    *slog.Logger
	m      *metrics
	kv     pb.KVClient
	leases *leaseManager
	// p is the partition the packer writes.
	p keyspace.Partition
	b *txnBuilder

	claimRev  int64
	offsetKey []byte
	// withEngine: chunk values carry engine hashes (token mode).
	withEngine bool
}

// write writes win, whose records end before offset next, window number
// windowNo, and returns nil once its last transaction (the one storing
// next) has committed: ErrFenced when the guard failed, the BeforeTxn
// hook's error, a transaction etcd refused for its size, or ctx's error
// otherwise. eps are the partition's endpoints (for lease repair and to
// tell a forgotten endpoint from its successor).
func (pk *packer) write(ctx context.Context, win *window, eps map[keyspace.Endpoint]*endpoint, next int64, windowNo uint64) error {
	pos := 0 // the window's items before pos are in etcd
	for {
		err := pk.leases.settle(ctx, win, windowNo)
		for err == nil {
			kind, end, perr := pk.pack(win, eps, pos, next)
			if perr != nil {
				return perr
			}
			if err = pk.send(ctx, kind); err == nil {
				pk.landed()
				if kind == TxnCommit {
					return nil
				}
				pos = end
			}
		}
		if !errors.Is(err, errLeaseGone) {
			return err
		}
		all := make([]*endpoint, 0, len(eps))
		for _, ep := range eps {
			all = append(all, ep)
		}
		if err := pk.leases.repair(ctx, all, win); err != nil {
			return err
		}
	}
}

// pack builds the next transaction of win from item pos on: the window's
// chunk writes are items 0..len(writes)-1, its dirty endpoints the items
// after them (deletes of the records dropped with their endpoint). When
// the rest of the window fits one transaction it builds the last one,
// records and offset first, and returns TxnCommit; else a part of what
// fits without them, TxnPart and the first item left out.
func (pk *packer) pack(win *window, eps map[keyspace.Endpoint]*endpoint, pos int, next int64) (TxnKind, int, error) {
	b := pk.b
	n := len(win.writes)
	if pk.lastOps(win, eps, pos) <= pk.cfg.MaxTxnOps {
		b.reset(pk.claimRev)
		if err := pk.addLast(win, next); err != nil {
			return 0, 0, err
		}
		if end, err := pk.addItems(win, eps, pos, true); err != nil || end == n+len(win.dirty) {
			return TxnCommit, end, err
		}
	}
	b.reset(pk.claimRev)
	if pos == n+len(win.dirty) {
		// Only the records are left, and they are more than one
		// transaction holds: windows are bounded by maxDirty, so this is
		// a bug, reported instead of overrunning the builder.
		ops := 1 // the offset
		for _, ep := range win.dirty {
			ops += recordPutOps(ep) // a gone one's deletes went in the parts
		}
		if ops > pk.cfg.MaxTxnOps {
			return 0, 0, fmt.Errorf("ingester: the window's last transaction needs %d ops, past MaxTxnOps %d (more endpoints than maxDirty)", ops, pk.cfg.MaxTxnOps)
		}
		return TxnCommit, pos, pk.addLast(win, next)
	}
	end, err := pk.addItems(win, eps, pos, false)
	if err == nil && b.n() == 0 {
		err = fmt.Errorf("ingester: one write of the window does not fit an empty transaction of %d ops, %d bytes", pk.cfg.MaxTxnOps, pk.cfg.MaxTxnBytes)
	}
	return TxnPart, end, err
}

// lastOps counts the ops of the window's items from pos on and of its
// last part's records and offset.
func (pk *packer) lastOps(win *window, eps map[keyspace.Endpoint]*endpoint, pos int) int {
	ops := len(win.writes) - min(pos, len(win.writes)) + 1
	for _, ep := range win.dirty {
		ops += recordPutOps(ep)
		if ep.gone && ep.inEtcd && eps[ep.id] == nil {
			ops += 2 // the deletes of its record and member key
		}
	}
	return ops
}

// recordPutOps is the ops the last transaction spends on ep's record
// (addLast): the record, with its member key when etcd may not have it;
// none for an endpoint dropped with its record.
func recordPutOps(ep *endpoint) int {
	switch {
	case ep.gone:
		return 0
	case !ep.inEtcd:
		return 2
	}
	return 1
}

// addItems adds the window's items from pos on while they fit and returns
// the first one left out. In the last part (last) the records are in the
// transaction already.
func (pk *packer) addItems(win *window, eps map[keyspace.Endpoint]*endpoint, pos int, last bool) (int, error) {
	n := len(win.writes)
	i := pos
	for ; i < n; i++ {
		ok, err := pk.addChunk(&win.writes[i], last)
		if err != nil || !ok {
			return i, err
		}
	}
	for ; i < n+len(win.dirty); i++ {
		if ep := win.dirty[i-n]; ep.gone && !pk.addRecordDelete(ep, eps) {
			return i, nil
		}
	}
	return i, nil
}

// addChunk adds wr's put or delete if it fits (outside the last part,
// with the record of its endpoint when that must come along) and reports
// whether it did.
func (pk *packer) addChunk(wr *chunkWrite, last bool) (bool, error) {
	b := pk.b
	ep := wr.ep
	keyLen := len(ep.chunksPrefix) + maxTierLen + 16
	if wr.c == nil {
		if b.n()+1 > pk.cfg.MaxTxnOps || b.bytes+keyLen+txnOverhead > pk.cfg.MaxTxnBytes {
			return false, nil
		}
		start := len(b.arena)
		b.arena = keyspace.AppendChunkKey(b.arena, ep.chunksPrefix, wr.tier, wr.seq)
		b.del(b.arena[start:len(b.arena):len(b.arena)], nil)
		b.chunkOps++
		return true, nil
	}
	if wr.c.lease == 0 || ep.lease == 0 {
		return false, fmt.Errorf("ingester: packing a chunk of %s whose lease was not settled", ep.id.String())
	}
	needRec := false
	if !last && (ep.pred == nil || !ep.pred.inEtcd) {
		// (With a predecessor's record in etcd a record exists: it stays
		// as of the stored offset until the last part.)
		_, inTxn := b.record(ep)
		needRec = !inTxn && (!ep.inEtcd || ep.leasesDirty())
	}
	var rec []byte
	need, bytes := 1, keyLen+keyspace.ChunkValueLen(len(wr.c.entries), pk.withEngine)+txnOverhead
	if needRec {
		var err error
		if rec, err = pk.marshalBase(ep); err != nil {
			return false, err
		}
		need++
		bytes += len(ep.key) + len(rec) + txnOverhead
		if !ep.inEtcd {
			need++
			bytes += len(ep.memberKey) + txnOverhead
		}
	}
	if b.n()+need > pk.cfg.MaxTxnOps || b.bytes+bytes > pk.cfg.MaxTxnBytes {
		return false, nil
	}
	if needRec {
		b.putRecord(ep, rec)
	}
	start := len(b.arena)
	b.arena = keyspace.AppendChunkKey(b.arena, ep.chunksPrefix, wr.tier, wr.seq)
	key := b.arena[start:len(b.arena):len(b.arena)]
	start = len(b.arena)
	b.arena = keyspace.AppendChunkValue(b.arena, wr.c.entries, pk.withEngine)
	b.put(key, b.arena[start:len(b.arena):len(b.arena)], wr.c.lease)
	b.chunkOps++
	return true, nil
}

// addRecordDelete adds the deletes of ep's record and member key when ep
// was dropped with its record and etcd has it, if they fit, and reports
// whether nothing is left to add. A successor object of the same
// endpoint (a record of it came after the drop) puts the record instead.
func (pk *packer) addRecordDelete(ep *endpoint, eps map[keyspace.Endpoint]*endpoint) bool {
	if !ep.gone || !ep.inEtcd || eps[ep.id] != nil {
		return true
	}
	b := pk.b
	if b.n()+2 > pk.cfg.MaxTxnOps || b.bytes+len(ep.key)+len(ep.memberKey)+2*txnOverhead > pk.cfg.MaxTxnBytes {
		return false
	}
	b.del(b.key([]byte(ep.key)), nil)
	b.del(b.key([]byte(ep.memberKey)), nil)
	b.recDels = append(b.recDels, ep)
	return true
}

// marshalBase encodes the record a part before the last writes: the state
// as of the stored offset (or, for an endpoint that did not exist then, a
// zero last-record time, which makes a successor drop it before
// replaying) with the current leases.
func (pk *packer) marshalBase(ep *endpoint) ([]byte, error) {
	var st seqState
	if ep.base != nil {
		st = *ep.base
	}
	r := ep.record(&st, false, pk.p)
	return r.Marshal()
}

// addLast adds the window's endpoint records, with their member keys for
// endpoints new to etcd, and the next offset to the transaction being
// built, which must be empty. Alone in a transaction they always fit the
// op bound: a window touches at most maxDirty endpoints, two ops each.
func (pk *packer) addLast(win *window, next int64) error {
	b := pk.b
	for _, ep := range win.dirty {
		if ep.gone {
			continue
		}
		if ep.lease == 0 {
			return fmt.Errorf("ingester: packing the record of %s whose lease was not settled", ep.id.String())
		}
		r := ep.record(&ep.cur, true, pk.p)
		v, err := r.Marshal()
		if err != nil {
			return err
		}
		b.putRecord(ep, v)
	}
	b.put(b.key(pk.offsetKey), []byte(keyspace.FormatOffset(next)), 0)
	b.offset = next
	return nil
}

// landed records what the builder's committed transaction wrote: the
// records it put are in etcd with the leases they were written with, the
// ones it deleted are not.
func (pk *packer) landed() {
	for _, r := range pk.b.recs {
		r.ep.inEtcd = true
		r.ep.storedGen = r.gen
	}
	for _, ep := range pk.b.recDels {
		ep.inEtcd = false
	}
}
