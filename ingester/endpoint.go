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

// shard is one lease an (endpoint, tier)'s chunk keys attach to; keys is an
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
// the chunk rule its chunks (chunks.go), the writer what it knows of etcd
// (inEtcd, storedGen).
type endpoint struct {
	id keyspace.Endpoint
	// key is the endpoint record's key, memberKey its key under the
	// partition's members/, chunksPrefix the prefix of its chunk keys
	// (computed once: every chunk key starts with it).
	key          string
	memberKey    string
	chunksPrefix string

	// cur is the state after the last applied record.
	cur seqState
	// outageCredit is the outage watch's credit when cur.lastRecord was
	// set (or when the partition was claimed): outage time after it does
	// not age the endpoint (liveness).
	outageCredit time.Duration
	// base is the state as of the partition's stored offset (the window
	// start); nil when the endpoint did not exist then. baseNext is
	// chunk_next of each tier as of then (what a record written before
	// the window's last transaction carries).
	base     *seqState
	baseNext [tier.Count + 1]uint64

	// chunks is the chunk state of each tier, indexed by tier.Tier: every
	// chunk of the endpoint in etcd once the window is written.
	chunks [tier.Count + 1]tierChunks

	// lease is the endpoint record's lease (0 until granted).
	lease clientv3.LeaseID
	// tiers are the lease shards of each tier, oldest first, indexed by
	// tier.Tier.
	tiers [tier.Count + 1][]shard

	// inEtcd: a record of this endpoint exists in etcd as far as the
	// worker knows.
	inEtcd bool
	// dropAtClaim, when set, is why worker.init drops the endpoint, its
	// chunks and its record before the first record: "malformed_record"
	// (the record etcd holds does not decode, loadEndpoints) or
	// "sequence_exhausted" (a chunk sequence near keyspace.MaxChunkSeq,
	// worker.rebuild).
	dropAtClaim string
	// probed: clearForeign has read etcd for chunk keys of this endpoint
	// object (new endpoints only, once).
	probed bool
	// leaseGen counts changes of the lease set; storedGen is the leaseGen
	// of the newest record known to be committed (the leases are dirty
	// while they differ). Generations, not a flag: a lease repair between
	// the parts of a window changes the set after a part wrote a copy of
	// the record (txnBuilder.recs notes the generation each copy was
	// written with).
	leaseGen, storedGen uint64
	// dirty: the window changed it; the window's last transaction writes
	// it.
	dirty bool
	// lastWrite is, per tier, where the window's chunkChanged last put a
	// write of this endpoint: an index into window.writes that the window
	// checks before use, so a stale one (a later window) costs nothing.
	lastWrite [tier.Count + 1]int32
	// gone: dropped with its record (goodbye, expiry); a later record of
	// the same endpoint starts a new state.
	gone bool
	// pred is the endpoint of the same identity that the open window
	// dropped with its record while etcd holds that record (nil when
	// none): until the window's last transaction, the record etcd has is
	// its predecessor's, as of the stored offset, and an early part must
	// not overwrite it (packer.addChunk), or a successor after a crash
	// would read another state than the stored offset's.
	pred *endpoint

	// hashMode is the hash mode of its blocks: the worker's for an
	// endpoint it created, the stored record's for one it loaded (until a
	// mismatch is dropped and rewritten, worker.init).
	hashMode keyspace.HashMode
	// engine maps the endpoint's engine hashes to canonical keys in token
	// mode (enginemap.go); nil in engine-hash mode or while empty.
	engine engineMap
	// fixes are the chunks whose rebuilt state differs from their value
	// in etcd (entries that could not be kept, rebuild.go): the worker
	// writes them, at the state kept, before the first record.
	fixes []chunkFix
}

// chunkFix is one chunk of an endpoint the rebuild had to change.
type chunkFix struct {
	tier tier.Tier
	seq  uint64
}

// leasesChanged records a change of the lease set: the next transaction
// that puts a key of the endpoint also rewrites its record.
func (e *endpoint) leasesChanged() { e.leaseGen++ }

// leasesDirty reports whether the lease set changed since the newest
// record known to be committed was written.
func (e *endpoint) leasesDirty() bool { return e.leaseGen != e.storedGen }

func newEndpoint(ks keyspace.Keyspace, p keyspace.Partition, id keyspace.Endpoint) *endpoint {
	return &endpoint{id: id, key: ks.EndpointKey(id), memberKey: ks.MemberKey(p, id), chunksPrefix: ks.EndpointChunksPrefix(id)}
}

// record builds the endpoint record to store from state st and the
// current leases, with chunk_next as it is now (live) or as of the stored
// offset (baseNext).
func (e *endpoint) record(st *seqState, live bool, p keyspace.Partition) keyspace.EndpointRecord {
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
	for _, t := range tier.All {
		next := e.baseNext[t]
		if live {
			next = e.chunks[t].next
		}
		if next == 0 {
			continue
		}
		if r.ChunkNext == nil {
			r.ChunkNext = make(map[string]uint64, tier.Count)
		}
		r.ChunkNext[t.String()] = next
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
	for _, t := range tier.All {
		e.chunks[t].next = r.ChunkNext[t.String()]
	}
	e.baseNext = e.chunkNext()
	e.hashMode = r.HashMode
	e.inEtcd = true
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

// holds reports whether id is one of the lease shards of ep's tier t.
func (e *endpoint) holds(t tier.Tier, id clientv3.LeaseID) bool {
	if id == 0 {
		return false
	}
	for _, s := range e.tiers[t] {
		if s.id == id {
			return true
		}
	}
	return false
}
