package indextest

import (
	"slices"
	"strings"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// ChunkOp is one chunk write of a batch: a put of Value (the chunk's
// whole state) or, with Value nil, a delete; Prev is the chunk's value
// before the batch (nil when it did not exist), what etcd's prev_kv
// carries.
type ChunkOp struct {
	Key   string
	Prev  []byte
	Value []byte
}

// Chunker is the test writer of keyspace v2 the reader's tests write
// with: the chunk rule of DESIGN "The chunk rule (writer)", kept small
// and obvious (the ingester has its own). Blocks fill the open chunk of
// their (endpoint, tier) in insertion order; a removal rewrites its
// chunk, a chunk left empty is deleted, and a chunk other than the open
// one left with fewer than MergeBelow keys moves them to the open chunk
// and is deleted, in the same batch. Each batch's ops come out of Flush,
// every chunk the batch touched once, at its final state.
//
// Present mirrors it as a Reference's Present set, so a test writes
// through a Chunker and compares the index with the Reference.
type Chunker struct {
	ks keyspace.Keyspace
	// Size is the most keys per chunk (keyspace.DefaultChunkSize unless
	// set before the first Store).
	Size int
	// MergeBelow is the fill under which a closed chunk is merged into
	// the open one (an eighth of Size, at least 1, the rule of
	// ingester.DefaultChunkMergeBelow, which this foundation package may
	// not import; 0 never merges).
	MergeBelow int
	// Engine writes width-16 entries (token mode) with Engine hashes.
	Engine bool

	tiers map[tierKey]*tierChunks
	// batch holds, per chunk key touched since the last Flush, its value
	// before the batch.
	batch map[string]batchEntry
}

type tierKey struct {
	ep keyspace.Endpoint
	t  tier.Tier
}

type tierChunks struct {
	next   uint64 // the open chunk is next-1
	chunks map[uint64][]keyspace.ChunkEntry
	where  map[uint64]uint64 // key hash → its chunk
}

type batchEntry struct {
	prev []byte
}

// NewChunker returns a Chunker writing keys of ks with the default chunk
// size and merge threshold.
func NewChunker(ks keyspace.Keyspace) *Chunker {
	return &Chunker{ks: ks, Size: keyspace.DefaultChunkSize, MergeBelow: max(1, keyspace.DefaultChunkSize/8),
		tiers: map[tierKey]*tierChunks{}, batch: map[string]batchEntry{}}
}

func (c *Chunker) tier(ep keyspace.Endpoint, t tier.Tier) *tierChunks {
	k := tierKey{ep, t}
	tc := c.tiers[k]
	if tc == nil {
		tc = &tierChunks{chunks: map[uint64][]keyspace.ChunkEntry{}, where: map[uint64]uint64{}}
		c.tiers[k] = tc
	}
	return tc
}

// touch records chunk seq's value before the batch, the first time the
// batch touches it.
func (c *Chunker) touch(ep keyspace.Endpoint, t tier.Tier, tc *tierChunks, seq uint64) {
	key := c.ks.ChunkKey(ep, t, seq)
	if _, ok := c.batch[key]; ok {
		return
	}
	var prev []byte
	if es := tc.chunks[seq]; len(es) > 0 {
		prev = keyspace.AppendChunkValue(nil, es, c.Engine)
	}
	c.batch[key] = batchEntry{prev: prev}
}

// Store makes key present on (ep, t), with engine its engine hash (token
// mode); a key present already is a no-op.
func (c *Chunker) Store(ep keyspace.Endpoint, t tier.Tier, key, engine uint64) {
	tc := c.tier(ep, t)
	if _, ok := tc.where[key]; ok {
		return
	}
	c.appendOpen(ep, t, tc, keyspace.ChunkEntry{Key: key, Engine: engine})
}

func (c *Chunker) appendOpen(ep keyspace.Endpoint, t tier.Tier, tc *tierChunks, e keyspace.ChunkEntry) {
	if tc.next == 0 || len(tc.chunks[tc.next-1]) >= c.Size {
		tc.next++
	}
	seq := tc.next - 1
	c.touch(ep, t, tc, seq)
	tc.chunks[seq] = append(tc.chunks[seq], e)
	tc.where[e.Key] = seq
}

// Remove makes key absent from (ep, t); absent already is a no-op.
func (c *Chunker) Remove(ep keyspace.Endpoint, t tier.Tier, key uint64) {
	tc := c.tier(ep, t)
	seq, ok := tc.where[key]
	if !ok {
		return
	}
	c.touch(ep, t, tc, seq)
	delete(tc.where, key)
	es := slices.DeleteFunc(tc.chunks[seq], func(e keyspace.ChunkEntry) bool { return e.Key == key })
	switch {
	case len(es) == 0:
		delete(tc.chunks, seq)
	case seq != tc.next-1 && len(es) < c.MergeBelow:
		delete(tc.chunks, seq)
		for _, e := range es {
			c.appendOpen(ep, t, tc, e)
		}
	default:
		tc.chunks[seq] = es
	}
}

// Drop deletes every chunk of ep in every tier (a clear, goodbye or
// resync) and resets its sequence numbers.
func (c *Chunker) Drop(ep keyspace.Endpoint) {
	for _, t := range tier.All {
		tc := c.tiers[tierKey{ep, t}]
		if tc == nil {
			continue
		}
		for seq := range tc.chunks {
			c.touch(ep, t, tc, seq)
		}
		delete(c.tiers, tierKey{ep, t})
	}
}

// Flush returns the batch's ops, one per chunk touched since the last
// Flush, ordered by key, and starts a new batch. A chunk opened and
// emptied within the batch is left out (it never reached etcd).
func (c *Chunker) Flush() []ChunkOp {
	var ops []ChunkOp
	for key, b := range c.batch {
		ch, err := c.ks.ParseChunkKey(key)
		if err != nil {
			panic(err) // the Chunker built the key
		}
		var value []byte
		if tc := c.tiers[tierKey{ch.Endpoint, ch.Tier}]; tc != nil {
			if es := tc.chunks[ch.Seq]; len(es) > 0 {
				value = keyspace.AppendChunkValue(nil, es, c.Engine)
			}
		}
		if value == nil && b.prev == nil {
			continue
		}
		ops = append(ops, ChunkOp{Key: key, Prev: b.prev, Value: value})
	}
	clear(c.batch)
	slices.SortFunc(ops, func(a, b ChunkOp) int { return strings.Compare(a.Key, b.Key) })
	return ops
}

// Present sets ref.Present to the blocks the Chunker's chunks hold.
func (c *Chunker) Present(ref *Reference) {
	clear(ref.Present)
	for k, tc := range c.tiers {
		for key := range tc.where {
			ref.Present[keyspace.Block{Endpoint: k.ep, Tier: k.t, Hash: key}] = true
		}
	}
}
