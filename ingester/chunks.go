package ingester

import (
	"slices"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// The chunk rule (DESIGN "The chunk rule (writer)"): the writer keeps,
// per (endpoint, tier), the chunks it has in etcd, and applies every block
// op to them at once, op by op. The layout then depends only on the op
// sequence and the state at the stored offset, never on where a window
// ends, which is what makes a replay after a crash rewrite exactly the
// chunks the crashed attempt wrote, byte for byte.

// chunkRule is the writer's chunk size, open threshold and merge
// threshold (Config.ChunkSize, Config.ChunkOpenAt,
// Config.ChunkMergeBelow).
type chunkRule struct {
	// size is the most entries of a chunk.
	size int
	// openAt: a store event's first new block of a tier opens a new
	// chunk when the open chunk holds at least this many entries (0 or
	// size: only when it is full).
	openAt int
	// mergeBelow: a chunk other than the open one left with fewer entries
	// moves them to the open chunk and is deleted (1: never).
	mergeBelow int
}

// chunk is one chunk of an (endpoint, tier) as the writer holds it.
type chunk struct {
	seq uint64
	// entries are its blocks in insertion order; Engine is the key hash
	// again in engine-hash mode (what a width-8 value decodes to).
	entries []keyspace.ChunkEntry
	// lease is the lease shard its key is attached to (0: none yet; the
	// lease manager assigns one before the chunk is put).
	lease clientv3.LeaseID
}

// index returns the position of key in c's entries, or -1.
func (c *chunk) index(key uint64) int {
	for i := range c.entries {
		if c.entries[i].Key == key {
			return i
		}
	}
	return -1
}

// tierChunks is the chunk state of one (endpoint, tier): chunk_next, the
// chunks by sequence number, and the chunk of each key hash present.
type tierChunks struct {
	// next is chunk_next: the sequence number the next opened chunk
	// gets; chunk next-1, when it exists, is the open chunk.
	next   uint64
	chunks map[uint64]*chunk
	where  map[uint64]*chunk
	// event is set while a store event is applied to the tier and no
	// block of it has been appended yet: rule 1's open threshold applies
	// to the next append (beginEvent, endEvent).
	event bool
}

// beginEvent and endEvent bracket the stores of one store event: rule 1's
// open threshold applies to the event's first new block. A merge's
// appends only fill the open chunk, inside an event or not (fill).
func (tc *tierChunks) beginEvent() { tc.event = true }
func (tc *tierChunks) endEvent()   { tc.event = false }

// has reports whether key is present.
func (tc *tierChunks) has(key uint64) bool { return tc.where[key] != nil }

// blocks is the number of blocks present.
func (tc *tierChunks) blocks() int { return len(tc.where) }

// add appends a stored block's entry e by rule 1 (see fill): inside a
// store event, the event's first new block takes the open threshold.
func (tc *tierChunks) add(r chunkRule, e keyspace.ChunkEntry) *chunk {
	first := tc.event
	tc.event = false
	return tc.fill(r, e, first)
}

// fill appends e to the open chunk and reports the chunk it went to: the
// open chunk, chunk next-1, while it exists and holds fewer than the
// chunk size, and, when first (a store event's first new block), fewer
// than the open threshold; else a new one, sequence next (which then
// moves on). A deleted open chunk is not reopened: its sequence number is
// never reused while its old key may be in etcd. A merge fills with first
// false, so a merge inside a store event (token mode re-keys a block by
// removing its old key first) neither takes the threshold nor uses up the
// event's.
func (tc *tierChunks) fill(r chunkRule, e keyspace.ChunkEntry, first bool) *chunk {
	c := tc.chunks[tc.next-1] // a nil map, or no chunk -1, reads nil
	if tc.next == 0 || c == nil || len(c.entries) >= r.size || first && r.openAt > 0 && len(c.entries) >= r.openAt {
		if tc.chunks == nil {
			tc.chunks = make(map[uint64]*chunk)
			tc.where = make(map[uint64]*chunk)
		}
		c = &chunk{seq: tc.next, entries: make([]keyspace.ChunkEntry, 0, r.size)}
		tc.chunks[c.seq] = c
		tc.next++
	}
	c.entries = append(c.entries, e)
	tc.where[e.Key] = c
	return c
}

// chunkSink receives every chunk a chunk-rule step changed: c is its new
// state, nil when the chunk was deleted. The window is the sink
// (window.chunkChanged): it writes each chunk once, at its final state.
type chunkSink interface {
	chunkChanged(ep *endpoint, t tier.Tier, seq uint64, c *chunk)
}

// store applies a store of key (engine: its engine hash; the key again in
// engine-hash mode) to tier t of ep: a no-op when present (semantics 2),
// except that a token-mode entry whose block came back under another
// engine hash takes the new one (the last store names the block, as the
// map does); else appended by rule 1.
func storeChunk(r chunkRule, ep *endpoint, t tier.Tier, key, engine uint64, sink chunkSink) {
	tc := &ep.chunks[t]
	if c := tc.where[key]; c != nil {
		if i := c.index(key); c.entries[i].Engine != engine {
			c.entries[i].Engine = engine
			sink.chunkChanged(ep, t, c.seq, c)
		}
		return
	}
	c := tc.add(r, keyspace.ChunkEntry{Key: key, Engine: engine})
	sink.chunkChanged(ep, t, c.seq, c)
}

// removeChunk applies a removal of key from tier t of ep and reports
// whether key was present: its entry leaves its chunk, the others keeping
// their order (rule 2); a chunk left empty is deleted; a chunk other than
// the open one left with fewer than mergeBelow entries moves them, in
// order, to the open chunk and is deleted (rule 3).
func removeChunk(r chunkRule, ep *endpoint, t tier.Tier, key uint64, sink chunkSink) bool {
	tc := &ep.chunks[t]
	c := tc.where[key]
	if c == nil {
		return false
	}
	delete(tc.where, key)
	i := c.index(key)
	c.entries = slices.Delete(c.entries, i, i+1)
	switch {
	case len(c.entries) == 0:
		delete(tc.chunks, c.seq)
		sink.chunkChanged(ep, t, c.seq, nil)
	case c.seq+1 != tc.next && len(c.entries) < r.mergeBelow:
		delete(tc.chunks, c.seq)
		sink.chunkChanged(ep, t, c.seq, nil)
		for _, e := range c.entries {
			to := tc.fill(r, e, false)
			sink.chunkChanged(ep, t, to.seq, to)
		}
	default:
		sink.chunkChanged(ep, t, c.seq, c)
	}
	return true
}

// dropChunks deletes every chunk of tier t of ep (rule 4), in sequence
// order, and keeps chunk_next: a sequence number is not reused while its
// old key may be in etcd. A drop that deletes the endpoint's record
// forgets the endpoint, so a later record of it starts at chunk 0 (after
// the deletes of this window, which write each chunk key once).
func dropChunks(ep *endpoint, t tier.Tier, sink chunkSink) {
	tc := &ep.chunks[t]
	if len(tc.chunks) == 0 {
		return
	}
	seqs := make([]uint64, 0, len(tc.chunks))
	for seq := range tc.chunks {
		seqs = append(seqs, seq)
	}
	slices.Sort(seqs)
	for _, seq := range seqs {
		sink.chunkChanged(ep, t, seq, nil)
	}
	clear(tc.chunks)
	clear(tc.where)
}

// hasChunks reports whether ep holds a chunk in any tier.
func (e *endpoint) hasChunks() bool {
	for _, t := range tier.All {
		if len(e.chunks[t].chunks) > 0 {
			return true
		}
	}
	return false
}

// chunkNext returns chunk_next of every tier, for ep's record (nil when
// all are 0).
func (e *endpoint) chunkNext() [tier.Count + 1]uint64 {
	var out [tier.Count + 1]uint64
	for _, t := range tier.All {
		out[t] = e.chunks[t].next
	}
	return out
}
