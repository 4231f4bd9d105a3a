package ingester

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
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

// worker owns one assigned partition: it applies the partition's records in
// order and writes them in fenced transactions. Only its goroutine touches
// its fields.
type worker struct {
	cfg    *Config
	p      keyspace.Partition
	log    *slog.Logger
	m      *metrics
	kv     pb.KVClient
	etcd   *clientv3.Client
	keeper *keeper
	dec    *events.Decoder
	// b is the transaction being built (nil while commit has just
	// launched it); idle are builders free for the next ones, flights the
	// window's block transactions in flight (oldest first) and failed
	// those that came back with an error; seqs numbers the builders'
	// transactions. See pipeline.go.
	b        *txnBuilder
	idle     []*txnBuilder
	flights  []*flight
	failed   []*flight
	seqs     uint64
	ownerKey string

	claimRev  int64
	offsetKey []byte

	// next is the offset after the last applied record; committed the
	// offset stored in etcd. reset, when >= 0 at start, is the log start
	// to restart at (the stored offset was outside the log).
	next, committed int64
	reset           int64
	hwm             int64

	eps   map[keyspace.Endpoint]*endpoint
	ops   *opSet
	dirty []*endpoint
	// windowRecords counts the records of the open window; window numbers
	// the windows commit writes (lease shards count their unsent keys per
	// window).
	windowRecords int
	window        uint64

	// clock is the partition clock; minLast a lower bound of the live
	// endpoints' last-record times (so most records skip the expiry scan).
	// The clock starts at zero when a worker starts, not at the loaded
	// endpoints' last-record times: a replay of older records (an offset
	// rewound by an operator) must age by its own record times, so the
	// endpoints it touches cannot look fresher than they were.
	clock   time.Time
	minLast time.Time

	// onCommit publishes the stored offset (for Kafka lag commits).
	onCommit func(next int64)
	// dequeued gives back an input's share of QueueBytes once the worker
	// has taken it from its queue.
	dequeued func(n int64)

	keyBuf []byte
	leases []clientv3.LeaseID
	// maps counts the entries of the endpoints' token-mode maps; tokBuf
	// and extraBuf are keying's buffers, unkeyedInRecord the blocks of the
	// current record token mode could not key (keying.go).
	maps            engineMaps
	tokBuf          []uint32
	extraBuf        []client.Extra
	unkeyedInRecord int
	// vals are the commit part's encoded records.
	vals [][]byte
}

// maxDirty bounds the endpoints one window may touch: the commit
// transaction writes all their records plus the offset.
func (w *worker) maxDirty() int { return (w.cfg.MaxTxnOps - 1) / 2 }

// run applies inputs until ctx ends (abandoning the open window: a
// successor replays it) or drain is closed (writing what was queued).
func (w *worker) run(ctx context.Context, in <-chan input, drain <-chan struct{}) error {
	defer w.releaseLeases()
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
		more:
			for w.windowRecords < w.cfg.WindowRecords {
				select {
				case x := <-in:
					if err := w.handle(ctx, x); err != nil {
						return err
					}
				default:
					break more
				}
			}
			if err := w.commit(ctx); err != nil {
				return err
			}
		}
	}
}

