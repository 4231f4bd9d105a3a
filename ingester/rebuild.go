package ingester

import (
	"context"
	"errors"
	"fmt"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/kvindex/kvindex/internal/keyspace"
)

// rebuildStats describes one partition's map rebuild, for logs and tests.
type rebuildStats struct {
	// Revision is the etcd revision every page was read at (at or after
	// the claim's).
	Revision int64
	// Keys and Pages count the block keys read and the Range calls.
	Keys, Pages int
	// Entries is the partition's map entries after the rebuild.
	Entries int
	// Conflicts counts the endpoints dropped because a block of theirs
	// could not enter the map.
	Conflicts int
}

// rebuildPageBlockOverhead approximates a block key-value's framing in a
// Range response, besides its key and value bytes, when sizing pages.
const rebuildPageBlockOverhead = 32

// rebuildMaps fills the token-mode maps of w's endpoints from etcd before
// the worker applies anything (DESIGN "Hashing"): for every loaded
// endpoint whose record says token mode, it lists its blocks/ range, in
// pages of at most MapRebuildPageBytes, all at one revision at or after
// the claim's (so every write of a previous owner is in, or fenced out),
// and enters each block's value, its engine hash, with the key and tier
// the block key names. An endpoint with a block that cannot enter the map
// (a value that is not 16 lowercase hex digits, or one engine hash under
// two keys) is marked to be dropped as by resync before the first record:
// a block no removal could reach would be a ghost. Endpoints of the other
// hash mode are left alone; the worker drops and rewrites them (init).
func (w *worker) rebuildMaps(ctx context.Context) (rebuildStats, error) {
	var st rebuildStats
	if !w.tokenMode() {
		return st, nil
	}
	start := time.Now()
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
		w.log.Warn("map rebuild's revision was compacted; starting over", "revision", st.Revision)
		for _, ep := range w.eps {
			w.maps.clear(ep)
			ep.mapConflict = false
		}
		st = rebuildStats{}
	}
	st.Entries = w.maps.entries
	w.m.mapRebuilt.Add(float64(st.Entries))
	w.m.mapEntries.WithLabelValues(partitionLabel(w.p.Partition)).Set(float64(st.Entries))
	w.log.Info("engine-hash maps rebuilt", "revision", st.Revision, "keys", st.Keys, "pages", st.Pages, "entries", st.Entries,
		"conflicts", st.Conflicts, "seconds", time.Since(start).Seconds())
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
			err := retry(ctx, func() error {
				var err error
				resp, err = w.kv.Range(ctx, &pb.RangeRequest{Key: from, RangeEnd: end, Limit: limit, Revision: st.Revision})
				if isCompacted(err) {
					resp = nil
					return nil // handled below, not retried
				}
				return err
			})
			if err != nil {
				return fmt.Errorf("%w: rebuilding the engine-hash map of %s: %v", ErrClaim, ep.id, err)
			}
			if resp == nil {
				return rpctypes.ErrCompacted
			}
			st.Pages++
			if st.Revision == 0 {
				if resp.Header.Revision < w.claimRev {
					return fmt.Errorf("%w: etcd answered at revision %d, before the claim's %d", ErrClaim, resp.Header.Revision, w.claimRev)
				}
				st.Revision = resp.Header.Revision
			}
			for _, kv := range resp.Kvs {
				st.Keys++
				if ep.mapConflict {
					continue
				}
				prefix, t, key, err := ks.SplitBlockKey(string(kv.Key))
				if err != nil || prefix != ep.blocksPrefix {
					continue // not a block key of this endpoint: nothing to map
				}
				h, err := keyspace.ParseEngineHash(kv.Value)
				if err == nil {
					if _, oldTiers := w.maps.store(ep, h, key, t); oldTiers != 0 {
						err = fmt.Errorf("engine hash %016x names two keys", h)
					}
				}
				if err != nil {
					w.log.Warn("a block cannot enter the engine-hash map; the endpoint will be dropped as by resync",
						"endpoint", ep.id.String(), "key", string(kv.Key), "err", err)
					ep.mapConflict = true
					st.Conflicts++
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
