package ingester

import (
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// seqState is the part of an endpoint record that decides what later
// records do (DESIGN semantics 7 and 8). It is written to etcd only in the
// transaction that advances the offset past the record that set it.
type seqState struct {
	seq         *uint64
	batchTS     float64
	incarnation string
	lastRecord  time.Time
	blockSize   uint32
	// group is the KV-cache group indexed: provisional group 0 until an
	// attention store fixes it (groupSet; DESIGN v1.1, docs/semantics.md).
	group    int64
	groupSet bool
	// mediums is the fingerprint of the medium map the endpoint's keys
	// were written under; empty for a record from before v1.1.
	mediums string
}

// shard is one lease an (endpoint, tier)'s block keys attach to; keys is an
// upper bound of the keys attached (DESIGN "Writes: leases").
type shard struct {
	id   clientv3.LeaseID
	keys int
	// window and unsent count the keys assigned in the batch window being
	// written (worker.window), which etcd may not count yet: its
	// transactions are built before earlier ones of the window commit.
	window uint64
	unsent int
}

// endpoint is a partition worker's state of one endpoint whose records
// arrive on its partition: all of it, in one struct. The apply part reads
// and changes the sequence state (cur), the lease manager the lease fields,
// the writer what it knows of etcd (inEtcd, mayHaveBlocks, storedGen).
type endpoint struct {
	id keyspace.Endpoint
	// key is the endpoint record's key, memberKey its key under the
	// partition's members/, blocksPrefix the prefix of its block keys
	// (computed once: every block key starts with it).
	key          string
	memberKey    string
	blocksPrefix string

	// cur is the state after the last applied record.
	cur seqState
	// outageCredit is the outage watch's credit when cur.lastRecord was
	// set (or when the partition was claimed): outage time after it does
	// not age the endpoint (liveness).
	outageCredit time.Duration
	// base is the state as of the partition's stored offset (the window
	// start); nil when the endpoint did not exist then.
	base *seqState

	// lease is the endpoint record's lease (0 until granted).
	lease clientv3.LeaseID
	// tiers are the lease shards of each tier, oldest first, indexed by
	// tier.Tier.
	tiers [tier.Count + 1][]shard

	// inEtcd: a record of this endpoint exists in etcd as far as the
	// worker knows. mayHaveBlocks: etcd may hold block keys of it (false
	// only after a drop, or for an endpoint created by this worker).
	inEtcd        bool
	mayHaveBlocks bool
	// leaseGen counts changes of the lease set; storedGen is the leaseGen
	// of the newest record known to be committed (the leases are dirty
	// while they differ). Generations, not a flag, because several
	// transactions may be in flight, each with its own copy of the record
	// (txnBuilder.recs notes the generation each copy was written with).
	leaseGen, storedGen uint64
	// dirty: the window changed it; the commit transaction writes it.
	dirty bool
	// gone: dropped with its record (goodbye, expiry); a later record of
	// the same endpoint starts a new state.
	gone bool
	// epoch voids pending ops of earlier epochs (a drop increments it);
	// tierEpoch does so for one tier (a tier clear increments it).
	epoch     uint32
	tierEpoch [tier.Count + 1]uint32

	// hashMode is the hash mode of its block keys: the worker's for an
	// endpoint it created, the stored record's for one it loaded (until a
	// mismatch is dropped and rewritten, worker.init).
	hashMode keyspace.HashMode
	// engine maps the endpoint's engine hashes to canonical keys in token
	// mode (enginemap.go); nil in engine-hash mode or while empty.
	engine engineMap
	// unmapped are the blocks the map rebuild found that cannot enter the
	// map (rebuild.go); the worker deletes them before the first record.
	unmapped []tierKey
}

// tierKey is one block key of an endpoint: its tier and key hash.
type tierKey struct {
	tier tier.Tier
	key  uint64
}

// leasesChanged records a change of the lease set: the next transaction
// that puts a key of the endpoint also rewrites its record.
func (e *endpoint) leasesChanged() { e.leaseGen++ }

// leasesDirty reports whether the lease set changed since the newest
// record known to be committed was written.
func (e *endpoint) leasesDirty() bool { return e.leaseGen != e.storedGen }

func newEndpoint(ks keyspace.Keyspace, p keyspace.Partition, id keyspace.Endpoint) *endpoint {
	return &endpoint{id: id, key: ks.EndpointKey(id), memberKey: ks.MemberKey(p, id), blocksPrefix: ks.EndpointBlocksPrefix(id)}
}

// record builds the endpoint record to store from state st and the current
// leases.
func (e *endpoint) record(st *seqState, p keyspace.Partition) keyspace.EndpointRecord {
	r := keyspace.EndpointRecord{
		BlockSize:   st.blockSize,
		HashMode:    e.hashMode,
		Seq:         st.seq,
		BatchTS:     st.batchTS,
		Incarnation: st.incarnation,
		LastRecord:  st.lastRecord.UTC(),
		Topic:       p.Topic,
		Partition:   p.Partition,
		Lease:       keyspace.LeaseID(e.lease),
		MediumMap:   st.mediums,
	}
	if st.groupSet {
		g := st.group
		r.AttentionGroup = &g
	}
	for _, t := range tier.All {
		if len(e.tiers[t]) == 0 {
			continue
		}
		if r.TierLeases == nil {
			r.TierLeases = make(map[string][]keyspace.LeaseShard, tier.Count)
		}
		shards := make([]keyspace.LeaseShard, len(e.tiers[t]))
		for i, s := range e.tiers[t] {
			shards[i] = keyspace.LeaseShard{ID: keyspace.LeaseID(s.id), Keys: s.keys}
		}
		r.TierLeases[t.String()] = shards
	}
	return r
}

// fromRecord loads a stored record into a fresh endpoint.
func (e *endpoint) fromRecord(r *keyspace.EndpointRecord) {
	st := seqState{batchTS: r.BatchTS, incarnation: r.Incarnation, lastRecord: r.LastRecord, blockSize: r.BlockSize, mediums: r.MediumMap}
	if r.Seq != nil {
		s := *r.Seq
		st.seq = &s
	}
	if r.AttentionGroup != nil {
		st.group, st.groupSet = *r.AttentionGroup, true
	}
	e.cur = st
	base := st
	e.base = &base
	e.lease = clientv3.LeaseID(r.Lease)
	for _, t := range tier.All {
		for _, s := range r.Shards(t) {
			e.tiers[t] = append(e.tiers[t], shard{id: clientv3.LeaseID(s.ID), keys: s.Keys})
		}
	}
	e.hashMode = r.HashMode
	e.inEtcd = true
	e.mayHaveBlocks = true
}

// leaseIDs appends every lease of the endpoint to dst.
func (e *endpoint) leaseIDs(dst []clientv3.LeaseID) []clientv3.LeaseID {
	if e.lease != 0 {
		dst = append(dst, e.lease)
	}
	for _, t := range tier.All {
		for _, s := range e.tiers[t] {
			dst = append(dst, s.id)
		}
	}
	return dst
}
