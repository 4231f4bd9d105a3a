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
	maxEntries int
	blockSize  int
	now        func() time.Time
	seed       maphash.Seed

	mu      sync.Mutex
	entries map[uint64]map[Identity]time.Time // block key → endpoint → expiry
	order   []specEntry                       // insertion (= expiry) order; head at order[head]
	head    int
}

type specEntry struct {
	key    uint64
	id     Identity
	expiry time.Time
}

// NewSpeculative returns a Speculative keeping entries for ttl, at most
// maxEntries of them, naming blocks of blockSize tokens. now is the clock
// (time.Now when nil). A ttl or maxEntries of zero or less disables it:
// Remember does nothing and Match finds nothing.
func NewSpeculative(ttl time.Duration, maxEntries, blockSize int, now func() time.Time) *Speculative {
	if now == nil {
		now = time.Now
	}
	return &Speculative{
		ttl: ttl, maxEntries: maxEntries, blockSize: max(blockSize, 1), now: now,
		seed: maphash.MakeSeed(), entries: map[uint64]map[Identity]time.Time{},
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

// Remember records that the blocks keys were sent to id, until the TTL
// passes.
func (s *Speculative) Remember(keys []uint64, id Identity) {
	if s.ttl <= 0 || s.maxEntries <= 0 || len(keys) == 0 {
		return
	}
	now := s.now()
	expiry := now.Add(s.ttl)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(now)
	for _, k := range keys {
		m := s.entries[k]
		if m == nil {
			m = map[Identity]time.Time{}
			s.entries[k] = m
		}
		m[id] = expiry
		s.order = append(s.order, specEntry{key: k, id: id, expiry: expiry})
	}
	for len(s.order)-s.head > s.maxEntries {
		s.dropHeadLocked()
	}
	s.compactLocked()
}

// Match returns how many leading blocks of keys are remembered for id and
// not yet expired.
func (s *Speculative) Match(keys []uint64, id Identity) int {
	if len(keys) == 0 {
		return 0
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, k := range keys {
		exp, ok := s.entries[k][id]
		if !ok || !now.Before(exp) {
			break
		}
		n++
	}
	return n
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
	for s.head < len(s.order) && !now.Before(s.order[s.head].expiry) {
		s.dropHeadLocked()
	}
}

// dropHeadLocked drops the oldest entry. A (block, endpoint) pair
// remembered again later has a later expiry in the map; the old entry
// then leaves the map alone.
func (s *Speculative) dropHeadLocked() {
	e := s.order[s.head]
	s.order[s.head] = specEntry{}
	s.head++
	if m := s.entries[e.key]; m != nil && m[e.id].Equal(e.expiry) {
		delete(m, e.id)
		if len(m) == 0 {
			delete(s.entries, e.key)
		}
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
