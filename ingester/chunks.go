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
	// openAt: a record's first new block of a tier opens a new chunk
	// when the open chunk holds at least this many entries (0 or size:
	// only when it is full).
	openAt int
	// bigRecord: a record that stores at least this many blocks in a
	// tier opens a new chunk for them as soon as the open chunk holds
	// mergeBelow entries (0: off; Config.ChunkOpenAt's big-record clause).
	bigRecord int
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
	// open caches chunks[next-1] for openChunk, which checks it before use
	// (nil: look it up); whatever empties chunks without moving next
	// (dropChunks, a rebuild) clears it.
	open *chunk
	// record is set while a record is applied and no block of it has
	// been appended to the tier yet: rule 1's open threshold applies to
	// the next append (beginRecord, endRecord). recordStores is the
	// number of blocks the record stores in the tier.
	record       bool
	recordStores int
}

// beginRecord and endRecord bracket the ops of one record: rule 1's open
// threshold applies to the record's first new block in the tier, given
// the stores the record holds for it. A merge's appends only fill the
// open chunk, inside a record or not (fill).
func (tc *tierChunks) beginRecord(stores int) { tc.record, tc.recordStores = true, stores }
func (tc *tierChunks) endRecord()             { tc.record, tc.recordStores = false, 0 }

// openChunk returns the open chunk, chunks[next-1], or nil. Every append
// reads it, so the cached pointer saves a map lookup per stored block: it
// is kept while its sequence number is still next-1 and it holds entries
// (an open chunk is deleted only when emptied, or by dropChunks, which
// clears the cache).
func (tc *tierChunks) openChunk() *chunk {
	if o := tc.open; o != nil && o.seq+1 == tc.next && len(o.entries) > 0 {
		return o
	}
	if tc.next == 0 {
		return nil
	}
	tc.open = tc.chunks[tc.next-1] // a nil map reads nil
	return tc.open
}

// has reports whether key is present.
func (tc *tierChunks) has(key uint64) bool { return tc.where[key] != nil }

// blocks is the number of blocks present.
func (tc *tierChunks) blocks() int { return len(tc.where) }

// add appends a stored block's entry e by rule 1 (see fill): inside a
// record, the record's first new block takes the open threshold.
func (tc *tierChunks) add(r chunkRule, e keyspace.ChunkEntry) *chunk {
	first := tc.record
	tc.record = false
	return tc.fill(r, e, first && r.opens(tc))
}

// opens reports whether rule 1 opens a new chunk for the first new block
// of the record being applied to tc: when the open chunk holds openAt
// entries or more, or, for a record storing bigRecord blocks or more in
// the tier, mergeBelow or more. A record's blocks are what one engine
// batch brings, the unit a window holds about one of per endpoint, so a
// big record starts its own chunk instead of rewriting the open one, and
// small records (vLLM's decode steps) fill chunks to openAt as before.
func (r chunkRule) opens(tc *tierChunks) bool {
	c := tc.openChunk()
	if c == nil {
		return false
	}
	m := len(c.entries)
	return r.openAt > 0 && m >= r.openAt || r.bigRecord > 0 && tc.recordStores >= r.bigRecord && m >= r.mergeBelow
}

// fill appends e to the open chunk and reports the chunk it went to: the
// open chunk, chunk next-1, while it exists, holds fewer than the chunk
// size and open is false (rule 1's threshold met: chunkRule.opens); else
// a new one, sequence next (which then moves on). A deleted open chunk is
// not reopened: its sequence number is never reused while its old key may
// be in etcd. A merge fills with open false, so a merge inside a record
// (token mode re-keys a block by removing its old key first) neither
// takes the threshold nor uses up the record's.
func (tc *tierChunks) fill(r chunkRule, e keyspace.ChunkEntry, open bool) *chunk {
	c := tc.openChunk()
	if c == nil || len(c.entries) >= r.size || open {
		if tc.chunks == nil {
			tc.chunks = make(map[uint64]*chunk)
			tc.where = make(map[uint64]*chunk)
		}
		c = &chunk{seq: tc.next, entries: make([]keyspace.ChunkEntry, 0, r.size)}
		tc.chunks[c.seq] = c
		tc.next++
		tc.open = c
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
	tc.open = nil
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
