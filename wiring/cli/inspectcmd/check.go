package inspectcmd

import (
	"context"
	"fmt"
	"slices"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// checkChunks returns the problems of e's chunks against its record that
// a writer never leaves (DESIGN "The chunk rule"), each on its chunk's
// key: entries of the width of the other hash mode, a sequence past
// keyspace.MaxChunkSeq or at or past the record's chunk_next for the tier
// (the next chunk opened there would overwrite it), and key hashes held
// twice in one tier. The ingester repairs each when it next rebuilds the
// endpoint (a restart, or a partition moving); until then indexd serves
// the chunks as they are. An endpoint whose record does not decode has
// nothing to check against.
func checkChunks(ks keyspace.Keyspace, e *endpointScan) []problem {
	if e.Record == nil {
		return nil
	}
	var probs []problem
	token := e.Record.HashMode == keyspace.HashModeToken
	held := map[tier.Tier]map[uint64]bool{}
	for _, c := range e.Chunks {
		key := ks.ChunkKey(e.Endpoint, c.Tier, c.Seq)
		add := func(format string, args ...any) {
			probs = append(probs, problem{Key: key, Error: fmt.Sprintf(format, args...) + "; the ingester repairs it when it next rebuilds the endpoint"})
		}
		if c.Engine != token {
			width := keyspace.ChunkWidthKey
			if c.Engine {
				width = keyspace.ChunkWidthKeyEngine
			}
			add("chunk entries of width %d in an endpoint of hash mode %s", width, e.Record.HashMode)
		}
		switch next, ok := e.ChunkNext[c.Tier.String()]; {
		case c.Seq > keyspace.MaxChunkSeq:
			add("sequence %d is past the largest a writer uses, %d", c.Seq, uint64(keyspace.MaxChunkSeq))
		case !ok || c.Seq >= next:
			add("sequence %d is at or past the record's chunk_next for %s (%d): the next chunk opened there would overwrite it", c.Seq, c.Tier, next)
		}
		if held[c.Tier] == nil {
			held[c.Tier] = map[uint64]bool{}
		}
		dups, first := 0, uint64(0)
		for _, en := range c.Entries {
			if held[c.Tier][en.Key] {
				if dups == 0 {
					first = en.Key
				}
				dups++
			}
			held[c.Tier][en.Key] = true
		}
		if dups > 0 {
			add("%s already in this chunk or an earlier one of %s (the first %016x)", plural(dups, "key hash"), c.Tier, first)
		}
	}
	return probs
}

// maxOrphanEndpoints bounds how many endpoints orphans names; the chunk
// keys of any more are counted in one problem.
const maxOrphanEndpoints = 100

// orphans names the endpoints that have chunk keys under scope (a
// chunks/ prefix) but no record among eps, with the number of keys of
// each, up to maxOrphanEndpoints of them; unseen is how many chunk keys of
// scope eps does not cover, so the keys past that bound are still
// counted. It reads only the ranges between eps' own chunk prefixes,
// each once: a limited read of each range for its first key, and a count
// of each endpoint found there.
func (s *scanner) orphans(ctx context.Context, scope string, eps []*endpointScan, unseen int64) ([]problem, error) {
	known := make([]string, 0, len(eps)+1)
	for _, e := range eps {
		known = append(known, s.ks.EndpointChunksPrefix(e.Endpoint))
	}
	slices.Sort(known)
	var probs []problem
	named := int64(0)
	from := scope
	for _, gapEnd := range append(known, keyspace.RangeEnd(scope)) {
		for from < gapEnd && len(probs) < maxOrphanEndpoints {
			key, err := s.firstKey(ctx, from, gapEnd)
			if err != nil {
				return nil, err
			}
			if key == "" {
				break
			}
			c, err := s.ks.ParseChunkKey(key)
			if err != nil {
				probs = append(probs, problem{Key: key, Error: "a chunk key under no endpoint record: " + err.Error()})
				named++
				from = key + "\x00"
				continue
			}
			prefix := s.ks.EndpointChunksPrefix(c.Endpoint)
			n, err := s.count(ctx, prefix)
			if err != nil {
				return nil, err
			}
			probs = append(probs, problem{Key: prefix, Error: fmt.Sprintf("%s under no endpoint record (model %q, pod %q, rank %d)", plural(int(n), "chunk key"), c.Endpoint.Model, c.Endpoint.Pod, c.Endpoint.Rank)})
			named += n
			from = keyspace.RangeEnd(prefix)
		}
		from = max(from, keyspace.RangeEnd(gapEnd))
	}
	if rest := unseen - named; rest > 0 {
		probs = append(probs, problem{Key: scope, Error: fmt.Sprintf("%s more under no endpoint record (past the first %d endpoints named)", plural(int(rest), "chunk key"), maxOrphanEndpoints)})
	}
	return probs, nil
}

// firstKey is the first key in [from, end) at the scan's revision, or ""
// when the range is empty.
func (s *scanner) firstKey(ctx context.Context, from, end string) (string, error) {
	ctx, cancel := s.read(ctx)
	defer cancel()
	resp, err := s.kv.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(1), clientv3.WithKeysOnly(), clientv3.WithRev(s.rev))
	if err != nil {
		return "", fmt.Errorf("reading %q: %w", from, err)
	}
	if len(resp.Kvs) == 0 {
		return "", nil
	}
	return string(resp.Kvs[0].Key), nil
}
