package ingester

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// claim takes ownership of newly assigned partitions (DESIGN "Writes:
// fencing"): for each it writes owners/{topic}/{p} and remembers the put's
// revision, reads the stored next offset, checks it against the log, loads
// the endpoints last seen on the partition and starts its worker. It
// retries etcd and Kafka errors for up to the rebalance timeout.
func (in *Ingester) claim(ctx context.Context, cl *kgo.Client, ps []int32) error {
	ctx, cancel := context.WithTimeout(ctx, in.cfg.RebalanceTimeout)
	defer cancel()
	member, gen := cl.GroupMetadata()
	adm := kadm.NewClient(cl)
	ks := in.cfg.Keyspace
	type claimed struct {
		rev    int64
		stored int64 // -1: none stored
	}
	got := make(map[int32]claimed, len(ps))
	for _, p := range ps {
		part := keyspace.Partition{Topic: in.cfg.Topic, Partition: p}
		nonce := make([]byte, 8)
		_, _ = rand.Read(nonce)
		rec := keyspace.OwnerRecord{MemberID: member, Generation: gen, Nonce: hex.EncodeToString(nonce), Ingester: in.cfg.ID, Claimed: time.Now().UTC()}
		val, err := rec.Marshal()
		if err != nil {
			return err
		}
		var resp *clientv3.TxnResponse
		err = retry(ctx, func() error {
			var err error
			resp, err = in.cfg.Etcd.Txn(ctx).Then(
				clientv3.OpPut(ks.OwnerKey(part), string(val)),
				clientv3.OpGet(ks.OffsetKey(part)),
			).Commit()
			return err
		})
		if err != nil {
			return fmt.Errorf("%w %s: %v", ErrClaim, part, err)
		}
		c := claimed{rev: resp.Header.Revision, stored: -1}
		if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
			if c.stored, err = keyspace.ParseOffset(kvs[0].Value); err != nil {
				in.log.Error("stored offset is malformed; treating it as out of range", "partition", part.String(), "err", err)
				c.stored = -2
			}
		}
		got[p] = c
		in.log.Info("partition claimed", "partition", p, "claim_revision", c.rev, "stored_offset", c.stored, "member", member, "generation", gen)
	}

	// The log's bounds, to catch stored offsets that no longer exist.
	var starts, ends kadm.ListedOffsets
	err := retry(ctx, func() error {
		var err error
		if starts, err = adm.ListStartOffsets(ctx, in.cfg.Topic); err == nil {
			err = starts.Error()
		}
		if err == nil {
			if ends, err = adm.ListEndOffsets(ctx, in.cfg.Topic); err == nil {
				err = ends.Error()
			}
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("%w: listing the log's offsets: %v", ErrClaim, err)
	}

	// The endpoints last seen on each partition, read after the claims so
	// that every write of a previous owner is either in or fenced out.
	var eresp *clientv3.GetResponse
	err = retry(ctx, func() error {
		var err error
		eresp, err = in.cfg.Etcd.Get(ctx, ks.EndpointsPrefix(), clientv3.WithPrefix())
		return err
	})
	if err != nil {
		return fmt.Errorf("%w: loading endpoints: %v", ErrClaim, err)
	}
	eps := make(map[int32]map[keyspace.Endpoint]*endpoint, len(ps))
	for _, p := range ps {
		eps[p] = map[keyspace.Endpoint]*endpoint{}
	}
	for _, kv := range eresp.Kvs {
		id, err := ks.ParseEndpointKey(string(kv.Key))
		if err != nil {
			in.log.Warn("ignoring a malformed endpoint key", "key", string(kv.Key), "err", err)
			continue
		}
		rec, err := keyspace.UnmarshalEndpointRecord(kv.Value)
		if err != nil {
			in.log.Warn("ignoring a malformed endpoint record", "key", string(kv.Key), "err", err)
			continue
		}
		m, ok := eps[rec.Partition]
		if !ok || rec.Topic != in.cfg.Topic {
			continue
		}
		ep := newEndpoint(ks, id)
		ep.fromRecord(&rec)
		m[id] = ep
	}

	// Adopt the recorded leases that still exist, at once: a crashed
	// predecessor's may have only two thirds of their TTL left.
	var lresp *clientv3.LeaseLeasesResponse
	if err := retry(ctx, func() error {
		var err error
		lresp, err = in.cfg.Etcd.Leases(ctx)
		return err
	}); err != nil {
		return fmt.Errorf("%w: listing leases: %v", ErrClaim, err)
	}
	live := make(map[clientv3.LeaseID]bool, len(lresp.Leases))
	for _, l := range lresp.Leases {
		live[l.ID] = true
	}
	var adopted []clientv3.LeaseID
	for _, m := range eps {
		for _, ep := range m {
			adopted = adoptLeases(ep, live, adopted)
		}
	}
	in.keeper.adopt(adopted...)

	cl.ResumeFetchPartitions(map[string][]int32{in.cfg.Topic: ps})
	for _, p := range ps {
		c := got[p]
		start, end := int64(0), int64(0)
		if o, ok := starts.Lookup(in.cfg.Topic, p); ok {
			start = o.Offset
		}
		if o, ok := ends.Lookup(in.cfg.Topic, p); ok {
			end = o.Offset
		}
		w := in.newWorker(p, c.rev, eps[p])
		if _, err := w.rebuildMaps(ctx); err != nil {
			return err
		}
		w.hwm = end
		switch {
		case c.stored >= start && c.stored <= end:
			w.next, w.committed = c.stored, c.stored
		case c.stored == -1 && len(w.eps) == 0:
			// Never consumed: start at the log start.
			w.next, w.committed = start, -1
		default:
			// Outside the log (or lost): the worker drops the partition's
			// endpoints and stores the log start before consuming.
			w.next, w.committed = c.stored, c.stored
			w.reset = start
		}
		from := w.next
		if w.reset >= 0 {
			from = w.reset
		}
		in.start(cl, w, from)
	}
	return nil
}

func (in *Ingester) newWorker(p int32, claimRev int64, eps map[keyspace.Endpoint]*endpoint) *worker {
	part := keyspace.Partition{Topic: in.cfg.Topic, Partition: p}
	w := &worker{
		cfg:       &in.cfg,
		p:         part,
		log:       in.log.With("partition", p),
		m:         in.m,
		kv:        in.kv,
		etcd:      in.cfg.Etcd,
		keeper:    in.keeper,
		dec:       events.NewDecoder(in.cfg.Mediums),
		ownerKey:  in.cfg.Keyspace.OwnerKey(part),
		claimRev:  claimRev,
		offsetKey: []byte(in.cfg.Keyspace.OffsetKey(part)),
		reset:     -1,
		eps:       eps,
		ops:       newOpSet(),
	}
	w.b = w.idleBuilder()
	return w
}

// init performs an offset reset if one is due and drops the endpoints a
// crashed window left behind, before the first record.
func (w *worker) init(ctx context.Context) error {
	for _, ep := range w.eps {
		if ep.leasesDirty() {
			w.markDirty(ep)
		}
	}
	if w.reset >= 0 {
		start := w.reset
		w.reset = -1
		if err := w.resetTo(ctx, start); err != nil {
			return err
		}
	}
	for _, ep := range w.eps {
		if ep.base == nil || ep.base.lastRecord.IsZero() {
			// Written by a window that crashed before committing, for an
			// endpoint that did not exist at the stored offset.
			if err := w.drop(ctx, ep, "stale", true); err != nil {
				return err
			}
		}
	}
	for _, ep := range w.eps {
		switch {
		case ep.hashMode != w.cfg.HashMode:
			// Its keys are of the other mode: no lookup of this mode could
			// find them, and no removal of this mode reach them.
			w.log.Info("dropping an endpoint written in another hash mode", "endpoint", ep.id.String(), "stored", ep.hashMode, "mode", w.cfg.HashMode)
			if err := w.drop(ctx, ep, "hash_mode", false); err != nil {
				return err
			}
			ep.hashMode = w.cfg.HashMode
			w.markDirty(ep) // rewritten in this mode
		case len(ep.unmapped) > 0:
			for _, b := range ep.unmapped {
				w.ops.add(ep, b.tier, b.key, true)
			}
			w.m.unkeyedBlocks.WithLabelValues(unmappedBlock).Add(float64(len(ep.unmapped)))
			ep.unmapped = nil
		}
	}
	if w.tokenMode() {
		if err := w.capMaps(ctx); err != nil {
			return err
		}
	}
	if len(w.dirty) > 0 || w.ops.len() > 0 {
		return w.commit(ctx)
	}
	return nil
}

// adoptLeases forgets the leases of ep that no longer exist and appends
// the live ones to dst. An endpoint whose record lease is gone, or that lost
// a shard, is rewritten by the next commit.
func adoptLeases(ep *endpoint, live map[clientv3.LeaseID]bool, dst []clientv3.LeaseID) []clientv3.LeaseID {
	if ep.lease != 0 && !live[ep.lease] {
		ep.lease, ep.inEtcd = 0, false
		ep.leasesChanged()
	}
	for _, t := range tier.All {
		kept := ep.tiers[t][:0]
		for _, s := range ep.tiers[t] {
			if live[s.id] {
				kept = append(kept, s)
			} else {
				ep.leasesChanged()
			}
		}
		clear(ep.tiers[t][len(kept):])
		ep.tiers[t] = kept
	}
	return ep.leaseIDs(dst)
}

// retry calls fn until it succeeds or ctx ends, backing off between tries.
func retry(ctx context.Context, fn func() error) error {
	backoff := 20 * time.Millisecond
	for {
		err := fn()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}
