package ingester

import "github.com/kvindex/kvindex/internal/tier"

// Drop reasons of the DESIGN v1.1 rules (the drops_total labels).
const (
	dropTierClear   = "tier_clear"
	dropMediumMap   = "medium_map"
	dropGroupChange = "group_change"
)

// tierCleared applies a TierBlocksCleared (DESIGN semantics 3, v1.1): a
// drop of ep's chunks in tier t only; chunk_next stays. The other tiers,
// the record and the sequence state stay.
func (a *applier) tierCleared(ep *endpoint, t tier.Tier) {
	a.m.drops.WithLabelValues(dropTierClear).Inc()
	a.maps.clearTier(ep, t) // the entries only that tier held go with it
	dropChunks(ep, t, a.win)
	a.win.dropTier(ep, t)
}

// remapped drops ep, as a resync does, when its record was written under
// another medium map than the ingester's (or under none: a record from
// before v1.1), and records the current map. It runs before anything else
// of a record of ep applies, so a medium that moved tier cannot leave keys
// in the old tier that no removal reaches.
func (a *applier) remapped(ep *endpoint) {
	if ep.cur.mediums == a.mediums {
		return
	}
	a.log.Info("dropping an endpoint's blocks", "reason", dropMediumMap, "endpoint", ep.id.String(), "medium_map", ep.cur.mediums, "want", a.mediums)
	a.drop(ep, dropMediumMap, false)
	ep.cur.mediums = a.mediums
	a.win.markDirty(ep)
}
