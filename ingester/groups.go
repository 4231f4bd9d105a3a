package ingester

import "github.com/kvindex/kvindex/internal/events"

// chooseGroup applies the attention-group rule (DESIGN v1.1 "Event wire
// format", docs/semantics.md) to a batch about to apply to ep: while ep
// indexes group 0 provisionally, the batch's first attention store, in
// event order, fixes the group before any of the batch's events apply.
// Fixing it to another group than 0 drops ep's blocks first (a range-drop
// barrier, reason group_change). Once fixed it never moves.
func (a *applier) chooseGroup(ep *endpoint, evs []events.Event) {
	if ep.cur.groupSet {
		return
	}
	for i := range evs {
		if !evs[i].Attention() {
			continue
		}
		g := evs[i].GroupIdx
		ep.cur.group, ep.cur.groupSet = g, true
		a.win.markDirty(ep)
		if g != 0 {
			a.log.Info("dropping an endpoint's blocks", "reason", dropGroupChange, "endpoint", ep.id.String(), "group", g)
			a.drop(ep, dropGroupChange, false)
		}
		return
	}
}

// inGroup reports whether a store or removal belongs to the group ep
// indexes; events without a group (clears) always do.
func inGroup(ep *endpoint, ev *events.Event) bool {
	switch ev.Type {
	case events.BlockStored, events.BlockRemoved:
		return ev.GroupIdx == ep.cur.group
	}
	return true
}
