package migrate

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// v1Block is one v1 block key as read.
type v1Block struct {
	entry keyspace.ChunkEntry
	// created is the key's create revision: v1 blocks in insertion order.
	created int64
	lease   int64
}

// convertEndpoints converts every v1 endpoint, one at a time.
func (m *migration) convertEndpoints(ctx context.Context) error {
	err := m.r.prefix(ctx, m.from.EndpointsPrefix(), false, func(kv *mvccpb.KeyValue) error {
		ep, err := m.from.ParseEndpointKey(string(kv.Key))
		if err != nil {
			m.skip("bad_endpoint_key", string(kv.Key), err)
			return nil
		}
		return m.convertEndpoint(ctx, ep, kv)
	})
	if err != nil {
		return fmt.Errorf("migrate: endpoints: %w", err)
	}
	return nil
}

// convertEndpoint writes ep's v2 record and chunks from its v1 record
// (recKV) and blocks, and deletes the v2 chunks of ep the conversion does
// not have.
func (m *migration) convertEndpoint(ctx context.Context, ep keyspace.Endpoint, recKV *mvccpb.KeyValue) error {
	blocksPrefix := v1EndpointBlocksPrefix(m.from, ep)
	rec, err := keyspace.UnmarshalEndpointRecord(recKV.Value)
	if err != nil {
		m.skip("bad_endpoint_record", string(recKV.Key), err)
		n, err := m.r.count(ctx, blocksPrefix)
		if err != nil {
			return err
		}
		m.v1Blocks += n
		m.rep.Skipped["blocks_without_record"] += int(n)
		return nil
	}
	token := rec.HashMode == keyspace.HashModeToken
	var tiers [tier.Count + 1][]v1Block
	err = m.r.prefix(ctx, blocksPrefix, false, func(kv *mvccpb.KeyValue) error {
		m.v1Blocks++
		t, h, err := v1ParseBlockKey(blocksPrefix, string(kv.Key))
		if err != nil {
			m.skip("bad_block_key", string(kv.Key), err)
			return nil
		}
		b := v1Block{entry: keyspace.ChunkEntry{Key: h, Engine: h}, created: kv.CreateRevision, lease: kv.Lease}
		if token {
			if b.entry.Engine, err = v1ParseEngineHash(kv.Value); err != nil {
				m.skip("bad_engine_hash", string(kv.Key), err)
				return nil
			}
		}
		tiers[t] = append(tiers[t], b)
		return nil
	})
	if err != nil {
		return err
	}

	// The v2 state of ep as it is.
	current := map[string]*mvccpb.KeyValue{}
	if err := m.r.prefix(ctx, m.to.EndpointChunksPrefix(ep), false, func(kv *mvccpb.KeyValue) error {
		current[string(kv.Key)] = kv
		return nil
	}); err != nil {
		return err
	}
	m.v2Chunks += int64(len(current))
	recKey := m.to.EndpointKey(ep)
	currentRec, err := m.r.get(ctx, recKey)
	if err != nil {
		return err
	}

	// The chunks: each tier's blocks in insertion order, ChunkSize at a
	// time, on the lease of each chunk's first block (its first block on
	// a lease).
	type chunk struct {
		key   string
		value []byte
		lease int64
	}
	var chunks []chunk
	perLease := map[int64]int{}
	shards := map[string][]keyspace.LeaseShard{}
	for name, s := range rec.TierLeases {
		shards[name] = slices.Clone(s)
	}
	next := map[string]uint64{}
	entries := make([]keyspace.ChunkEntry, 0, m.cfg.ChunkSize)
	for _, t := range tier.All {
		bs := tiers[t]
		slices.SortFunc(bs, func(a, b v1Block) int {
			return cmp.Or(cmp.Compare(a.created, b.created), cmp.Compare(a.entry.Key, b.entry.Key))
		})
		var seq uint64
		for part := range slices.Chunk(bs, m.cfg.ChunkSize) {
			entries = entries[:0]
			for _, b := range part {
				entries = append(entries, b.entry)
			}
			// The first block's lease; a block on none (written by hand:
			// an ingester puts every block on one) does not leave the
			// chunk on none while another of its blocks has one, or the
			// chunk would never expire.
			lease := part[0].lease
			for _, b := range part {
				if b.lease != 0 {
					lease = b.lease
					break
				}
			}
			chunks = append(chunks, chunk{key: m.to.ChunkKey(ep, t, seq), value: keyspace.AppendChunkValue(nil, entries, token), lease: lease})
			perLease[lease]++
			if lease != 0 && !slices.ContainsFunc(shards[t.String()], func(s keyspace.LeaseShard) bool { return int64(s.ID) == lease }) {
				// A lease the record did not list (it should have):
				// list it, so the ingester keeps it alive.
				shards[t.String()] = append(shards[t.String()], keyspace.LeaseShard{ID: keyspace.LeaseID(lease)})
			}
			seq++
		}
		if seq > 0 {
			next[t.String()] = seq
		}
		m.rep.Blocks[t.String()] += len(bs)
		m.rep.Chunks[t.String()] += int(seq)
	}
	for name, s := range shards {
		for i := range s {
			s[i].Keys = perLease[int64(s[i].ID)]
		}
		shards[name] = s
	}
	value, err := v2Record(recKV.Value, shards, next)
	if err != nil {
		m.skip("bad_endpoint_record", string(recKV.Key), err)
		return nil
	}

	// Every lease written to must still be live: one that expired since
	// the read took its v1 keys with it, and the run starts over.
	if err := m.leaseTTL(ctx, clientv3.LeaseID(recKV.Lease)); err != nil {
		return err
	}
	for _, id := range slices.Sorted(maps.Keys(perLease)) {
		if err := m.leaseTTL(ctx, clientv3.LeaseID(id)); err != nil {
			return err
		}
	}

	m.endpoints[ep] = true
	m.rep.Endpoints++
	if token {
		m.rep.TokenEndpoints++
	}
	if err := m.want(ctx, currentRec, recKey, value, recKV.Lease); err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, c := range chunks {
		keep[c.key] = true
		if err := m.want(ctx, current[c.key], c.key, c.value, c.lease); err != nil {
			return err
		}
	}
	return m.deleteExtra(ctx, current, keep)
}

