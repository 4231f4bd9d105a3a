package ingester

import (
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/tier"
)

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
	// engine is a token-mode put's value: the block's engine hash.
	engine uint64
	// lease is the lease a put attaches to, assigned when the window is
	// written (0 until then).
	lease clientv3.LeaseID
}

// live reports whether the op still counts: a drop of its endpoint since it
// was queued voids it.
func (o *pendingOp) live() bool { return o.epoch == o.ep.epoch }

// opSet is a window's ordered set of block operations: the last put or
// delete per key wins, in the position of the key's first op (so a record's
// blocks keep their parent-first order).
type opSet struct {
	idx map[opKey]int32
	ops []pendingOp
}

func newOpSet() *opSet { return &opSet{idx: make(map[opKey]int32, 1024)} }

// add queues a put (del false) or delete of (ep, t, hash).
func (s *opSet) add(ep *endpoint, t tier.Tier, hash uint64, del bool) { s.addValue(ep, t, hash, del, 0) }

// addValue queues a put or delete as add does; a token-mode put carries
// the block's engine hash, its value.
func (s *opSet) addValue(ep *endpoint, t tier.Tier, hash uint64, del bool, engine uint64) {
	k := opKey{ep: ep, hash: hash, tier: t}
	if i, ok := s.idx[k]; ok {
		s.ops[i].del = del
		s.ops[i].epoch = ep.epoch
		s.ops[i].lease = 0
		s.ops[i].engine = engine
		return
	}
	s.idx[k] = int32(len(s.ops))
	s.ops = append(s.ops, pendingOp{opKey: k, del: del, epoch: ep.epoch, engine: engine})
}

// len is the number of queued ops, voided ones included.
func (s *opSet) len() int { return len(s.ops) }

// reset empties the set, keeping its memory.
func (s *opSet) reset() {
	clear(s.idx)
	clear(s.ops) // drop endpoint pointers
	s.ops = s.ops[:0]
}
