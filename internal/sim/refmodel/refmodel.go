// Package refmodel is the reference model of kvindex's semantics: a tiny,
// obviously-correct, in-memory interpreter of a record stream (DESIGN
// semantics 1-8 as settled in docs/semantics.md). It has no etcd, no Kafka,
// no batching, no concurrency and no performance goals. Tests feed the same
// seeded random record stream to it and to the real pipeline and compare
// what each says is present; a difference is a bug in one of them.
//
// The v1.1 rules are in too: tier clears, the indexed KV-cache group of
// each endpoint, and the drop of an endpoint written under another medium
// map (Remap).
//
// It is deliberately written independently of the ingester: it shares only
// the wire decoder (internal/events) and the key types (internal/keyspace).
//
// Not production code (internal/sim): only tests and benchmarks import it.
package refmodel

import (
	"cmp"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/scenario"
	"github.com/kvindex/kvindex/internal/tier"
)

// Record is one Kafka record as the ingester receives it.
type Record struct {
	// Key is the record key: the pod identity.
	Key string
	// Headers are the record headers by name.
	Headers map[string]string
	// Value is the record value (a KVEventBatch, or empty for control
	// records).
	Value []byte
	// Time is the record's Kafka timestamp, the partition clock while the
	// ingester catches up.
	Time time.Time
}

// The outcomes Apply reports: "" for an applied record, else the skip
// reason of docs/semantics.md (the ingester's metric label).
const (
	Applied          = ""
	SkipBadModel     = "bad_model"
	SkipBadKey       = "bad_key"
	SkipUnknownKind  = "unknown_kind"
	SkipBadDPRank    = "bad_dp_rank"
	SkipBadSeq       = "bad_seq"
	SkipUnknownFmt   = "unknown_format"
	SkipMalformed    = "malformed_batch"
	SkipRankMismatch = "dp_rank_mismatch"
	SkipEmptyValue   = "empty_value"
	SkipDuplicate    = "duplicate"
	SkipBadIncarn    = "bad_incarnation"
)

// Config configures a Model.
type Config struct {
	// Mediums maps engine mediums to tiers; nil means
	// events.DefaultMediums().
	Mediums events.MediumMap
	// LivenessWindow drops an endpoint whose last batch or heartbeat is
	// older than this on the clock (the latest record time seen, or a time
	// given to Expire). Zero turns liveness off.
	LivenessWindow time.Duration
	// HashMode is what blocks are keyed by (DESIGN "Hashing"): the zero
	// value and keyspace.HashModeEngine key them by the engine's hash;
	// keyspace.HashModeToken by the canonical key of their tokens
	// (token.go).
	HashMode keyspace.HashMode
}

// Model is the reference state: which (endpoint, tier, block) are present,
// and each endpoint's sequence, liveness, indexed group and medium-map
// state. Not safe for concurrent use.
type Model struct {
	cfg       Config
	dec       *events.Decoder
	mediums   string // the fingerprint of the medium map in use
	endpoints map[keyspace.Endpoint]*endpoint
	clock     time.Time
	skipped   map[string]int
}

type blockID struct {
	tier tier.Tier
	hash uint64
}

type endpoint struct {
	blocks map[blockID]struct{}
	// engine maps engine hash to canonical key in token mode.
	engine      map[uint64]tokenEntry
	seq         *uint64
	ts          float64
	incarnation string
	last        time.Time
	// group is the KV-cache group indexed; provisional (group 0) until an
	// attention store fixes it (groupSet).
	group    int64
	groupSet bool
	// mediums is the fingerprint of the medium map the endpoint was
	// written under.
	mediums string
}

// New returns an empty model.
func New(cfg Config) *Model {
	m := &Model{cfg: cfg, endpoints: map[keyspace.Endpoint]*endpoint{}, skipped: map[string]int{}}
	m.Remap(cfg.Mediums)
	return m
}

// Remap switches the model to another medium map (nil: the default), as an
// ingester restarted with another map would be: from now on records decode
// through it, and an endpoint written under a map with another fingerprint
// loses its blocks, as by resync, before its next record applies (DESIGN
// v1.1). An endpoint that sends nothing more keeps its blocks.
func (m *Model) Remap(mediums events.MediumMap) {
	if mediums == nil {
		mediums = events.DefaultMediums()
	}
	m.dec = events.NewDecoder(mediums)
	m.mediums = mediums.Fingerprint()
}

// SkippedEvents returns how many decoded events Apply skipped, by the
// ingester's metric label (unknown_type, invalid_event, unknown_medium,
// other_group); a fresh map.
func (m *Model) SkippedEvents() map[string]int {
	out := make(map[string]int, len(m.skipped))
	for k, v := range m.skipped {
		out[k] = v
	}
	return out
}

