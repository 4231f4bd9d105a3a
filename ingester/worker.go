package ingester

import (
	"context"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/keyspace"
)

// input is what the poll loop hands a worker: fetched records in offset
// order with the partition's high watermark at fetch time, or (reset >= 0)
// an order to restart at the log start after an out-of-range offset.
type input struct {
	recs  []*kgo.Record
	hwm   int64
	reset int64
	// bytes is what the input holds of its partition's QueueBytes.
	bytes int64
}

// worker owns one assigned partition: it applies the partition's records
// in order (ap, the apply part) and writes each window in one fenced
// transaction (commit: the lease manager's settle, then the packer, pk,
// which packs and sends and repairs). Only its goroutine touches its
// fields and its endpoints; the lease manager is shared with the other
// workers.
type worker struct {
	cfg    *Config
	p      keyspace.Partition
	log    *slog.Logger
	m      *metrics
	kv     pb.KVClient
	leases *leaseManager

	// ap applies records into win; eps is ap's endpoint map (the
	// partition's endpoints), shared with it.
	ap  applier
	win *window
	eps map[keyspace.Endpoint]*endpoint
	// pk packs and sends the windows (pack.go).
	pk *packer

	claimRev int64
	// offsetRev is the ModRevision of the stored offset as the claim read
	// it: the revision of the last window that committed, whose state the
	// replay from the stored offset starts from (0: no offset stored).
	offsetRev int64

	// next is the offset after the last applied record; committed the
	// offset stored in etcd. reset, when >= 0 at start, is the log start
	// to restart at (the stored offset was outside the log).
	next, committed int64
	reset           int64
	hwm             int64

	// window numbers the windows commit writes (lease shards count their
	// unsent keys per window).
	window uint64

	// onCommit publishes the stored offset (for Kafka lag commits).
	onCommit func(next int64)
	// dequeued gives back an input's share of QueueBytes once the worker
	// has taken it from its queue.
	dequeued func(n int64)
}

// maxDirty bounds the endpoints one window may touch: the window's last
// transaction writes all their records (with their member keys, for
// endpoints new to etcd) plus the offset, so two ops each and one more.
func (w *worker) maxDirty() int { return (w.cfg.MaxTxnOps - 1) / 2 }

// windowFull reports whether the open window must be written now: it holds
// WindowRecords records, WindowOps block operations, or as many endpoints
// as its last transaction can write records for (maxDirty).
func (w *worker) windowFull() bool {
	return w.win.records >= w.cfg.WindowRecords || w.win.blockOps >= w.cfg.WindowOps || len(w.win.dirty) >= w.maxDirty()
}

// run applies inputs until ctx ends (abandoning the open window: a
// successor replays it) or drain is closed (writing what was queued).
func (w *worker) run(ctx context.Context, in <-chan input, drain <-chan struct{}) error {
	defer w.release()
	if err := w.init(ctx); err != nil {
		return err
	}
	tick := w.cfg.Clock.NewTicker(w.tickInterval())
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-drain:
			for {
				select {
				case x := <-in:
					if err := w.handle(ctx, x); err != nil {
						return err
					}
					continue
				default:
				}
				break
			}
			return w.commit(ctx)
		case <-tick.Chan():
			if err := w.onTick(ctx); err != nil {
				return err
			}
		case x := <-in:
			if err := w.handle(ctx, x); err != nil {
				return err
			}
			if err := w.fill(ctx, in, drain); err != nil {
				return err
			}
			if ctx.Err() != nil {
				return nil // abandoned, as above: a successor replays it
			}
			if err := w.commit(ctx); err != nil {
				return err
			}
		}
	}
}

// fill adds the inputs already queued to the open window, then, with a
// WindowLinger, waits for more until the window is full, its oldest
// record is WindowLinger old (lingerLeft), ctx ends or drain closes (the
// caller commits and sees it). Ticks wait for the commit: liveness is
// judged on the partition clock, which only records move.
func (w *worker) fill(ctx context.Context, in <-chan input, drain <-chan struct{}) error {
	for !w.windowFull() {
		select {
		case x := <-in:
			if err := w.handle(ctx, x); err != nil {
				return err
			}
			continue
		default:
		}
		break
	}
	if w.win.records == 0 || w.windowFull() {
		return nil
	}
	left := lingerLeft(w.cfg.WindowLinger, w.win.oldest, time.Now())
	if left <= 0 {
		return nil
	}
	linger := time.NewTimer(left)
	defer linger.Stop()
	for !w.windowFull() && w.win.records > 0 {
		select {
		case x := <-in:
			if err := w.handle(ctx, x); err != nil {
				return err
			}
		case <-linger.C:
			return nil
		case <-drain:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
	return nil
}

// handle applies one input, committing whenever the window fills.
func (w *worker) handle(ctx context.Context, x input) error {
	if x.bytes > 0 && w.dequeued != nil {
		w.dequeued(x.bytes)
	}
	if x.reset >= 0 {
		if err := w.commit(ctx); err != nil {
			return err
		}
		return w.resetTo(ctx, x.reset)
	}
	if x.hwm > w.hwm {
		w.hwm = x.hwm
		// Lag is what the partition has that etcd does not: measured at
		// every fetch, so a partition that cannot commit shows its lag
		// growing instead of the last value it committed with.
		w.m.lag.WithLabelValues(partitionLabel(w.p.Partition)).Set(float64(max(w.hwm-w.committed, 0)))
	}
	for _, r := range x.recs {
		if r.Offset < w.next {
			continue // already applied (a refetch after SetOffsets)
		}
		w.ap.record(r, r.Offset+1 < x.hwm)
		w.next = r.Offset + 1
		w.win.noteRecord(r.Timestamp)
		if w.windowFull() {
			if err := w.commit(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// release stops keeping the partition's leases alive (the partition is
// going; its successor adopts them), those of endpoints forgotten by a
// drop the worker did not write too (the successor replays it).
func (w *worker) release() {
	var ids []clientv3.LeaseID
	for _, ep := range w.eps {
		ids = ep.leaseIDs(ids)
	}
	for _, d := range w.win.drops {
		if d.ep.gone {
			ids = d.ep.leaseIDs(ids)
		}
	}
	w.leases.release(ids...)
	w.m.lag.DeleteLabelValues(partitionLabel(w.p.Partition))
	w.m.mapEntries.DeleteLabelValues(partitionLabel(w.p.Partition))
}

// resetTo restarts the partition at start, the log start, after its
// stored offset was found outside the log: the blocks of every endpoint
// last seen on the partition may be stale and are dropped, in the window
// that stores start as the next offset.
func (w *worker) resetTo(ctx context.Context, start int64) error {
	if w.next == -1 {
		w.log.Warn("no stored offset, but endpoints were last seen on the partition; dropping them and starting at the log start",
			"log_start", start, "endpoints", len(w.eps))
	} else {
		w.m.offsetResets.Inc()
		w.log.Error("stored offset is outside the log; dropping the partition's endpoints and restarting at the log start",
			"stored_offset", w.next, "log_start", start, "endpoints", len(w.eps))
	}
	for _, ep := range w.eps {
		w.ap.drop(ep, "reset", true)
	}
	w.next = start // differs from the stored offset, so the window is written
	if err := w.commit(ctx); err != nil {
		return err
	}
	// A fresh history: the replay's own record times drive the clock.
	w.ap.clock, w.ap.minLast = time.Time{}, time.Time{}
	return nil
}
