package refmodel

import (
	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/tier"
)

// tokenEntry is what token mode knows of one engine hash of an endpoint:
// the canonical key its block is stored under and the tiers holding it.
type tokenEntry struct {
	key   uint64
	tiers map[tier.Tier]bool
}

// clear empties the endpoint's blocks and, with them, its engine hash map
// (every drop of DESIGN semantics 3, 7 and 8).
func (st *endpoint) clear() {
	clear(st.blocks)
	st.engine = nil
}

// storeTokens applies a BlockStored in token mode (DESIGN "Hashing"). A
// block with tokens is keyed by client.TokenBlockKey over its parent's key
// (the event's parent in the endpoint's map, or client.TokenKeyRoot), its
// block_size tokens and its extras (extra_keys[i] when the event has
// extra_keys, else the LoRA name when set); a token-less placeholder takes
// the key its engine hash has on the endpoint. A parent 0 that names no
// block of the endpoint is a root (DESIGN "Hashing"). Unknown parents and
// placeholders, token counts that are not block_size per block, token ids
// outside uint32 and unkeyable extra_keys leave the blocks out (an
// unkeyable block also leaves out the rest of its event, which chains on
// it). An engine hash keyed anew under another key loses the old key in
// every tier.
func (st *endpoint) storeTokens(ev events.Event) {
	n := len(ev.BlockHashes)
	if n == 0 {
		return
	}
	if len(ev.TokenIDs) == 0 {
		for _, h := range ev.BlockHashes {
			if e, ok := st.engine[h]; ok {
				st.put(h, e.key, ev.Tier)
			}
		}
		return
	}
	bs := int(ev.BlockSize)
	if bs <= 0 || len(ev.TokenIDs) != n*bs || ev.BadExtraKeys != "" || (ev.HasExtraKeys && ev.ExtraKeysLen != n) {
		return
	}
	parent := client.TokenKeyRoot
	if ev.HasParent {
		e, ok := st.engine[ev.ParentHash]
		switch {
		case ok:
			parent = e.key
		case ev.ParentHash != 0:
			return
		}
		// else parent 0 naming no block of the endpoint: a root (DESIGN
		// "Hashing", parent 0).
	}
	for i, h := range ev.BlockHashes {
		toks := make([]uint32, 0, bs)
		for _, t := range ev.TokenIDs[i*bs : (i+1)*bs] {
			if t < 0 || t > 1<<32-1 {
				return
			}
			toks = append(toks, uint32(t))
		}
		var extras []client.Extra
		switch {
		case ev.HasExtraKeys:
			if ev.ExtraKeys != nil {
				extras = ev.ExtraKeys[i]
			}
		case ev.LoraName != "":
			extras = []client.Extra{client.StringExtra(ev.LoraName)}
		}
		key := client.TokenBlockKey(parent, toks, extras)
		st.put(h, key, ev.Tier)
		parent = key
	}
}

// put makes engine hash h present in tier t under key.
func (st *endpoint) put(h, key uint64, t tier.Tier) {
	if st.engine == nil {
		st.engine = map[uint64]tokenEntry{}
	}
	e, ok := st.engine[h]
	if ok && e.key != key {
		for old := range e.tiers {
			delete(st.blocks, blockID{old, e.key})
		}
		ok = false
	}
	if !ok {
		e = tokenEntry{key: key, tiers: map[tier.Tier]bool{}}
	}
	e.tiers[t] = true
	st.engine[h] = e
	st.blocks[blockID{t, key}] = struct{}{}
}

// removeTokens applies a BlockRemoved in token mode: each known engine
// hash's key leaves the event's tier; an unknown engine hash is a no-op.
func (st *endpoint) removeTokens(ev events.Event) {
	for _, h := range ev.BlockHashes {
		e, ok := st.engine[h]
		if !ok {
			continue
		}
		delete(st.blocks, blockID{ev.Tier, e.key})
		delete(e.tiers, ev.Tier)
		if len(e.tiers) == 0 {
			delete(st.engine, h)
		}
	}
}

// clearTier forgets tier t of every engine hash (a TierBlocksCleared); an
// entry no other tier holds goes.
func (st *endpoint) clearTier(t tier.Tier) {
	for h, e := range st.engine {
		delete(e.tiers, t)
		if len(e.tiers) == 0 {
			delete(st.engine, h)
		}
	}
}
