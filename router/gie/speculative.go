package gie

import (
	"encoding/binary"
	"hash/maphash"
	"sync"
	"time"
)

// Speculative remembers, for a TTL, which endpoint a prompt's blocks were
// just sent to, before that endpoint's KV events can have reached the
// index (Kafka, the ingester, etcd, indexd's watch: typically tens to
// hundreds of milliseconds). Two back-to-back requests with a new prefix
// then land on one endpoint instead of two. llm-d's precise scorer keeps
// the same kind of entries for 2 s.
//
// An entry cannot outlive the truth it stands in for:
//   - it lives TTL from the routing decision that made it; a later
//     decision for the same (block, endpoint), which a speculative entry
//     may itself have won, never extends it;
//   - it stops counting once an index answer has caught up with the
//     decision: the answer's progress time (IndexAnswer.ProgressTime) is
//     at least IndexLag after the decision, so the index reflects what
//     the endpoint reported after it (docs/router.md says why this signal).
//
// Blocks are named by a local chained hash of their tokens (seeded by the
// model, LoRA, cache salt and the multimodal items overlapping the block);
// it never leaves the process, so it need not equal kvindex's keys.
//
// The number of remembered (block, endpoint) entries is bounded by
// MaxEntries: past it, the oldest entries are dropped first. Since every
// entry lives for the same TTL, insertion order is expiry order, and
// expired entries are dropped from the front as new ones arrive. It is
// safe for concurrent use and starts no goroutine.
type Speculative struct {
	ttl        time.Duration
	indexLag   time.Duration
	maxEntries int
	blockSize  int
	now        func() time.Time
	seed       maphash.Seed

	mu      sync.Mutex
	entries map[specKey]time.Time // (block key, endpoint) → decision time
	order   []specEntry           // insertion (= expiry) order; head at order[head]
	head    int
}

// specKey names one remembered (block, endpoint) entry. One flat map of
// them costs about a quarter of a map of maps (one small inner map per
// block key): BenchmarkSpeculativeMemory.
type specKey struct {
	key uint64
	id  Identity
}

type specEntry struct {
	specKey
	decided time.Time
}

// NewSpeculative returns a Speculative keeping entries for ttl after
// their decision, at most maxEntries of them, naming blocks of blockSize
// tokens; an entry stops counting in an answer whose progress time is at
// least indexLag after its decision (a negative indexLag counts as 0).
// now is the clock (time.Now when nil), the one decisions are stamped
// with and answers' progress times are compared to. A ttl or maxEntries
// of zero or less disables it: Remember does nothing and Match finds
// nothing.
func NewSpeculative(ttl, indexLag time.Duration, maxEntries, blockSize int, now func() time.Time) *Speculative {
	if now == nil {
		now = time.Now
	}
	return &Speculative{
		ttl: ttl, indexLag: max(indexLag, 0), maxEntries: maxEntries, blockSize: max(blockSize, 1), now: now,
		seed: maphash.MakeSeed(), entries: map[specKey]time.Time{},
	}
}

// BlockSize is the block size, in tokens, the keys are computed at.
func (s *Speculative) BlockSize() int { return s.blockSize }

// Keys returns the chained keys of p's full blocks of BlockSize tokens,
// for model.
func (s *Speculative) Keys(model string, p Prompt) []uint64 {
	n := len(p.TokenIDs) / s.blockSize
	if n == 0 {
		return nil
	}
	keys := make([]uint64, n)
	var h maphash.Hash
	h.SetSeed(s.seed)
	h.WriteString(model)
	h.WriteByte(0)
	h.WriteString(p.LoRAName)
	h.WriteByte(0)
	h.WriteString(p.CacheSalt)
	parent := h.Sum64()
	var buf [8]byte
	for i := range n {
		h.Reset()
		binary.LittleEndian.PutUint64(buf[:], parent)
		h.Write(buf[:])
		start, end := i*s.blockSize, (i+1)*s.blockSize
		for _, t := range p.TokenIDs[start:end] {
			binary.LittleEndian.PutUint32(buf[:4], t)
			h.Write(buf[:4])
		}
		for _, mm := range p.MultiModal {
			if mm.Offset < end && mm.Offset+mm.Length > start {
				h.WriteByte(1)
				h.WriteString(mm.Hash)
			}
		}
		parent = h.Sum64()
		keys[i] = parent
	}
	return keys
}

