package ingester

import (
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/tier"
)

// window is what the apply part has made of the records since the last
// commit, waiting to be written: coalesced block ops, the range drops
// they follow, and the endpoints whose records change. The apply part
// fills it without I/O; commit writes it (drops first, then the leases,
// then the ops in bounded transactions) and resets it.
type window struct {
	ops *opSet
	// drops are the range drops of the window in the order they were
	// decided, at most one per endpoint (see drop).
	drops []dropOp
	// dirty are the endpoints whose records the commit transaction
	// writes, in the order they were first touched.
	dirty []*endpoint
	// records counts the records applied into the window.
	records int
}

// dropOp is a range drop of one endpoint's blocks: every block key it has
// in etcd, and with deleteRecord (goodbye, expiry, reset, stale) its record
// and member key too. The endpoint's ops queued before the drop are voided
// (its epoch moved on); those queued after it are written after it. A
// drop that is not all is a tier clear (DESIGN v1.1 TierBlocksCleared): it
// deletes the block keys of the tiers set in tiers only, and voided only
// their ops (their tier epochs moved on).
type dropOp struct {
	ep           *endpoint
	deleteRecord bool
	all          bool
	tiers        [tier.Count + 1]bool
}

func newWindow() *window { return &window{ops: newOpSet()} }

// empty reports whether the window holds nothing to write.
func (w *window) empty() bool {
	return w.ops.len() == 0 && len(w.drops) == 0 && len(w.dirty) == 0
}

// markDirty queues ep's record for the window's commit transaction.
func (w *window) markDirty(ep *endpoint) {
	if !ep.dirty {
		ep.dirty = true
		w.dirty = append(w.dirty, ep)
	}
}

// drop queues a range drop of ep. A second drop of ep in one window adds
// nothing (both delete every block key ep has when the window is written)
// but may widen the first to deleting the record, or a tier clear to the
// whole endpoint.
func (w *window) drop(ep *endpoint, deleteRecord bool) {
	for k := range w.drops {
		if w.drops[k].ep == ep {
			w.drops[k].deleteRecord = w.drops[k].deleteRecord || deleteRecord
			w.drops[k].all = true
			return
		}
	}
	w.drops = append(w.drops, dropOp{ep: ep, deleteRecord: deleteRecord, all: true})
}

// dropTier queues a range drop of ep's blocks in tier t (a tier clear). It
// joins ep's drop of the window when there is one: a drop of every tier
// already covers t, and tier clears of one endpoint add up. Drops are
// written before the window's ops, so the order between a window's drops
// of one endpoint does not matter: the ops each voided are gone either way.
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
	w.ops.reset()
	clear(w.drops)
	w.drops = w.drops[:0]
	w.dirty = w.dirty[:0]
	w.records = 0
}

// opKey names one block key without building it.
type opKey struct {
	ep   *endpoint
	hash uint64
	tier tier.Tier
}

// pendingOp is one coalesced block put or delete of a window.
type pendingOp struct {
	opKey
	del   bool
	epoch uint32
	// tierEpoch is the endpoint's epoch of the op's tier when it was
	// queued: a tier clear voids the tier's ops only.
	tierEpoch uint32
	// lease is the lease a put attaches to, settled by the lease manager
	// before the window is packed (0 until then).
	lease clientv3.LeaseID
	// engine is a token-mode put's value: the block's engine hash.
	engine uint64
}

// live reports whether the op still counts: a drop of its endpoint, or a
// clear of its tier, since it was queued voids it.
func (o *pendingOp) live() bool {
	return o.epoch == o.ep.epoch && o.tierEpoch == o.ep.tierEpoch[o.tier]
}

// opSet is a window's ordered set of block operations: the last put or
// delete per key wins, in the position of the key's first op (so a record's
// blocks keep their parent-first order).
type opSet struct {
	idx map[opKey]int32
	ops []pendingOp
}

func newOpSet() *opSet { return &opSet{idx: make(map[opKey]int32, 1024)} }

// add queues a put (del false) or delete of (ep, t, hash).
func (s *opSet) add(ep *endpoint, t tier.Tier, hash uint64, del bool) {
	s.addValue(ep, t, hash, del, 0)
}

// addValue queues a put or delete as add does; a token-mode put carries
// the block's engine hash, its value.
func (s *opSet) addValue(ep *endpoint, t tier.Tier, hash uint64, del bool, engine uint64) {
	k := opKey{ep: ep, hash: hash, tier: t}
	if i, ok := s.idx[k]; ok {
		s.ops[i].del = del
		s.ops[i].epoch = ep.epoch
		s.ops[i].tierEpoch = ep.tierEpoch[t]
		s.ops[i].lease = 0
		s.ops[i].engine = engine
		return
	}
	s.idx[k] = int32(len(s.ops))
	s.ops = append(s.ops, pendingOp{opKey: k, del: del, epoch: ep.epoch, tierEpoch: ep.tierEpoch[t], engine: engine})
}

// len is the number of queued ops, voided ones included.
func (s *opSet) len() int { return len(s.ops) }

// reset empties the set, keeping its memory.
func (s *opSet) reset() {
	clear(s.idx)
	clear(s.ops) // drop endpoint pointers
	s.ops = s.ops[:0]
}
