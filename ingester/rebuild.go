package ingester

import (
	"context"
	"errors"
	"fmt"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/kvindex/kvindex/internal/backoff"
	"github.com/kvindex/kvindex/internal/keyspace"
)

// rebuildStats describes one partition's map rebuild, for logs and tests.
type rebuildStats struct {
	// Revision is the etcd revision every page was read at: the stored
	// offset's (the state the replay starts from), or, when none is
	// stored or it was compacted, the newest one at or after the claim's.
	Revision int64
	// Latest reports that the rebuild read the newest revision instead of
	// the stored offset's.
	Latest bool
	// Keys and Pages count the block keys read and the Range calls.
	Keys, Pages int
	// Entries is the partition's map entries after the rebuild.
	Entries int
	// Unmapped counts the blocks that could not enter the map (deleted
	// before the first record).
	Unmapped int
}

// rebuildPageBlockOverhead approximates a block key-value's framing in a
// Range response, besides its key and value bytes, when sizing pages.
const rebuildPageBlockOverhead = 32

// rebuildMaps fills the token-mode maps of w's endpoints from etcd before
// the worker applies anything (DESIGN "Hashing"): for every loaded
// endpoint whose record says token mode, it lists its blocks/ range, in
// pages of at most MapRebuildPageBytes, and enters each block's value, its
// engine hash, with the key and tier the block key names. Endpoints of the
// other hash mode are left alone; the worker drops and rewrites them
// (init).
//
// Every page is read at the revision of the stored offset (w.offsetRev,
// which the claim read after every committed write of a previous owner):
// the map is then the one the records before the stored offset made,
// which is what the replay's decisions must read. The newest revision
// would also hold what an uncommitted window wrote before a crash (its
// drops, and the block transactions that landed): a placeholder or a
// removal replayed before the store that wrote a key would find that key,
// one after a tier clear that landed would miss it, and the replay would
// key differently from the run that never crashed. Only when no offset is
// stored, or its revision was compacted away, is the newest revision read
// (at or after the claim's, so every write of a previous owner is in, or
// fenced out).
//
// A block that cannot enter the map would be a ghost, since no removal
// could reach it: one whose value is not 16 lowercase hex digits, or a
// second key of an engine hash already mapped (left by a window that
// crashed between the delete and the put of a re-keyed block: the replay
// of that window re-keys it). Such blocks are deleted before the first
// record (worker.init) and counted.
func (w *worker) rebuildMaps(ctx context.Context) (rebuildStats, error) {
	var st rebuildStats
	if !w.ap.tokenMode() {
		return st, nil
	}
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
			w.log.Warn("the stored offset's revision was compacted; rebuilding the engine-hash maps at the newest revision, which may hold writes of an uncommitted window",
				"revision", st.Revision)
		} else {
			w.log.Warn("map rebuild's revision was compacted; starting over", "revision", st.Revision)
		}
		for _, ep := range w.eps {
			w.ap.maps.clear(ep)
			ep.unmapped = nil
		}
		st = rebuildStats{Latest: true}
	}
	st.Entries = w.ap.maps.entries
	w.m.mapRebuilt.Add(float64(st.Entries))
	w.m.mapEntries.WithLabelValues(partitionLabel(w.p.Partition)).Set(float64(st.Entries))
	w.log.Info("engine-hash maps rebuilt", "revision", st.Revision, "latest", st.Latest, "keys", st.Keys, "pages", st.Pages, "entries", st.Entries,
		"unmapped", st.Unmapped, "seconds", time.Since(start).Seconds())
	return st, nil
}

// rebuildAt runs one rebuild pass, pinning st.Revision at its first page.
func (w *worker) rebuildAt(ctx context.Context, st *rebuildStats) error {
	ks := w.cfg.Keyspace
	for _, ep := range w.eps {
		if ep.hashMode != keyspace.HashModeToken {
			continue
		}
		perBlock := len(ep.blocksPrefix) + maxTierLen + 16 + keyspace.EngineHashLen + rebuildPageBlockOverhead
		limit := int64(max(1, w.cfg.MapRebuildPageBytes/perBlock))
		from := []byte(ep.blocksPrefix)
		end := []byte(keyspace.RangeEnd(ep.blocksPrefix))
		for {
			var resp *pb.RangeResponse
			err := backoff.Retry(ctx, backoff.New(20*time.Millisecond, time.Second, nil), func(ctx context.Context) error {
				var err error
				resp, err = w.kv.Range(ctx, &pb.RangeRequest{Key: from, RangeEnd: end, Limit: limit, Revision: st.Revision})
				if isCompacted(err) {
					resp = nil
					return nil // handled below, not retried
				}
				return err
			}, nil)
			if err != nil {
				return fmt.Errorf("%w: rebuilding the engine-hash map of %s: %v", ErrClaim, ep.id, err)
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
				st.Keys++
				prefix, t, key, err := ks.SplitBlockKey(string(kv.Key))
				if err != nil || prefix != ep.blocksPrefix {
					continue // not a block key of this endpoint: nothing to map
				}
				h, err := keyspace.ParseEngineHash(kv.Value)
				if err == nil {
					if k, ok := w.ap.maps.lookup(ep, h); ok && k != key {
						err = fmt.Errorf("engine hash %016x is mapped to %016x already", h, k)
					} else {
						w.ap.maps.store(ep, h, key, t)
					}
				}
				if err != nil {
					w.log.Warn("a block cannot enter the engine-hash map; deleting it", "endpoint", ep.id.String(), "key", string(kv.Key), "err", err)
					ep.unmapped = append(ep.unmapped, tierKey{tier: t, key: key})
					st.Unmapped++
				}
			}
			if !resp.More || len(resp.Kvs) == 0 {
				break
			}
			from = append(append([]byte{}, resp.Kvs[len(resp.Kvs)-1].Key...), 0)
		}
	}
	return nil
}

// isCompacted reports etcd's "required revision has been compacted", in
// its gRPC form (the raw KV client's) or its client form.
func isCompacted(err error) bool {
	return errors.Is(err, rpctypes.ErrGRPCCompacted) || errors.Is(err, rpctypes.ErrCompacted)
}