func (w *worker) tickInterval() time.Duration {
	return min(max(w.cfg.LivenessWindow/10, 10*time.Millisecond), time.Second)
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
		behind := r.Offset+1 < x.hwm
		if err := w.record(ctx, r, behind); err != nil {
			return err
		}
		w.next = r.Offset + 1
		w.windowRecords++
		if w.windowRecords >= w.cfg.WindowRecords || w.ops.len() >= w.cfg.WindowOps || len(w.dirty) >= w.maxDirty() {
			if err := w.commit(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// advanceClock moves the partition clock for a record: its Kafka timestamp
// while the partition is behind, wall time once caught up; never back.
func (w *worker) advanceClock(t time.Time) {
	if t.After(w.clock) {
		w.clock = t
	}
}

// expire drops every endpoint silent for longer than the liveness window
// on the partition clock (DESIGN semantics 8).
func (w *worker) expire(ctx context.Context) error {
	if !w.minLast.IsZero() && w.clock.Sub(w.minLast) <= w.cfg.LivenessWindow {
		return nil
	}
	var oldest time.Time
	for _, ep := range w.eps {
		if w.clock.Sub(ep.cur.lastRecord) > w.cfg.LivenessWindow {
			w.log.Info("endpoint expired", "endpoint", ep.id.String(), "last_record", ep.cur.lastRecord, "clock", w.clock)
			if err := w.drop(ctx, ep, "expired", true); err != nil {
				return err
			}
			continue
		}
		if oldest.IsZero() || ep.cur.lastRecord.Before(oldest) {
			oldest = ep.cur.lastRecord
		}
	}
	if oldest.IsZero() {
		oldest = w.clock
	}
	w.minLast = oldest
	return nil
}

// onTick ages an idle, caught-up partition's endpoints on wall time.
func (w *worker) onTick(ctx context.Context) error {
	if w.next < w.hwm || w.ops.len() > 0 || len(w.dirty) > 0 {
		return nil // behind: the records' own times move the clock
	}
	w.advanceClock(w.cfg.Clock.Now())
	return w.expire(ctx)
}

// touch records a batch or heartbeat of ep at the partition clock.
func (w *worker) touch(ep *endpoint) {
	ep.cur.lastRecord = w.clock
	if w.clock.Before(w.minLast) {
		w.minLast = w.clock
	}
	w.markDirty(ep)
}

// markDirty queues ep's record for the window's commit transaction.
func (w *worker) markDirty(ep *endpoint) {
	if !ep.dirty {
		ep.dirty = true
		w.dirty = append(w.dirty, ep)
	}
}

// endpoint returns the state of id, creating it (absent from etcd) when
// create is set; nil otherwise.
func (w *worker) endpoint(id keyspace.Endpoint, create bool) *endpoint {
	if ep := w.eps[id]; ep != nil || !create {
		return ep
	}
	ep := newEndpoint(w.cfg.Keyspace, id)
	ep.hashMode = w.cfg.HashMode
	w.eps[id] = ep
	return ep
}

// drop deletes every block key of ep in guarded pages and voids its pending
// ops; with deleteRecord (goodbye, expiry) it also deletes the endpoint
// record in the last page and forgets the endpoint.
func (w *worker) drop(ctx context.Context, ep *endpoint, reason string, deleteRecord bool) error {
	w.m.drops.WithLabelValues(reason).Inc()
	ep.epoch++
	w.maps.clear(ep) // every entry names a block this drop deletes
	end := []byte(keyspace.RangeEnd(ep.blocksPrefix))
	for {
		all := true
		var last []byte
		hasKeys := false
		if ep.mayHaveBlocks {
			resp, err := w.rangeKeys(ctx, ep.blocksPrefix, end)
			if err != nil {
				return err
			}
			if len(resp.Kvs) > 0 {
				hasKeys = true
				if resp.More {
					all = false
					last = resp.Kvs[len(resp.Kvs)-1].Key
				}
			}
		}
		w.b.reset(w.claimRev)
		if hasKeys {
			if all {
				w.b.del(w.b.key([]byte(ep.blocksPrefix)), end)
			} else {
				w.keyBuf = append(append(w.keyBuf[:0], last...), 0)
				w.b.del(w.b.key([]byte(ep.blocksPrefix)), w.b.key(w.keyBuf))
			}
		}
		if all && deleteRecord && ep.inEtcd {
			w.b.del(w.b.key([]byte(ep.key)), nil)
		}
		if w.b.n() > 0 {
			if err := w.sendRetryingLeases(ctx, TxnDrop); err != nil {
				return err
			}
		}
		if all {
			break
		}
	}
	ep.mayHaveBlocks = false
	for _, t := range tier.All {
		for i := range ep.tiers[t] {
			ep.tiers[t][i].keys = 0
		}
	}
	if !deleteRecord {
		// Keep one empty lease per tier for the blocks to come; the rest
		// are empty now and go.
		for _, t := range tier.All {
			if n := len(ep.tiers[t]); n > 1 {
				for _, s := range ep.tiers[t][1:] {
					w.revoke(ctx, s.id)
				}
				ep.tiers[t] = ep.tiers[t][:1]
				ep.leasesChanged()
				w.markDirty(ep)
			}
		}
		return nil
	}
	// Forget the endpoint: its blocks and record are gone, so its leases
	// hold no keys and can be revoked.
	ep.inEtcd = false
	ep.gone = true
	w.leases = ep.leaseIDs(w.leases[:0])
	for _, id := range w.leases {
		w.revoke(ctx, id)
	}
	if w.eps[ep.id] == ep {
		delete(w.eps, ep.id)
	}
	return nil
}

// rangeKeys lists up to DropPageSize keys of [prefix, end), keys only.
func (w *worker) rangeKeys(ctx context.Context, prefix string, end []byte) (*pb.RangeResponse, error) {
	backoff := 20 * time.Millisecond
	for {
		resp, err := w.kv.Range(ctx, &pb.RangeRequest{Key: []byte(prefix), RangeEnd: end, Limit: int64(w.cfg.DropPageSize), KeysOnly: true})
		if err == nil {
			return resp, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		w.log.Warn("etcd range failed; retrying", "prefix", prefix, "err", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// sendRetryingLeases sends a transaction that attaches no lease (drops,
// resets): errLeaseGone cannot happen, but is retried for safety.
func (w *worker) sendRetryingLeases(ctx context.Context, kind TxnKind) error {
	err := w.send(ctx, kind)
	if errors.Is(err, errLeaseGone) {
		return fmt.Errorf("ingester: %s transaction reported a missing lease: %w", kind, err)
	}
	return err
}

// revoke revokes a lease that holds no keys and stops keeping it alive.
// Failure is logged: an unrevoked empty lease just expires.
func (w *worker) revoke(ctx context.Context, id clientv3.LeaseID) {
	if id == 0 {
		return
	}
	w.keeper.remove(id)
	if _, err := w.etcd.Revoke(ctx, id); err != nil && ctx.Err() == nil {
		w.log.Debug("revoking an empty lease failed; it will expire", "lease", keyspaceLease(id), "err", err)
	}
}

// releaseLeases stops keeping the partition's leases alive (the partition
// is going; its successor adopts them).
func (w *worker) releaseLeases() {
	w.leases = w.leases[:0]
	for _, ep := range w.eps {
		w.leases = ep.leaseIDs(w.leases)
	}
	w.keeper.remove(w.leases...)
	w.m.lag.DeleteLabelValues(partitionLabel(w.p.Partition))
	w.m.mapEntries.DeleteLabelValues(partitionLabel(w.p.Partition))
}

// resetTo restarts the partition at start, the log start, after its
// stored offset was found outside the log: the blocks of every endpoint
// last seen on the partition may be stale and are dropped.
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
		if err := w.drop(ctx, ep, "reset", true); err != nil {
			return err
		}
	}
	w.b.reset(w.claimRev)
	w.b.put(w.b.key(w.offsetKey), []byte(keyspace.FormatOffset(start)), 0)
	w.b.offset = start
	if err := w.sendRetryingLeases(ctx, TxnReset); err != nil {
		return err
	}
	w.next, w.committed = start, start
	// A fresh history: the replay's own record times drive the clock.
	w.clock, w.minLast = time.Time{}, time.Time{}
	if w.onCommit != nil {
		w.onCommit(start)
	}
	return nil
}