// dropGoneEndpoints deletes the v2 endpoints that v1 does not have (an
// endpoint that expired between two runs): their chunks, then their
// records.
func (m *migration) dropGoneEndpoints(ctx context.Context) error {
	var gone []*mvccpb.KeyValue
	err := m.r.prefix(ctx, m.to.EndpointsPrefix(), true, func(kv *mvccpb.KeyValue) error {
		ep, err := m.to.ParseEndpointKey(string(kv.Key))
		if err == nil && m.endpoints[ep] {
			return nil
		}
		gone = append(gone, kv)
		return nil
	})
	if err != nil {
		return fmt.Errorf("migrate: v2 endpoints: %w", err)
	}
	for _, kv := range gone {
		if ep, err := m.to.ParseEndpointKey(string(kv.Key)); err == nil {
			chunks := map[string]*mvccpb.KeyValue{}
			if err := m.r.prefix(ctx, m.to.EndpointChunksPrefix(ep), true, func(c *mvccpb.KeyValue) error {
				chunks[string(c.Key)] = c
				return nil
			}); err != nil {
				return err
			}
			m.v2Chunks += int64(len(chunks))
			if err := m.deleteExtra(ctx, chunks, nil); err != nil {
				return err
			}
		}
		if err := m.b.del(ctx, string(kv.Key)); err != nil {
			return err
		}
	}
	return nil
}

// countOrphans counts the v1 block keys under no v1 record (not
// converted) and the v2 chunk keys under no endpoint this run read (left
// alone): one count-only read of each section.
func (m *migration) countOrphans(ctx context.Context) error {
	n, err := m.r.count(ctx, v1BlocksPrefix(m.from))
	if err != nil {
		return err
	}
	if d := n - m.v1Blocks; d > 0 {
		m.rep.Skipped["blocks_without_record"] += int(d)
		m.log.Warn("v1 block keys under no endpoint record are not migrated", "keys", d, "prefix", v1BlocksPrefix(m.from))
	}
	if n, err = m.r.count(ctx, m.to.ChunksPrefix()); err != nil {
		return err
	}
	if d := n - m.v2Chunks; d > 0 {
		m.rep.Skipped["v2_chunks_without_record"] += int(d)
		m.log.Warn("v2 chunk keys under no endpoint are left alone", "keys", d, "prefix", m.to.ChunksPrefix())
	}
	return nil
}

// sortedKVs returns the values of kvs in key order.
func sortedKVs(kvs map[string]*mvccpb.KeyValue) []*mvccpb.KeyValue {
	out := slices.Collect(maps.Values(kvs))
	slices.SortFunc(out, func(a, b *mvccpb.KeyValue) int { return cmp.Compare(string(a.Key), string(b.Key)) })
	return out
}
