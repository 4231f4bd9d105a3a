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
	// vals are the encoded records of the last part.
	vals [][]byte
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
// after them (deletes of the records dropped with their endpoint). It
// returns TxnCommit when the records and the offset fitted too, else
// TxnPart and the first item left out.
func (pk *packer) pack(win *window, eps map[keyspace.Endpoint]*endpoint, pos int, next int64) (TxnKind, int, error) {
	b := pk.b
	b.reset(pk.claimRev)
	n := len(win.writes)
	i := pos
	for ; i < n; i++ {
		ok, err := pk.addChunk(&win.writes[i])
		if err != nil {
			return 0, 0, err
		}
		if !ok {
			break
		}
	}
	if i >= n {
		for ; i < n+len(win.dirty); i++ {
			if !pk.addRecordDelete(win.dirty[i-n], eps) {
				break
			}
		}
	}
	if i == n+len(win.dirty) {
		ok, err := pk.addLast(win, next)
		if err != nil {
			return 0, 0, err
		}
		if ok {
			return TxnCommit, i, nil
		}
	}
	if b.n() == 0 {
		return 0, 0, fmt.Errorf("ingester: one write of the window does not fit an empty transaction of %d ops, %d bytes", pk.cfg.MaxTxnOps, pk.cfg.MaxTxnBytes)
	}
	return TxnPart, i, nil
}

// addChunk adds wr's put or delete if it fits (with the record of its
// endpoint when that must come along) and reports whether it did.
func (pk *packer) addChunk(wr *chunkWrite) (bool, error) {
	b := pk.b
	ep := wr.ep
	keyLen := len(ep.chunksPrefix) + maxTierLen + 16
	if wr.c == nil {
		if b.n()+1 > pk.cfg.MaxTxnOps || b.bytes+keyLen+txnOverhead > pk.cfg.MaxTxnBytes {
			return false, nil
		}
		b.del(pk.chunkKey(wr), nil)
		b.chunkOps++
		return true, nil
	}
	if wr.c.lease == 0 || ep.lease == 0 {
		return false, fmt.Errorf("ingester: packing a chunk of %s whose lease was not settled", ep.id.String())
	}
	_, inTxn := b.record(ep)
	needRec := !inTxn && (!ep.inEtcd || ep.leasesDirty())
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
	b.put(pk.chunkKey(wr), pk.chunkValue(wr.c), wr.c.lease)
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

// chunkKey builds wr's chunk key in the builder's arena.
func (pk *packer) chunkKey(wr *chunkWrite) []byte {
	b := pk.b
	start := len(b.arena)
	b.arena = keyspace.AppendChunkKey(b.arena, wr.ep.chunksPrefix, wr.tier, wr.seq)
	return b.arena[start:len(b.arena):len(b.arena)]
}

// chunkValue encodes c's whole state in the builder's arena.
func (pk *packer) chunkValue(c *chunk) []byte {
	b := pk.b
	start := len(b.arena)
	b.arena = keyspace.AppendChunkValue(b.arena, c.entries, pk.withEngine)
	return b.arena[start:len(b.arena):len(b.arena)]
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
	r := ep.record(&st, &ep.baseNext, pk.p)
	return r.Marshal()
}

// addLast adds the window's endpoint records and the next offset to the
// transaction being built, if they fit; it reports whether they did.
// Alone in a transaction they always fit the op bound: a window touches at
// most maxDirty endpoints, two ops each (record and member key).
func (pk *packer) addLast(win *window, next int64) (bool, error) {
	b := pk.b
	need, bytes := 1, len(pk.offsetKey)+20+txnOverhead
	pk.vals = pk.vals[:0]
	for _, ep := range win.dirty {
		if ep.gone {
			pk.vals = append(pk.vals, nil)
			continue
		}
		if ep.lease == 0 {
			return false, fmt.Errorf("ingester: packing the record of %s whose lease was not settled", ep.id.String())
		}
		chunkNext := ep.chunkNext()
		r := ep.record(&ep.cur, &chunkNext, pk.p)
		v, err := r.Marshal()
		if err != nil {
			return false, err
		}
		pk.vals = append(pk.vals, v)
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
	if b.n() > 0 && (b.n()+need > pk.cfg.MaxTxnOps || b.bytes+bytes > pk.cfg.MaxTxnBytes) {
		return false, nil
	}
	for k, ep := range win.dirty {
		if ep.gone {
			continue
		}
		if r, ok := b.record(ep); ok {
			b.setRecord(r, pk.vals[k])
		} else {
			b.putRecord(ep, pk.vals[k])
		}
	}
	b.put(b.key(pk.offsetKey), []byte(keyspace.FormatOffset(next)), 0)
	b.offset = next
	return true, nil
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
