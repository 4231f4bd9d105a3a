package ingester

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// commit writes the open window (DESIGN "Writes (ingester)"): the lease
// manager retires what the window's drops emptied (no RPC), then the
// packer settles the leases, packs the window into one fenced transaction
// (parts only past etcd's bounds, the offset in the last) and sends it,
// repairing leases that expired meanwhile. Once the window is in etcd,
// the retired leases are revoked and the committed state becomes the base
// a later window's early parts write. Until the last transaction commits,
// everything written is idempotent and replaying from the stored offset
// reproduces it.
func (w *worker) commit(ctx context.Context) error {
	if w.win.empty() && w.next == w.committed {
		w.win.records = 0
		return nil
	}
	if err := w.clearForeign(ctx); err != nil {
		return err
	}
	w.window++
	var retired []clientv3.LeaseID
	if len(w.win.drops) > 0 {
		retired = w.leases.retire(w.win)
	}
	if err := w.pk.write(ctx, w.win, w.eps, w.next, w.window); err != nil {
		// The worker stops: a successor replays the window and its drops.
		w.leases.release(retired...)
		return err
	}
	if len(retired) > 0 {
		w.leases.revoke(ctx, retired...)
	}
	for _, ep := range w.win.dirty {
		if ep.gone {
			continue
		}
		base := ep.cur
		ep.base = &base
		ep.baseNext = ep.chunkNext()
		ep.dirty = false
		ep.pred = nil
	}
	w.win.reset()
	w.committed = w.next
	if w.ap.tokenMode() {
		w.m.mapEntries.WithLabelValues(partitionLabel(w.p.Partition)).Set(float64(w.ap.maps.entries))
	}
	if w.hwm > 0 {
		w.m.lag.WithLabelValues(partitionLabel(w.p.Partition)).Set(float64(max(w.hwm-w.committed, 0)))
	}
	if w.onCommit != nil {
		w.onCommit(w.committed)
	}
	return nil
}
