package ingester

import (
	"context"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"

	"github.com/kvindex/kvindex/internal/backoff"
	"github.com/kvindex/kvindex/internal/tier"
)

// checkConcurrency bounds the TimeToLive calls one liveness check of a
// partition's leases has in flight.
const checkConcurrency = 16

// leaseManager is the third part of the write path: the one owner of the
// ingester's leases (DESIGN "Writes: leases"). It grants them, keeps them
// alive (keeper), recounts the keys etcd has attached to a shard, adopts a
// predecessor's recorded leases on a claim, repairs the endpoints whose
// leases expired, and revokes leases that hold no keys. The workers call it
// between applying a window and packing it (settle), so the packer never
// waits on a lease RPC; every call that blocks takes a context, and the
// retries of grant and of liveness checks last until it ends.
//
// One manager serves every partition worker of an Ingester (and its
// registration); the endpoint state it changes belongs to the calling
// worker.
type leaseManager struct {
	cli          *clientv3.Client
	ttl          time.Duration
	keysPerLease int
	log          *slog.Logger
	m            *metrics
	keeper       *keeper
}

func newLeaseManager(cfg *Config, log *slog.Logger, m *metrics) *leaseManager {
	return &leaseManager{
		cli:          cfg.Etcd,
		ttl:          cfg.LeaseTTL,
		keysPerLease: cfg.KeysPerLease,
		log:          log,
		m:            m,
		keeper:       newKeeper(cfg.Etcd, cfg.LeaseTTL, log, m),
	}
}

// run keeps the held leases alive until ctx ends.
func (lm *leaseManager) run(ctx context.Context) error { return lm.keeper.run(ctx) }

// retryBackoff is the delay of the manager's retries (real time: etcd
// expires leases in real time).
func retryBackoff() *backoff.Backoff { return backoff.New(20*time.Millisecond, 2*time.Second, nil) }

// grant grants a lease of LeaseTTL and keeps it alive, retrying etcd
// errors until ctx ends.
func (lm *leaseManager) grant(ctx context.Context) (clientv3.LeaseID, error) {
	var id clientv3.LeaseID
	err := backoff.Retry(ctx, retryBackoff(), func(ctx context.Context) error {
		resp, err := lm.cli.Grant(ctx, int64(lm.ttl/time.Second))
		if err == nil {
			id = resp.ID
		}
		return err
	}, func(err error, d time.Duration) {
		lm.log.Warn("granting a lease failed; retrying", "err", err, "backoff", d)
	})
	if err != nil {
		return 0, err
	}
	lm.m.leaseGrants.Inc()
	lm.keeper.add(id)
	return id, nil
}

// watch returns a channel closed when etcd reports id expired while it is
// kept alive (for the registration, which then registers again).
func (lm *leaseManager) watch(id clientv3.LeaseID) <-chan struct{} { return lm.keeper.watch(id) }

// revoke stops keeping ids alive and revokes them: they hold no keys.
// Failure is logged, not returned: an unrevoked empty lease just expires.
func (lm *leaseManager) revoke(ctx context.Context, ids ...clientv3.LeaseID) {
	for _, id := range ids {
		if id == 0 {
			continue
		}
		lm.keeper.remove(id)
		if _, err := lm.cli.Revoke(ctx, id); err != nil && ctx.Err() == nil {
			lm.log.Debug("revoking an empty lease failed; it will expire", "lease", keyspaceLease(id), "err", err)
		}
	}
}

// revokeOne stops keeping id alive and revokes it, returning etcd's error.
func (lm *leaseManager) revokeOne(ctx context.Context, id clientv3.LeaseID) error {
	lm.keeper.remove(id)
	_, err := lm.cli.Revoke(ctx, id)
	return err
}

// release stops keeping ids alive without revoking them (their partition
// is going; its successor adopts them).
func (lm *leaseManager) release(ids ...clientv3.LeaseID) { lm.keeper.remove(ids...) }

