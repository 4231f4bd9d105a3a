package ingester

import (
	"time"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// window is what the apply part has made of the records since the last
// commit, waiting to be written: every chunk a chunk-rule step changed
// (each once, at its final state), the drops whose leases the lease
// manager settles, and the endpoints whose records change. The apply part
// fills it without I/O; commit writes it in one fenced transaction (split
// only past etcd's bounds) and resets it.
type window struct {
	// writes are the chunks the window changed, in the order first
	// changed; idx finds a chunk's write.
	writes []chunkWrite
	idx    map[chunkRef]int32
	// drops are the drops of the window in the order they were decided,
	// at most one per endpoint object (see drop).
	drops []dropOp
	// dirty are the endpoints whose records the window writes (or, for
	// one dropped with its record, deletes), in the order first touched.
	dirty []*endpoint
	// records counts the records applied into the window, blockOps the
	// block stores and removals applied.
	records  int
	blockOps int
	// oldest is the earliest Kafka timestamp of the window's records
	// (zero while it has none): the window's linger counts from it.
	oldest time.Time
}

// chunkRef names one chunk key: an endpoint (by identity: a forgotten
// endpoint and its successor of the same identity share their keys), a
// tier and a sequence number.
type chunkRef struct {
	id   keyspace.Endpoint
	tier tier.Tier
	seq  uint64
}

// chunkWrite is one chunk key's write in a window: a put of c's entries on
// c.lease, or a delete when c is nil. ep is the endpoint object that
// changed it last.
type chunkWrite struct {
	ep   *endpoint
	tier tier.Tier
	seq  uint64
	c    *chunk
}

// dropOp is a drop of one endpoint's chunks, for the lease manager: with
// all, every tier (and with deleteRecord its record and member key too:
// goodbye, expiry, reset, stale), else the tiers set in tiers (tier
// clears). The chunk deletes themselves are in the window's writes.
type dropOp struct {
	ep           *endpoint
	deleteRecord bool
	all          bool
	tiers        [tier.Count + 1]bool
}

func newWindow() *window { return &window{idx: make(map[chunkRef]int32, 256)} }

// empty reports whether the window holds nothing to write.
func (w *window) empty() bool {
	return len(w.writes) == 0 && len(w.drops) == 0 && len(w.dirty) == 0
}

// chunkChanged records chunk seq of (ep, t) at its state c (nil:
// deleted); the last state of a chunk in the window is the one written.
// A changed chunk makes its endpoint's record part of the window, so a
// record is in etcd whenever its chunks are.
func (w *window) chunkChanged(ep *endpoint, t tier.Tier, seq uint64, c *chunk) {
	// Appends fill one chunk after another, so the endpoint's last write
	// in t is most often this chunk's: checked, it spares hashing the
	// chunk's name into idx. A chunk has one write per window, so a write
	// of this endpoint object, tier and seq is this chunk's.
	if i := ep.lastWrite[t]; int(i) < len(w.writes) {
		if cw := &w.writes[i]; cw.ep == ep && cw.tier == t && cw.seq == seq {
			cw.c = c
			if c != nil {
				w.markDirty(ep)
			}
			return
		}
	}
	ref := chunkRef{id: ep.id, tier: t, seq: seq}
	i, ok := w.idx[ref]
	if ok {
		w.writes[i].ep, w.writes[i].c = ep, c
	} else {
		i = int32(len(w.writes))
		w.idx[ref] = i
		w.writes = append(w.writes, chunkWrite{ep: ep, tier: t, seq: seq, c: c})
	}
	ep.lastWrite[t] = i
	if c != nil {
		w.markDirty(ep)
	}
}

// markDirty queues ep's record for the window's commit transaction.
func (w *window) markDirty(ep *endpoint) {
	if !ep.dirty {
		ep.dirty = true
		w.dirty = append(w.dirty, ep)
	}
}

// drop records a drop of every tier of ep. A second drop of ep in one
// window adds nothing but may widen the first to deleting the record, or
// a tier clear to the whole endpoint.
func (w *window) drop(ep *endpoint, deleteRecord bool) {
	for k := range w.drops {
		if w.drops[k].ep == ep {
			w.drops[k].deleteRecord = w.drops[k].deleteRecord || deleteRecord
			w.drops[k].all = true
			return
		}
	}
	w.drops = append(w.drops, dropOp{ep: ep, deleteRecord: deleteRecord, all: true})
	if deleteRecord {
		w.markDirty(ep) // its record and member key are deleted
	}
}

// dropTier records a drop of ep's chunks in tier t (a tier clear),
// joining ep's drop of the window when there is one.
func (w *window) dropTier(ep *endpoint, t tier.Tier) {
	for k := range w.drops {
		if w.drops[k].ep == ep {
			w.drops[k].tiers[t] = true
			return
		}
	}
	d := dropOp{ep: ep}
	d.tiers[t] = true
	w.drops = append(w.drops, d)
}

// reset empties the window once it is written, keeping its memory.
func (w *window) reset() {
	clear(w.writes) // drop endpoint and chunk pointers
	w.writes = w.writes[:0]
	clear(w.idx)
	clear(w.drops)
	w.drops = w.drops[:0]
	clear(w.dirty)
	w.dirty = w.dirty[:0]
	w.records = 0
	w.blockOps = 0
	w.oldest = time.Time{}
}

// noteRecord counts one applied record whose Kafka timestamp is ts.
func (w *window) noteRecord(ts time.Time) {
	if w.records == 0 || ts.Before(w.oldest) {
		w.oldest = ts
	}
	w.records++
}

// lingerLeft is how much longer a window that is not full may stay open
// at now, given the linger: until its oldest record is linger old by its
// Kafka timestamp (the producer's CreateTime, or the broker's
// LogAppendTime), so a record that waited in Kafka or in the queue waits
// no longer here, and a backlog being caught up is not held at all; and
// never past linger from now, so a producer clock ahead of this one
// lingers no more than the fixed rule did. A record without a timestamp
// (zero, or before 1970 as franz-go decodes -1) counts as arriving now.
func lingerLeft(linger time.Duration, oldest, now time.Time) time.Duration {
	if linger <= 0 {
		return 0
	}
	if oldest.Unix() <= 0 {
		return linger
	}
	return min(max(linger-now.Sub(oldest), 0), linger)
}