// remapped drops the blocks of ep when it was written under another medium
// map, and records the current one.
func (m *Model) remapped(st *endpoint) {
	if st.mediums != m.mediums {
		st.clear()
		st.mediums = m.mediums
	}
}

// Apply interprets one record and returns Applied or the reason it was
// skipped.
func (m *Model) Apply(r Record) string {
	if r.Time.After(m.clock) {
		m.clock = r.Time
	}
	m.Expire(m.clock)

	model := r.Headers["model"]
	if keyspace.ValidateName("model", model) != nil {
		return SkipBadModel
	}
	if keyspace.ValidateName("pod", r.Key) != nil {
		return SkipBadKey
	}
	if f, ok := r.Headers["format"]; ok && f != "vllm-msgpack" {
		return SkipUnknownFmt
	}
	kind, isControl := r.Headers["kind"]
	if isControl && kind != "heartbeat" && kind != "goodbye" && kind != "resync" {
		return SkipUnknownKind
	}
	rank, hasRankHeader, ok := parseUint(r.Headers, "dp_rank", 32)
	if !ok {
		return SkipBadDPRank
	}
	if isControl {
		ep := keyspace.Endpoint{Model: model, Pod: r.Key, Rank: uint32(rank)}
		switch kind {
		case "goodbye":
			delete(m.endpoints, ep)
		case "resync":
			if st := m.endpoints[ep]; st != nil {
				m.remapped(st)
				st.clear()
			}
		case "heartbeat":
			st := m.state(ep)
			m.remapped(st)
			st.last = m.clock
		}
		return Applied
	}

	seq, hasSeq, ok := parseUint(r.Headers, "seq", 64)
	if !ok {
		return SkipBadSeq
	}
	if inc := r.Headers["incarnation"]; inc != "" && keyspace.ValidateName("incarnation", inc) != nil {
		return SkipBadIncarn
	}
	if len(r.Value) == 0 {
		return SkipEmptyValue
	}
	batch, err := m.dec.Decode(r.Value)
	if errors.Is(err, events.ErrMalformedBatch) {
		return SkipMalformed
	}
	if hasRankHeader && uint64(batch.Rank) != rank {
		return SkipRankMismatch
	}
	for _, s := range batch.Skipped {
		m.skipped[s.Reason.String()]++
	}
	ep := keyspace.Endpoint{Model: model, Pod: r.Key, Rank: batch.Rank}
	st := m.state(ep)
	m.remapped(st)
	st.last = m.clock

	if hasSeq {
		inc := r.Headers["incarnation"]
		newProcess := func() {
			// Semantics 7's new engine process: its groups are learned
			// afresh.
			st.clear()
			st.group, st.groupSet = 0, false
		}
		switch {
		case inc != "" && st.incarnation != "" && inc != st.incarnation:
			newProcess()
		case st.seq == nil:
			st.clear()
		case seq == *st.seq+1:
		case seq <= *st.seq && batch.TS <= st.ts:
			return SkipDuplicate
		case seq <= *st.seq: // an older seq with a newer ts: a restart
			newProcess()
		default: // a gap
			st.clear()
		}
		s := seq
		st.seq, st.ts = &s, batch.TS
		if inc != "" {
			st.incarnation = inc
		}
	}
	if !st.groupSet {
		// The first attention store of the batch, in event order, fixes
		// the group before any event of the batch applies; leaving
		// provisional group 0 for another group drops what group 0 left.
		for _, ev := range batch.Events {
			if ev.Attention() {
				st.group, st.groupSet = ev.GroupIdx, true
				if ev.GroupIdx != 0 {
					st.clear()
				}
				break
			}
		}
	}
	for _, ev := range batch.Events {
		switch ev.Type {
		case events.BlockStored, events.BlockRemoved:
			if ev.GroupIdx != st.group {
				m.skipped[events.SkipOtherGroup.String()]++
				continue
			}
			if m.cfg.HashMode == keyspace.HashModeToken {
				if ev.Type == events.BlockStored {
					st.storeTokens(ev)
				} else {
					st.removeTokens(ev)
				}
				continue
			}
			for _, h := range ev.BlockHashes {
				if ev.Type == events.BlockStored {
					st.blocks[blockID{ev.Tier, h}] = struct{}{}
				} else {
					delete(st.blocks, blockID{ev.Tier, h})
				}
			}
		case events.AllBlocksCleared:
			st.clear()
		case events.TierBlocksCleared:
			for b := range st.blocks {
				if b.tier == ev.Tier {
					delete(st.blocks, b)
				}
			}
			st.clearTier(ev.Tier)
		}
	}
	return Applied
}

