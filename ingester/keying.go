package ingester

import (
	"math"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// Reasons a block of token mode is not keyed (the unkeyed_blocks_total
// metric's labels, docs/semantics.md "Token mode"). Each counts blocks,
// never guesses a key for them.
const (
	// unkeyedParent: a store whose parent's engine hash is unknown on the
	// endpoint (an orphan): its chain cannot be keyed.
	unkeyedParent = "unknown_parent"
	// unkeyedPlaceholder: a token-less store (an offload placeholder)
	// whose engine hash is unknown on the endpoint.
	unkeyedPlaceholder = "unknown_placeholder"
	// unkeyedTokens: token_ids that are not block_size tokens per block,
	// or a token id outside 0..2^32-1.
	unkeyedTokens = "bad_tokens"
	// unkeyedExtras: extra_keys that have no canonical encoding, or not
	// one entry per block.
	unkeyedExtras = "bad_extra_keys"
	// unknownRemoval: a BlockRemoved of an engine hash the endpoint's map
	// does not hold: a no-op (semantics 2), counted.
	unknownRemoval = "unknown_removal"
	// unmappedBlock: a chunk entry a new owner's rebuild found that cannot
	// be kept (rebuild.go); its chunk is rewritten without it.
	unmappedBlock = "unmapped"
)

// tokenMode reports whether the applier keys blocks by token (DESIGN
// "Hashing").
func (a *applier) tokenMode() bool { return a.cfg.HashMode == keyspace.HashModeToken }

// storedTokens applies one BlockStored in token mode: each block is keyed
// with client.TokenBlockKey, chained on its parent's key (the event's
// parent looked up in the endpoint's map, or TokenKeyRoot without one), and
// the map learns engine hash -> key. A token-less placeholder takes the key
// its engine hash already has on the endpoint. What cannot be keyed is
// skipped and counted; the rest of the event after an unkeyable block is
// skipped too, since it chains on it. sized reports whether the event's
// token ids keyed a block at its block size, which only then is the
// endpoint's (a placeholder keys by the map, not by the size).
func (a *applier) storedTokens(ep *endpoint, ev *events.Event) (sized bool) {
	n := len(ev.BlockHashes)
	if n == 0 {
		return false
	}
	if len(ev.TokenIDs) == 0 {
		for _, h := range ev.BlockHashes {
			key, ok := a.maps.lookup(ep, h)
			if !ok {
				a.unkeyed(unkeyedPlaceholder, 1)
				continue
			}
			a.storeKey(ep, ev.Tier, h, key)
		}
		return false
	}
	bs := int(ev.BlockSize)
	switch {
	case bs <= 0 || len(ev.TokenIDs) != n*bs:
		a.unkeyed(unkeyedTokens, n)
		return false
	case ev.BadExtraKeys != "" || (ev.HasExtraKeys && ev.ExtraKeysLen != n):
		a.unkeyed(unkeyedExtras, n)
		return false
	}
	parent := client.TokenKeyRoot
	if ev.HasParent {
		var ok bool
		if parent, ok = a.maps.lookup(ep, ev.ParentHash); !ok {
			if ev.ParentHash != 0 {
				a.unkeyed(unkeyedParent, n)
				return false
			}
			// Parent 0 that names no block of the endpoint is "no
			// parent" (DESIGN "Hashing": array-format producers such as
			// llm-d-inference-sim send 0, not nil, for a root).
			parent = client.TokenKeyRoot
		}
	}
	for i, h := range ev.BlockHashes {
		toks, ok := a.blockTokens(ev.TokenIDs[i*bs : (i+1)*bs])
		if !ok {
			a.unkeyed(unkeyedTokens, n-i)
			return i > 0
		}
		key := client.TokenBlockKey(parent, toks, a.blockExtras(ev, i))
		a.storeKey(ep, ev.Tier, h, key)
		parent = key
	}
	return true
}

// storeKey records engine hash h present in tier t under key and stores
// the block. An engine hash that had another key loses it: that key's
// copies are deleted, so no removal can miss them.
func (a *applier) storeKey(ep *endpoint, t tier.Tier, h, key uint64) {
	old, oldTiers := a.maps.store(ep, h, key, t)
	for _, ot := range tier.All {
		if oldTiers&bit(ot) != 0 {
			removeChunk(a.rule, ep, ot, old, a.win)
		}
	}
	storeChunk(a.rule, ep, t, key, h, a.win)
}

// removedTokens applies one BlockRemoved in token mode: each engine hash's
// key, from the endpoint's map, is deleted from the event's tier. An
// unknown engine hash is a no-op (counted).
func (a *applier) removedTokens(ep *endpoint, ev *events.Event) {
	for _, h := range ev.BlockHashes {
		key, ok := a.maps.remove(ep, h, ev.Tier)
		if !ok {
			a.unkeyed(unknownRemoval, 1)
			continue
		}
		removeChunk(a.rule, ep, ev.Tier, key, a.win)
	}
}

// blockTokens converts one block's token ids to the hasher's uint32s in a
// buffer of the worker's; ok is false for an id outside 0..2^32-1.
func (a *applier) blockTokens(ids []int64) ([]uint32, bool) {
	a.tokBuf = a.tokBuf[:0]
	for _, t := range ids {
		if t < 0 || t > math.MaxUint32 {
			return nil, false
		}
		a.tokBuf = append(a.tokBuf, uint32(t))
	}
	return a.tokBuf, true
}

// blockExtras returns block i's extras (DESIGN "Hashing"): the event's
// extra_keys[i] when it has extra_keys, else its LoRA name when set, else
// none. The slice is the event's or the worker's, read-only, and valid
// until the next call.
func (a *applier) blockExtras(ev *events.Event, i int) []client.Extra {
	a.extraBuf = a.extraBuf[:0]
	switch {
	case ev.HasExtraKeys:
		if ev.ExtraKeys != nil {
			return ev.ExtraKeys[i]
		}
	case ev.LoraName != "":
		a.extraBuf = append(a.extraBuf, client.StringExtra(ev.LoraName))
	}
	return a.extraBuf
}

// unkeyed counts n blocks that token mode skipped for reason.
func (a *applier) unkeyed(reason string, n int) {
	a.m.unkeyedBlocks.WithLabelValues(reason).Add(float64(n))
	a.unkeyedInRecord += n
}

// capMaps enforces MaxMapEntries after a record: while the partition's
// maps hold more, the endpoint with the most entries is dropped as by
// resync (reason map_cap), so no entry is forgotten while its block stays
// in etcd (DESIGN "Hashing").
func (a *applier) capMaps() {
	for a.maps.entries > a.cfg.MaxMapEntries {
		ep := largest(a.eps)
		if ep == nil {
			return
		}
		a.log.Warn("engine-hash map over its cap; dropping the largest endpoint as by resync",
			"endpoint", ep.id.String(), "entries", len(ep.engine), "partition_entries", a.maps.entries, "max_map_entries", a.cfg.MaxMapEntries)
		a.drop(ep, "map_cap", false)
	}
}