// Remember records that the blocks keys were sent to id by a decision
// made now, for the TTL. A (block, endpoint) entry still live keeps its
// own decision time: a repeated decision does not renew it.
func (s *Speculative) Remember(keys []uint64, id Identity) {
	if s.ttl <= 0 || s.maxEntries <= 0 || len(keys) == 0 {
		return
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(now)
	if len(keys) > s.maxEntries {
		// Match credits leading blocks only: of a prompt longer than the
		// bound, its first blocks are the ones worth keeping.
		keys = keys[:s.maxEntries]
	}
	for _, k := range keys {
		sk := specKey{key: k, id: id}
		if _, live := s.entries[sk]; live {
			continue
		}
		s.entries[sk] = now
		s.order = append(s.order, specEntry{specKey: sk, decided: now})
	}
	for len(s.order)-s.head > s.maxEntries {
		s.dropHeadLocked()
	}
	s.compactLocked()
}

// Match returns how many leading blocks of keys are remembered for id, not
// yet expired, and not caught up with by an answer whose progress time is
// progress (zero: the answer did not say, and only the TTL applies).
// Entries of id the answer has caught up with are dropped.
func (s *Speculative) Match(keys []uint64, id Identity, progress time.Time) int {
	if len(keys) == 0 {
		return 0
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, k := range keys {
		decided, ok := s.entries[specKey{key: k, id: id}]
		if !ok || !now.Before(decided.Add(s.ttl)) {
			break
		}
		if s.caughtUp(decided, progress) {
			// The index reflects what id reported after this decision:
			// its answer is the truth from here on.
			s.dropCaughtUpLocked(keys, id, progress)
			return n
		}
		n++
	}
	return n
}

// caughtUp reports whether an answer of progress time progress reflects
// what an endpoint reported after a decision at decided.
func (s *Speculative) caughtUp(decided, progress time.Time) bool {
	return !progress.IsZero() && !progress.Before(decided.Add(s.indexLag))
}

// dropCaughtUpLocked deletes id's entries of keys that progress has
// caught up with; their order entries then leave the map alone.
func (s *Speculative) dropCaughtUpLocked(keys []uint64, id Identity, progress time.Time) {
	for _, k := range keys {
		sk := specKey{key: k, id: id}
		if decided, ok := s.entries[sk]; ok && s.caughtUp(decided, progress) {
			delete(s.entries, sk)
		}
	}
}

// Len returns the number of entries kept (expired ones not yet dropped
// included).
func (s *Speculative) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.order) - s.head
}

// expireLocked drops the entries expired at now from the front.
func (s *Speculative) expireLocked(now time.Time) {
	for s.head < len(s.order) && !now.Before(s.order[s.head].decided.Add(s.ttl)) {
		s.dropHeadLocked()
	}
}

// dropHeadLocked drops the oldest entry. A (block, endpoint) pair
// remembered again after this entry was dropped from the map (caught up)
// has a later decision time there; the old entry then leaves it alone.
func (s *Speculative) dropHeadLocked() {
	e := s.order[s.head]
	s.order[s.head] = specEntry{}
	s.head++
	if decided, ok := s.entries[e.specKey]; ok && decided.Equal(e.decided) {
		delete(s.entries, e.specKey)
	}
}

// compactLocked reclaims the dropped front of order once it is at least
// half of the slice.
func (s *Speculative) compactLocked() {
	if s.head > 0 && s.head >= len(s.order)/2 {
		n := copy(s.order, s.order[s.head:])
		clear(s.order[n:])
		s.order = s.order[:n]
		s.head = 0
	}
}