// live reports which of ids etcd still has, asking for each one
// (TimeToLive without keys, up to checkConcurrency at once): the cost is
// the partition's leases, never the cluster's. It retries etcd errors
// until ctx ends.
func (lm *leaseManager) live(ctx context.Context, ids []clientv3.LeaseID) (map[clientv3.LeaseID]bool, error) {
	alive := make([]bool, len(ids))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(checkConcurrency)
	for k, id := range ids {
		g.Go(func() error {
			return backoff.Retry(gctx, retryBackoff(), func(ctx context.Context) error {
				resp, err := lm.cli.TimeToLive(ctx, id)
				if err == nil {
					alive[k] = resp.TTL > 0
				}
				return err
			}, func(err error, d time.Duration) {
				lm.log.Warn("checking a lease failed; retrying", "lease", keyspaceLease(id), "err", err, "backoff", d)
			})
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	out := make(map[clientv3.LeaseID]bool, len(ids))
	for k, id := range ids {
		if alive[k] {
			out[id] = true
		}
	}
	return out, nil
}

// adopt takes over the recorded leases of a claimed partition's endpoints:
// it forgets the ones etcd no longer has (an endpoint whose record lease
// is gone lost its record with it, and is rewritten by the next commit)
// and keeps the others alive, renewing them at once: a crashed
// predecessor's may have only two thirds of their TTL left.
func (lm *leaseManager) adopt(ctx context.Context, eps []*endpoint) error {
	var ids []clientv3.LeaseID
	for _, ep := range eps {
		ids = ep.leaseIDs(ids)
	}
	alive, err := lm.live(ctx, ids)
	if err != nil {
		return err
	}
	ids = ids[:0]
	for _, ep := range eps {
		if ep.lease != 0 && !alive[ep.lease] {
			ep.lease, ep.inEtcd = 0, false
			ep.leasesChanged()
		}
		for _, t := range tier.All {
			kept := ep.tiers[t][:0]
			for _, s := range ep.tiers[t] {
				if alive[s.id] {
					kept = append(kept, s)
				} else {
					ep.leasesChanged()
				}
			}
			clear(ep.tiers[t][len(kept):])
			ep.tiers[t] = kept
		}
		ids = ep.leaseIDs(ids)
	}
	lm.keeper.adopt(ids...)
	return nil
}

// settle gives every lease decision of a window its answer before the
// window is packed: each endpoint whose record the window writes gets a
// record lease, and each chunk the window puts a shard of its (endpoint,
// tier) to attach to. A chunk keeps the shard it has while its endpoint
// still holds that shard (a rewrite moves no key between leases); a new
// chunk, or one whose shard is gone, gets the tier's newest. window
// numbers the window (shards count the keys assigned in it that etcd may
// not count yet).
func (lm *leaseManager) settle(ctx context.Context, win *window, window uint64) error {
	for _, ep := range win.dirty {
		if !ep.gone && ep.lease == 0 {
			if err := lm.recordLease(ctx, ep); err != nil {
				return err
			}
		}
	}
	for k := range win.writes {
		wr := &win.writes[k]
		if wr.c == nil || wr.ep.holds(wr.tier, wr.c.lease) {
			continue
		}
		if wr.ep.lease == 0 {
			if err := lm.recordLease(ctx, wr.ep); err != nil {
				return err
			}
		}
		id, err := lm.assign(ctx, wr.ep, wr.tier, window)
		if err != nil {
			return err
		}
		wr.c.lease = id
	}
	return nil
}

// retire settles the leases the window's drops emptied, without an RPC,
// before the window's puts are given theirs: each tier a drop covered
// keeps its first shard (its count now 0) for the chunks to come, and its
// other shards are returned; an endpoint dropped with its record returns
// every lease. The caller revokes what is returned once the window is in
// etcd: revoking a lease first would delete keys outside the guarded
// transaction (a fenced writer must change nothing).
func (lm *leaseManager) retire(win *window) []clientv3.LeaseID {
	var ids []clientv3.LeaseID
	for _, d := range win.drops {
		ep := d.ep
		if d.deleteRecord {
			ids = ep.leaseIDs(ids)
			continue
		}
		changed := false
		for _, t := range tier.All {
			if !d.all && !d.tiers[t] {
				continue
			}
			for i := range ep.tiers[t] {
				ep.tiers[t][i].keys = 0
			}
			if len(ep.tiers[t]) <= 1 {
				continue
			}
			for _, s := range ep.tiers[t][1:] {
				ids = append(ids, s.id)
			}
			clear(ep.tiers[t][1:])
			ep.tiers[t] = ep.tiers[t][:1]
			changed = true
		}
		if changed {
			ep.leasesChanged()
			win.markDirty(ep)
		}
	}
	return ids
}

// recordLease grants ep's record lease.
func (lm *leaseManager) recordLease(ctx context.Context, ep *endpoint) error {
	id, err := lm.grant(ctx)
	if err != nil {
		return err
	}
	ep.lease = id
	ep.leasesChanged()
	return nil
}

// rotates reports whether a put to (ep, t) needs a new lease shard.
func (lm *leaseManager) rotates(ep *endpoint, t tier.Tier) bool {
	s := ep.tiers[t]
	return len(s) == 0 || s[len(s)-1].keys >= lm.keysPerLease
}

// assign picks the lease shard a new key of (ep, t) attaches to, starting
// a new shard once the last holds KeysPerLease keys (after recounting what
// etcd really has attached: deletes do not decrement the counts, so churn
// would otherwise grow shards without bound).
func (lm *leaseManager) assign(ctx context.Context, ep *endpoint, t tier.Tier, window uint64) (clientv3.LeaseID, error) {
	rotate := false
	if lm.rotates(ep, t) && len(ep.tiers[t]) > 0 {
		if err := lm.recount(ctx, ep, t, window); err != nil {
			return 0, err
		}
		// A shard still at least half full after the recount is closed
		// too: otherwise, with an endpoint's live keys near the bound (an
		// LRU cache churning at its capacity), every put would recount,
		// and a recount is a TimeToLive listing every attached key. So a
		// tier recounts at most once per KeysPerLease/2 puts.
		s := ep.tiers[t]
		rotate = len(s) > 0 && s[len(s)-1].keys >= (lm.keysPerLease+1)/2
	}
	if rotate || lm.rotates(ep, t) {
		id, err := lm.grant(ctx)
		if err != nil {
			return 0, err
		}
		ep.tiers[t] = append(ep.tiers[t], shard{id: id})
		ep.leasesChanged()
	}
	s := &ep.tiers[t][len(ep.tiers[t])-1]
	s.keys++
	if s.window != window {
		s.window, s.unsent = window, 0
	}
	s.unsent++
	return s.id, nil
}

// recount replaces the key counts of (ep, t)'s shards with what etcd has
// attached, and revokes the shards (but the last) that hold no key.
func (lm *leaseManager) recount(ctx context.Context, ep *endpoint, t tier.Tier, window uint64) error {
	shards := ep.tiers[t]
	kept := shards[:0]
	for k, s := range shards {
		lm.m.leaseRecounts.Inc()
		resp, err := lm.cli.TimeToLive(ctx, s.id, clientv3.WithAttachedKeys())
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			kept = append(kept, s) // keep the bound as it was
			continue
		}
		if resp.TTL <= 0 {
			lm.keeper.remove(s.id)
			ep.leasesChanged()
			continue
		}
		real := len(resp.Keys)
		if s.window == window {
			// Keys of this window: some may be in etcd already (and so
			// counted twice), which only makes the shard rotate early.
			real += s.unsent
		}
		if real == 0 && k < len(shards)-1 {
			lm.revoke(ctx, s.id)
			ep.leasesChanged()
			continue
		}
		s.keys = real
		kept = append(kept, s)
	}
	clear(shards[len(kept):])
	ep.tiers[t] = kept
	return nil
}

// repair handles a transaction refused for a lease etcd no longer has (it
// expired: the ingester could not renew it for a TTL). It checks the
// leases of the partition's endpoints, forgets the expired ones, so the
// next settle grants fresh ones for every chunk that named one; an
// endpoint whose record lease expired lost its record and is marked for
// the window's last transaction. The keys etcd deleted with the leases
// are lost until their chunks are written again (missed hits, never ghost
// hits).
func (lm *leaseManager) repair(ctx context.Context, eps []*endpoint, win *window) error {
	var ids []clientv3.LeaseID
	for _, ep := range eps {
		ids = ep.leaseIDs(ids)
	}
	alive, err := lm.live(ctx, ids)
	if err != nil {
		return err
	}
	dead := func(id clientv3.LeaseID) bool { return id != 0 && !alive[id] }
	for _, ep := range eps {
		if dead(ep.lease) {
			lm.m.leaseRegrants.Inc()
			lm.keeper.remove(ep.lease)
			ep.lease = 0
			ep.inEtcd = false // the record went with its lease
			win.markDirty(ep)
		}
		for _, t := range tier.All {
			kept := ep.tiers[t][:0]
			for _, s := range ep.tiers[t] {
				if dead(s.id) {
					lm.m.leaseRegrants.Inc()
					lm.keeper.remove(s.id)
					ep.leasesChanged()
					continue
				}
				kept = append(kept, s)
			}
			clear(ep.tiers[t][len(kept):])
			ep.tiers[t] = kept
		}
	}
	lm.log.Warn("leases expired under this ingester; granting new ones")
	return nil
}
