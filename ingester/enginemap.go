package ingester

import (
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// engineEntry is what token mode knows of one engine hash of an endpoint:
// the canonical key its block was stored under, and the tiers it is
// present in (bit 1<<t for tier t).
type engineEntry struct {
	key   uint64
	tiers uint8
}

// engineMap is one endpoint's map from engine hash to canonical key
// (DESIGN "Hashing", token mode). BlockRemoved events and token-less
// placeholder stores name blocks only by engine hash; the map is how they
// find the key to write. Its lifetime is exactly its blocks': an entry
// exists while its block is present in some tier of the endpoint, as far as
// the worker knows (the applied records, or etcd's block values after a
// claim), and every drop clears the entries it removes. Nil in engine-hash
// mode.
type engineMap map[uint64]engineEntry

// engineMaps is a partition worker's accounting of its endpoints' maps:
// the entries they hold together, which Config.MaxMapEntries bounds. Every
// change to an endpoint's map goes through it so the count stays exact.
type engineMaps struct {
	// entries is the sum of len(ep.engine) over the worker's endpoints.
	entries int
}

// bit is the presence bit of tier t.
func bit(t tier.Tier) uint8 { return 1 << t }

// store records that the block with engine hash h is present in tier t
// under key. When h was known under another key (an engine that reuses a
// hash for other content), old is that key and oldTiers the tiers it was
// present in, all of which the caller must delete: the entry now names the
// new key in tier t only.
func (s *engineMaps) store(ep *endpoint, h, key uint64, t tier.Tier) (old uint64, oldTiers uint8) {
	if ep.engine == nil {
		ep.engine = make(engineMap)
	}
	e, ok := ep.engine[h]
	switch {
	case !ok:
		s.entries++
		ep.engine[h] = engineEntry{key: key, tiers: bit(t)}
	case e.key != key:
		ep.engine[h] = engineEntry{key: key, tiers: bit(t)}
		return e.key, e.tiers
	case e.tiers&bit(t) == 0:
		e.tiers |= bit(t)
		ep.engine[h] = e
	}
	return 0, 0
}

// lookup returns the key of engine hash h on ep.
func (s *engineMaps) lookup(ep *endpoint, h uint64) (uint64, bool) {
	e, ok := ep.engine[h]
	return e.key, ok
}

// remove records that engine hash h left tier t of ep and returns its key;
// ok is false when h is unknown on ep (a removal of something never stored
// is a no-op). The entry goes once no tier holds the block.
func (s *engineMaps) remove(ep *endpoint, h uint64, t tier.Tier) (key uint64, ok bool) {
	e, ok := ep.engine[h]
	if !ok {
		return 0, false
	}
	e.tiers &^= bit(t)
	if e.tiers == 0 {
		delete(ep.engine, h)
		s.entries--
	} else {
		ep.engine[h] = e
	}
	return e.key, true
}

// clearTier forgets tier t of ep (a tier clear): entries present only
// there go.
func (s *engineMaps) clearTier(ep *endpoint, t tier.Tier) {
	for h, e := range ep.engine {
		e.tiers &^= bit(t)
		if e.tiers == 0 {
			delete(ep.engine, h)
			s.entries--
		} else {
			ep.engine[h] = e
		}
	}
}

// clear forgets every entry of ep (a drop of all its blocks).
func (s *engineMaps) clear(ep *endpoint) {
	s.entries -= len(ep.engine)
	ep.engine = nil
}

// largest returns the endpoint of eps with the most entries (nil when none
// has any); ties go to the endpoint that sorts first, so the choice does
// not depend on map iteration order.
func largest(eps map[keyspace.Endpoint]*endpoint) *endpoint {
	var big *endpoint
	for _, ep := range eps {
		if len(ep.engine) == 0 {
			continue
		}
		if big == nil || len(ep.engine) > len(big.engine) || (len(ep.engine) == len(big.engine) && ep.id.String() < big.id.String()) {
			big = ep
		}
	}
	return big
}

// maxMapBytesPerEntry is the heap one map entry may take, a bound the tests
// check (a Go swiss-table slot of a uint64 key and a 16-byte value, with
// the table's growth slack): docs/limits.md sizes MaxMapEntries by it.
const maxMapBytesPerEntry = 64
