package ingester

import (
	"context"
	"errors"
	"fmt"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/backoff"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// rebuildStats describes one partition's rebuild, for logs and tests.
type rebuildStats struct {
	// Revision is the etcd revision every page was read at: the stored
	// offset's (the state the replay starts from), or, when none is
	// stored or it was compacted, the newest one at or after the claim's.
	Revision int64
	// Latest reports that the rebuild read the newest revision instead of
	// the stored offset's.
	Latest bool
	// Chunks and Pages count the chunk keys read and the Range calls;
	// Blocks the entries kept.
	Chunks, Pages, Blocks int
	// Entries is the partition's token-mode map entries after the
	// rebuild.
	Entries int
	// Unmapped counts the entries that could not be kept (their chunks
	// are rewritten without them before the first record).
	Unmapped int
	// Leftovers counts the chunks etcd holds otherwise than at the stored
	// offset (written back before the first record).
	Leftovers int
	// Unleased counts the chunks on no lease, or on one their record does
	// not name (rewritten onto one of the tier's leases before the first
	// record).
	Unleased int
}

// seqHeadroom is how far below keyspace.MaxChunkSeq a rebuilt chunk_next
// may come before the endpoint is dropped at the claim (2^32 chunk opens:
// more than a writer makes between two drops of an endpoint, each of
// which resets it to 0).
const seqHeadroom = 1 << 32

// rebuildPageChunkOverhead approximates a chunk key-value's framing in a
// Range response, besides its key and value bytes, when sizing pages.
const rebuildPageChunkOverhead = 48

// rebuild fills the chunk state of w's endpoints, and in token mode their
// engine-hash maps, from etcd before the worker applies anything (DESIGN
// "The chunk rule (writer)", "Hashing"): for every loaded endpoint it
// lists its chunks/ range, in pages of at most MapRebuildPageBytes, and
// takes each chunk's entries, its key's sequence number and its lease;
// chunk_next comes from the endpoint record (raised past the highest
// sequence found, should a record lag its chunks).
//
// Every page is read at the revision of the stored offset (w.offsetRev,
// which the claim read after every committed write of a previous owner):
// the state is then the one the records before the stored offset made,
// which is what the replay's decisions must read. The newest revision
// would also hold what an uncommitted window's early parts wrote before a
// crash: the replay would then open, fill and merge other chunks than the
// run that never crashed. Only when no offset is stored, or its revision
// was compacted away, is the newest revision read (at or after the
// claim's, so every write of a previous owner is in, or fenced out).
//
// An entry that cannot be kept would be a ghost, since no removal could
// reach it: one of a value that does not decode or has the other hash
// mode's width, a key already present in another chunk of its tier, or in
// token mode a second key of an engine hash already mapped (left by a
// window that crashed between its parts). Its chunk is rewritten without
// it (deleted when nothing is left) before the first record (worker.init),
// and it is counted.
func (w *worker) rebuild(ctx context.Context) (rebuildStats, error) {
	var st rebuildStats
	start := time.Now()
	st.Revision = w.offsetRev
	st.Latest = st.Revision == 0
	for {
		err := w.rebuildAt(ctx, &st)
		if err == nil {
			break
		}
		if !isCompacted(err) {
			return st, err
		}
		// The pinned revision was compacted away mid-rebuild: start over
		// at the newest one (still at or after the claim's).
		if st.Revision == w.offsetRev {
			w.log.Warn("the stored offset's revision was compacted; rebuilding the chunk state at the newest revision, which may hold writes of an uncommitted window",
				"revision", st.Revision)
		} else {
			w.log.Warn("rebuild's revision was compacted; starting over", "revision", st.Revision)
		}
		for _, ep := range w.eps {
			w.forgetChunks(ep)
		}
		st = rebuildStats{Latest: true}
	}
	for _, ep := range w.eps {
		for _, t := range tier.All {
			// (Read at the newest revision, a crashed window's early parts
			// may legitimately be past the record.)
			if rec, got := ep.baseNext[t], ep.chunks[t].next; got > rec && ep.dropAtClaim == "" && !st.Latest {
				w.log.Warn("an endpoint record's chunk_next is at or below a chunk etcd holds (a writer never leaves that); raised past it",
					"endpoint", ep.id.String(), "tier", t.String(), "record", rec, "raised_to", got)
			}
		}
		ep.baseNext = ep.chunkNext() // raised past the sequences found
		for _, t := range tier.All {
			if next := ep.chunks[t].next; next > keyspace.MaxChunkSeq+1-seqHeadroom && ep.dropAtClaim == "" {
				// No writer gets near: chunk keys or a record written by
				// something else. Opening on would go past MaxChunkSeq;
				// the drop deletes the record, which resets chunk_next.
				w.log.Warn("an endpoint's chunk sequences are near the largest a writer uses; dropping the endpoint and its chunks, its next records start it afresh",
					"endpoint", ep.id.String(), "tier", t.String(), "chunk_next", next)
				ep.dropAtClaim = "sequence_exhausted"
			}
		}
	}
	st.Entries = w.ap.maps.entries
	w.m.mapRebuilt.Add(float64(st.Entries))
	if w.ap.tokenMode() {
		w.m.mapEntries.WithLabelValues(partitionLabel(w.p.Partition)).Set(float64(st.Entries))
	}
	w.log.Info("chunk state rebuilt", "revision", st.Revision, "latest", st.Latest, "chunks", st.Chunks, "pages", st.Pages, "blocks", st.Blocks,
		"map_entries", st.Entries, "unmapped", st.Unmapped, "leftovers", st.Leftovers, "unleased", st.Unleased, "seconds", time.Since(start).Seconds())
	return st, nil
}

// forgetChunks empties ep's rebuilt state (before a rebuild starts over).
func (w *worker) forgetChunks(ep *endpoint) {
	w.ap.maps.clear(ep)
	for _, t := range tier.All {
		ep.chunks[t] = tierChunks{next: ep.baseNext[t]}
	}
	ep.fixes = nil
}

// rebuildAt runs one rebuild pass, pinning st.Revision at its first page.
func (w *worker) rebuildAt(ctx context.Context, st *rebuildStats) error {
	for _, ep := range w.eps {
		token := ep.hashMode == keyspace.HashModeToken
		perChunk := len(ep.chunksPrefix) + maxTierLen + 16 + keyspace.ChunkValueLen(w.ap.rule.size, token) + rebuildPageChunkOverhead
		limit := int64(max(1, w.cfg.MapRebuildPageBytes/perChunk))
		from := []byte(ep.chunksPrefix)
		end := []byte(keyspace.RangeEnd(ep.chunksPrefix))
		for {
			var resp *pb.RangeResponse
			err := backoff.Retry(ctx, retryBackoff(), func(ctx context.Context) error {
				var err error
				resp, err = w.kv.Range(ctx, &pb.RangeRequest{Key: from, RangeEnd: end, Limit: limit, Revision: st.Revision})
				if isCompacted(err) {
					resp = nil
					return nil // handled below, not retried
				}
				return err
			}, nil)
			if err != nil {
				return fmt.Errorf("%w: rebuilding the chunk state of %s: %v", ErrClaim, ep.id, err)
			}
			if resp == nil {
				return rpctypes.ErrCompacted
			}
			st.Pages++
			if st.Pages == 1 && resp.Header.Revision < w.claimRev {
				return fmt.Errorf("%w: etcd answered at revision %d, before the claim's %d", ErrClaim, resp.Header.Revision, w.claimRev)
			}
			if st.Revision == 0 {
				st.Revision = resp.Header.Revision
			}
			for _, kv := range resp.Kvs {
				st.Chunks++
				w.rebuildChunk(ep, kv.Key, kv.Value, clientv3.LeaseID(kv.Lease), st)
			}
			if !resp.More || len(resp.Kvs) == 0 {
				break
			}
			from = append(append([]byte{}, resp.Kvs[len(resp.Kvs)-1].Key...), 0)
		}
		if !st.Latest {
			if err := w.findLeftovers(ctx, ep, st); err != nil {
				return err
			}
		}
	}
	return nil
}

// findLeftovers lists ep's chunk keys at the newest revision, keys only,
// and marks for writing (ep.fixes) every chunk that differs from the
// state at the stored offset: a key written after it (ModRevision past
// st.Revision) and a chunk of the state that is gone. Those are what a
// window that crashed before its last part left behind; written back to
// the state as of the stored offset before the first record, they cannot
// outlive the replay: otherwise a window the replay commits would make a
// leftover of a later record part of "the state at the stored offset"
// for the owner after the next crash, and that owner would fill other
// chunks than a run that never crashed.
func (w *worker) findLeftovers(ctx context.Context, ep *endpoint, st *rebuildStats) error {
	ks := w.cfg.Keyspace
	var seen [tier.Count + 1]map[uint64]bool
	from := []byte(ep.chunksPrefix)
	end := []byte(keyspace.RangeEnd(ep.chunksPrefix))
	for {
		var resp *pb.RangeResponse
		err := backoff.Retry(ctx, retryBackoff(), func(ctx context.Context) error {
			var err error
			resp, err = w.kv.Range(ctx, &pb.RangeRequest{Key: from, RangeEnd: end, Limit: 10_000, KeysOnly: true})
			return err
		}, nil)
		if err != nil {
			return fmt.Errorf("%w: listing the chunks of %s: %v", ErrClaim, ep.id, err)
		}
		st.Pages++
		for _, kv := range resp.Kvs {
			prefix, t, seq, err := ks.SplitChunkKey(string(kv.Key))
			if err != nil || prefix != ep.chunksPrefix {
				continue
			}
			if seen[t] == nil {
				seen[t] = map[uint64]bool{}
			}
			seen[t][seq] = true
			if kv.ModRevision > st.Revision {
				ep.fixes = append(ep.fixes, chunkFix{tier: t, seq: seq})
				st.Leftovers++
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = append(append([]byte{}, resp.Kvs[len(resp.Kvs)-1].Key...), 0)
	}
	for _, t := range tier.All {
		for seq := range ep.chunks[t].chunks {
			if !seen[t][seq] {
				ep.fixes = append(ep.fixes, chunkFix{tier: t, seq: seq})
				st.Leftovers++
			}
		}
	}
	return nil
}

// rebuildChunk enters one chunk key-value of ep into its state.
func (w *worker) rebuildChunk(ep *endpoint, key, value []byte, lease clientv3.LeaseID, st *rebuildStats) {
	prefix, t, seq, err := w.cfg.Keyspace.SplitChunkKey(string(key))
	if err != nil || prefix != ep.chunksPrefix {
		return // not a chunk key of this endpoint
	}
	token := ep.hashMode == keyspace.HashModeToken
	tc := &ep.chunks[t]
	tc.open = nil
	if tc.chunks == nil {
		tc.chunks = make(map[uint64]*chunk)
		tc.where = make(map[uint64]*chunk)
	}
	var view keyspace.ChunkView
	if seq > keyspace.MaxChunkSeq {
		// Not written by a writer: taking it would wrap the next
		// sequence to 0, over the endpoint's first chunk.
		err = fmt.Errorf("sequence %d is past %d", seq, uint64(keyspace.MaxChunkSeq))
	} else {
		if seq >= tc.next {
			tc.next = seq + 1
		}
		view, err = keyspace.ParseChunkValue(value)
		if err == nil && view.HasEngine() != token {
			err = fmt.Errorf("chunk entries of width %d in an endpoint of hash mode %s", value[0], ep.hashMode)
		}
	}
	if err != nil {
		w.log.Warn("a chunk cannot be kept; deleting it", "endpoint", ep.id.String(), "key", string(key), "err", err)
		ep.fixes = append(ep.fixes, chunkFix{tier: t, seq: seq})
		st.Unmapped++
		w.m.unkeyedBlocks.WithLabelValues(unmappedBlock).Inc()
		return
	}
	c := &chunk{seq: seq, entries: make([]keyspace.ChunkEntry, 0, max(view.Len(), w.ap.rule.size)), lease: lease}
	fixed := false
	for i := 0; i < view.Len(); i++ {
		e := view.Entry(i)
		var why string
		switch {
		case tc.where[e.Key] != nil:
			why = "its key is in another chunk already"
		case token:
			if k, ok := w.ap.maps.lookup(ep, e.Engine); ok && k != e.Key {
				why = fmt.Sprintf("engine hash %016x is mapped to %016x already", e.Engine, k)
			}
		}
		if why != "" {
			w.log.Warn("a chunk entry cannot be kept; rewriting its chunk without it", "endpoint", ep.id.String(), "key", string(key), "block", e.Key, "reason", why)
			fixed = true
			st.Unmapped++
			w.m.unkeyedBlocks.WithLabelValues(unmappedBlock).Inc()
			continue
		}
		if token {
			w.ap.maps.store(ep, e.Engine, e.Key, t)
		}
		c.entries = append(c.entries, e)
		tc.where[e.Key] = c
	}
	st.Blocks += len(c.entries)
	if len(c.entries) > 0 {
		tc.chunks[seq] = c
		if !fixed && !ep.holds(t, lease) {
			// On no lease, or one the record does not name: it would
			// outlive the endpoint's leases (a ghost once the ingesters
			// are gone), so it is rewritten onto one of the tier's.
			fixed = true
			st.Unleased++
		}
	}
	if fixed {
		ep.fixes = append(ep.fixes, chunkFix{tier: t, seq: seq})
	}
}

// isCompacted reports etcd's "required revision has been compacted", in
// its gRPC form (the raw KV client's) or its client form.
func isCompacted(err error) bool {
	return errors.Is(err, rpctypes.ErrGRPCCompacted) || errors.Is(err, rpctypes.ErrCompacted)
}