// Group returns the KV-cache group ep indexes, and whether an attention
// store has fixed it (false: provisional group 0, or ep unknown).
func (m *Model) Group(ep keyspace.Endpoint) (group int64, set bool) {
	if st := m.endpoints[ep]; st != nil {
		return st.group, st.groupSet
	}
	return 0, false
}

// Expire drops, as by goodbye, every endpoint whose last batch or heartbeat
// is older than the liveness window at now, and moves the clock to now if
// it is later. A no-op when liveness is off.
func (m *Model) Expire(now time.Time) {
	if now.After(m.clock) {
		m.clock = now
	}
	if m.cfg.LivenessWindow <= 0 {
		return
	}
	for ep, st := range m.endpoints {
		if m.clock.Sub(st.last) > m.cfg.LivenessWindow {
			delete(m.endpoints, ep)
		}
	}
}

func (m *Model) state(ep keyspace.Endpoint) *endpoint {
	st := m.endpoints[ep]
	if st == nil {
		st = &endpoint{blocks: map[blockID]struct{}{}, last: m.clock, mediums: m.mediums}
		m.endpoints[ep] = st
	}
	return st
}

// parseUint reads an optional canonical decimal header: present reports
// whether it was there, ok whether it was valid (true when absent).
func parseUint(h map[string]string, name string, bits int) (v uint64, present, ok bool) {
	s, present := h[name]
	if !present {
		return 0, false, true
	}
	v, err := strconv.ParseUint(s, 10, bits)
	if err != nil || strconv.FormatUint(v, 10) != s {
		return 0, true, false
	}
	return v, true, true
}

// Blocks returns every present (endpoint, tier, block), sorted by
// endpoint, tier, hash.
func (m *Model) Blocks() []keyspace.Block {
	var out []keyspace.Block
	for ep, st := range m.endpoints {
		for b := range st.blocks {
			out = append(out, keyspace.Block{Endpoint: ep, Tier: b.tier, Hash: b.hash})
		}
	}
	SortBlocks(out)
	return out
}

// Endpoints returns every endpoint the model knows (with or without
// blocks), sorted.
func (m *Model) Endpoints() []keyspace.Endpoint {
	out := make([]keyspace.Endpoint, 0, len(m.endpoints))
	for ep := range m.endpoints {
		out = append(out, ep)
	}
	slices.SortFunc(out, keyspace.CompareEndpoints)
	return out
}

// Lookup answers semantics 5 over the model's state.
func (m *Model) Lookup(model string, hashes []uint64) []scenario.Match {
	return LookupBlocks(m.Blocks(), model, hashes)
}

// LookupBlocks answers semantics 5 over any set of present blocks (for
// example, one read back from etcd): per endpoint of model, the longest run
// of leading hashes present in some tier, with the best tier of each;
// endpoints with no leading block are left out. The result is sorted by pod
// and rank.
func LookupBlocks(blocks []keyspace.Block, model string, hashes []uint64) []scenario.Match {
	best := map[keyspace.Endpoint]map[uint64]tier.Tier{}
	for _, b := range blocks {
		if b.Endpoint.Model != model {
			continue
		}
		hs := best[b.Endpoint]
		if hs == nil {
			hs = map[uint64]tier.Tier{}
			best[b.Endpoint] = hs
		}
		if t, ok := hs[b.Hash]; !ok || b.Tier.Better(t) {
			hs[b.Hash] = b.Tier
		}
	}
	var out []scenario.Match
	for ep, hs := range best {
		var tiers []string
		for _, h := range hashes {
			t, ok := hs[h]
			if !ok {
				break
			}
			tiers = append(tiers, t.String())
		}
		if len(tiers) > 0 {
			out = append(out, scenario.Match{Pod: ep.Pod, DPRank: ep.Rank, Blocks: len(tiers), Tiers: tiers})
		}
	}
	slices.SortFunc(out, func(a, b scenario.Match) int {
		return cmp.Or(cmp.Compare(a.Pod, b.Pod), cmp.Compare(a.DPRank, b.DPRank))
	})
	return out
}

// SortBlocks sorts blocks by endpoint (model, pod, rank), tier, hash: the
// order to compare two block sets in.
func SortBlocks(bs []keyspace.Block) {
	slices.SortFunc(bs, func(a, b keyspace.Block) int {
		return cmp.Or(keyspace.CompareEndpoints(a.Endpoint, b.Endpoint), cmp.Compare(a.Tier, b.Tier), cmp.Compare(a.Hash, b.Hash))
	})
}
