// Package indextest holds the reference the index's tests (internal/index
// and indexd) compare against: the obvious model of what etcd holds, with
// DESIGN semantics 5 computed naively; and Chunker, the small keyspace-v2
// writer those tests write chunks with.
package indextest

import (
	"cmp"
	"slices"
	"strings"

	"github.com/kvindex/kvindex/internal/index"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// Reference is a set of present (endpoint, tier, hash) triples, the
// endpoints with records, and the partitions' stored next offsets. Tests
// fill the maps directly.
type Reference struct {
	Present map[keyspace.Block]bool
	Records map[keyspace.Endpoint]bool
	Offsets map[keyspace.Partition]int64
	// Meta holds what the reference knows of endpoint records' contents;
	// optional (a test that leaves it empty gets matches with BlockSize 0
	// and no token-mode endpoint). An entry counts only while Records
	// holds the endpoint.
	Meta map[keyspace.Endpoint]Meta
}

// Meta is the part of an endpoint record the reference models.
type Meta struct {
	BlockSize uint32
	HashMode  keyspace.HashMode
}

// NewReference returns an empty reference.
func NewReference() *Reference {
	return &Reference{Present: map[keyspace.Block]bool{}, Records: map[keyspace.Endpoint]bool{}, Offsets: map[keyspace.Partition]int64{},
		Meta: map[keyspace.Endpoint]Meta{}}
}

// meta is ep's record contents, zero without a record.
func (r *Reference) meta(ep keyspace.Endpoint) Meta {
	if !r.Records[ep] {
		return Meta{}
	}
	return r.Meta[ep]
}

// LookupTokens is index.Index.LookupTokens's answer computed the slow
// way: every endpoint of model (or of candidates, when non-nil) whose
// record says token mode with a block size is matched against keys(size)
// on its own. Past index.MaxTokenBlockSizes sizes, only the sizes whose
// endpoints hold the most blocks (every tier; the smaller size on a tie)
// are kept; leftOut is the endpoints and the sizes left out.
func (r *Reference) LookupTokens(model string, keys func(blockSize int) []uint64, candidates []keyspace.Endpoint) (out []index.Match, leftOut [2]int) {
	eps := map[keyspace.Endpoint]bool{}
	if candidates != nil {
		for _, c := range candidates {
			c.Model = model
			eps[c] = true
		}
	} else {
		for ep := range r.Records {
			if ep.Model == model {
				eps[ep] = true
			}
		}
	}
	held := map[uint32]int{}
	for ep := range eps {
		m := r.meta(ep)
		if !r.Records[ep] || m.HashMode != keyspace.HashModeToken || m.BlockSize == 0 {
			delete(eps, ep)
			continue
		}
		held[m.BlockSize] += 0 // the size counts with no block too
		for b := range r.Present {
			if b.Endpoint == ep {
				held[m.BlockSize]++
			}
		}
	}
	sizes := make([]uint32, 0, len(held))
	for s := range held {
		sizes = append(sizes, s)
	}
	slices.SortFunc(sizes, func(a, b uint32) int {
		if held[a] != held[b] {
			return held[b] - held[a]
		}
		return int(a) - int(b)
	})
	kept := map[uint32]bool{}
	for i, s := range sizes {
		if i < index.MaxTokenBlockSizes {
			kept[s] = true
		} else {
			leftOut[1]++
		}
	}
	for ep := range eps {
		size := r.meta(ep).BlockSize
		if !kept[size] {
			leftOut[0]++
			continue
		}
		out = append(out, r.Lookup(model, keys(int(size)), []keyspace.Endpoint{ep})...)
	}
	SortMatches(out)
	return out, leftOut
}

// Lookup is index.Index.Lookup's answer computed the slow way: per
// endpoint of model (restricted to candidates when non-nil) the run of
// leading hashes present in some tier, with the best tier of each.
func (r *Reference) Lookup(model string, hashes []uint64, candidates []keyspace.Endpoint) []index.Match {
	eps := map[keyspace.Endpoint]bool{}
	for b := range r.Present {
		if b.Endpoint.Model == model {
			eps[b.Endpoint] = true
		}
	}
	if candidates != nil {
		allowed := map[keyspace.Endpoint]bool{}
		for _, c := range candidates {
			c.Model = model
			allowed[c] = true
		}
		for ep := range eps {
			if !allowed[ep] {
				delete(eps, ep)
			}
		}
	}
	var out []index.Match
	for ep := range eps {
		var ts []tier.Tier
		for _, h := range hashes {
			best := tier.Unknown
			for _, t := range tier.All {
				if r.Present[keyspace.Block{Endpoint: ep, Tier: t, Hash: h}] && t.Better(best) {
					best = t
				}
			}
			if best == tier.Unknown {
				break
			}
			ts = append(ts, best)
		}
		if len(ts) > 0 {
			out = append(out, index.Match{Endpoint: ep, Blocks: len(ts), Tiers: ts, BlockSize: r.meta(ep).BlockSize})
		}
	}
	SortMatches(out)
	return out
}

// Endpoints is index.Index.ListEndpoints's answer for model (every model
// when empty) without the fields taken from records (LastSeen, BlockSize,
// Partition, HashMode), which the reference does not keep.
func (r *Reference) Endpoints(model string) []index.EndpointInfo {
	infos := map[keyspace.Endpoint]*index.EndpointInfo{}
	get := func(ep keyspace.Endpoint) *index.EndpointInfo {
		if infos[ep] == nil {
			infos[ep] = &index.EndpointInfo{Endpoint: ep}
		}
		return infos[ep]
	}
	for b := range r.Present {
		get(b.Endpoint).Blocks[b.Tier-1]++
	}
	for ep := range r.Records {
		get(ep).Record = true
	}
	var out []index.EndpointInfo
	for ep, info := range infos {
		if model == "" || ep.Model == model {
			out = append(out, *info)
		}
	}
	slices.SortFunc(out, func(a, b index.EndpointInfo) int { return keyspace.CompareEndpoints(a.Endpoint, b.Endpoint) })
	return out
}

// SortMatches orders ms as Lookup does: blocks descending, then pod, then
// rank.
func SortMatches(ms []index.Match) {
	slices.SortFunc(ms, func(a, b index.Match) int {
		if c := cmp.Compare(b.Blocks, a.Blocks); c != 0 {
			return c
		}
		if c := strings.Compare(a.Endpoint.Pod, b.Endpoint.Pod); c != 0 {
			return c
		}
		return cmp.Compare(a.Endpoint.Rank, b.Endpoint.Rank)
	})
}
