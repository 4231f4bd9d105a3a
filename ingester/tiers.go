package ingester

import (
	"context"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// Drop reasons of the DESIGN v1.1 rules (the drops_total labels).
const (
	dropTierClear   = "tier_clear"
	dropMediumMap   = "medium_map"
	dropGroupChange = "group_change"
)

// clearTier applies a TierBlocksCleared (DESIGN semantics 3, v1.1): it
// deletes every block key of ep in tier t, in guarded pages of at most
// DropPageSize keys as drop does, and voids the window's pending ops of
// that tier only. The other tiers, the record and the sequence state
// stay; the tier keeps one (now empty) lease shard for the blocks to come.
func (w *worker) clearTier(ctx context.Context, ep *endpoint, t tier.Tier) error {
	w.m.drops.WithLabelValues(dropTierClear).Inc()
	ep.tierEpoch[t]++
	if ep.mayHaveBlocks {
		prefix := w.cfg.Keyspace.TierBlocksPrefix(ep.id, t)
		end := []byte(keyspace.RangeEnd(prefix))
		for {
			resp, err := w.rangeKeys(ctx, prefix, end)
			if err != nil {
				return err
			}
			if len(resp.Kvs) == 0 {
				break
			}
			w.b.reset(w.claimRev)
			if resp.More {
				w.keyBuf = append(append(w.keyBuf[:0], resp.Kvs[len(resp.Kvs)-1].Key...), 0)
				w.b.del(w.b.key([]byte(prefix)), w.b.key(w.keyBuf))
			} else {
				w.b.del(w.b.key([]byte(prefix)), end)
			}
			if err := w.sendRetryingLeases(ctx, TxnDrop); err != nil {
				return err
			}
			if !resp.More {
				break
			}
		}
	}
	shards := ep.tiers[t]
	for i := range shards {
		shards[i].keys = 0
	}
	if len(shards) > 1 {
		for _, s := range shards[1:] {
			w.revoke(ctx, s.id)
		}
		ep.tiers[t] = shards[:1]
		ep.leasesChanged()
		w.markDirty(ep)
	}
	return nil
}

// remapped drops ep, as a resync does, when its record was written under
// another medium map than the ingester's (or under none: a record from
// before v1.1), and records the current map. It runs before anything else
// of a record of ep applies, so a medium that moved tier cannot leave keys
// in the old tier that no removal reaches.
func (w *worker) remapped(ctx context.Context, ep *endpoint) error {
	if ep.cur.mediums == w.mediums {
		return nil
	}
	w.log.Info("dropping an endpoint's blocks", "reason", dropMediumMap, "endpoint", ep.id.String(), "medium_map", ep.cur.mediums, "want", w.mediums)
	if err := w.drop(ctx, ep, dropMediumMap, false); err != nil {
		return err
	}
	ep.cur.mediums = w.mediums
	w.markDirty(ep)
	return nil
}
