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

	"github.com/kvindex/kvindex/internal/backoff"
	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/keyspace"
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
	got := make(map[int32]claimed, len(ps))
	for _, p := range ps {
		c, err := in.claimOwner(ctx, p, member, gen)
		if err != nil {
			return err
		}
		got[p] = c
	}

	// The log's bounds, to catch stored offsets that no longer exist.
	starts, ends, err := in.logBounds(ctx, kadm.NewClient(cl))
	if err != nil {
		return err
	}

	// The endpoints last seen on each partition, read after the claims so
	// that every write of a previous owner is either in or fenced out,
	// through the partition's member keys: the cost is the partition's
	// endpoints, not the keyspace's.
	eps := make(map[int32]map[keyspace.Endpoint]*endpoint, len(ps))
	var loaded []*endpoint
	for _, p := range ps {
		part := keyspace.Partition{Topic: in.cfg.Topic, Partition: p}
		m, err := in.loadEndpoints(ctx, part)
		if err != nil {
			return fmt.Errorf("%w %s: loading endpoints: %v", ErrClaim, part, err)
		}
		eps[p] = m
		for _, ep := range m {
			loaded = append(loaded, ep)
		}
	}

	// Adopt the recorded leases that still exist.
	if err := in.leases.adopt(ctx, loaded); err != nil {
		return fmt.Errorf("%w: adopting leases: %v", ErrClaim, err)
	}

	cl.ResumeFetchPartitions(map[string][]int32{in.cfg.Topic: ps})
	for _, p := range ps {
		start, end := int64(0), int64(0)
		if o, ok := starts.Lookup(in.cfg.Topic, p); ok {
			start = o.Offset
		}
		if o, ok := ends.Lookup(in.cfg.Topic, p); ok {
			end = o.Offset
		}
		if err := in.startClaimed(ctx, cl, p, got[p], eps[p], start, end); err != nil {
			return err
		}
	}
	return nil
}

// claimed is what claiming a partition read back in the claim's
// transaction.
type claimed struct {
	rev    int64
	stored int64 // -1: none stored; -2: malformed
	// offRev is the stored offset's ModRevision (0: none stored).
	offRev int64
}

// claimOwner writes partition p's owner key for this group member and
// generation and reads its stored offset in the same transaction.
func (in *Ingester) claimOwner(ctx context.Context, p int32, member string, gen int32) (claimed, error) {
	ks := in.cfg.Keyspace
	part := keyspace.Partition{Topic: in.cfg.Topic, Partition: p}
	nonce := make([]byte, 8)
	_, _ = rand.Read(nonce)
	rec := keyspace.OwnerRecord{MemberID: member, Generation: gen, Nonce: hex.EncodeToString(nonce), Ingester: in.cfg.ID, Claimed: time.Now().UTC()}
	val, err := rec.Marshal()
	if err != nil {
		return claimed{}, err
	}
	var resp *clientv3.TxnResponse
	err = in.retry(ctx, func(ctx context.Context) error {
		var err error
		resp, err = in.cfg.Etcd.Txn(ctx).Then(
			clientv3.OpPut(ks.OwnerKey(part), string(val)),
			clientv3.OpGet(ks.OffsetKey(part)),
		).Commit()
		return err
	})
	if err != nil {
		return claimed{}, fmt.Errorf("%w %s: %v", ErrClaim, part, err)
	}
	c := claimed{rev: resp.Header.Revision, stored: -1}
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		c.offRev = kvs[0].ModRevision
		if c.stored, err = keyspace.ParseOffset(kvs[0].Value); err != nil {
			in.log.Error("stored offset is malformed; treating it as out of range", "partition", part.String(), "err", err)
			c.stored = -2
		}
	}
	in.log.Info("partition claimed", "partition", p, "claim_revision", c.rev, "stored_offset", c.stored, "member", member, "generation", gen)
	return c, nil
}

// logBounds lists the topic's start and end offsets.
func (in *Ingester) logBounds(ctx context.Context, adm *kadm.Client) (starts, ends kadm.ListedOffsets, err error) {
	err = in.retry(ctx, func(ctx context.Context) error {
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
		return nil, nil, fmt.Errorf("%w: listing the log's offsets: %v", ErrClaim, err)
	}
	return starts, ends, nil
}

// startClaimed builds partition p's worker from its claim, its endpoints
// and the log's bounds [start, end], decides where it consumes from,
// rebuilds its state and starts it.
func (in *Ingester) startClaimed(ctx context.Context, cl *kgo.Client, p int32, c claimed, eps map[keyspace.Endpoint]*endpoint, start, end int64) error {
	w := in.newWorker(p, c.rev, eps)
	w.offsetRev = c.offRev
	w.hwm = end
	switch {
	case c.stored >= start && c.stored <= end:
		w.next, w.committed = c.stored, c.stored
	case c.stored == -1 && len(w.eps) == 0:
		// Never consumed: start at the log start.
		w.next, w.committed = start, -1
	default:
		// Outside the log (or lost): the worker drops the partition's
		// endpoints and stores the log start before consuming. The
		// drops delete the chunks etcd has now, not those of the
		// stored offset's revision: nothing is replayed from it.
		w.next, w.committed = c.stored, c.stored
		w.reset = start
		w.offsetRev = 0
	}
	if _, err := w.rebuild(ctx); err != nil {
		return err
	}
	from := w.next
	if w.reset >= 0 {
		from = w.reset
	}
	in.start(cl, w, from)
	return nil
}

// loadEndpoints reads the endpoints of partition part: the member keys
// under its members/ prefix, then their records, in transactions of at
// most MaxTxnOps reads. A record that names another partition (its
// endpoint moved; the member key is stale and expires with the old lease)
// or is missing is skipped; a malformed one is loaded without a state
// (dropAtClaim), for init to drop with its chunks.
func (in *Ingester) loadEndpoints(ctx context.Context, part keyspace.Partition) (map[keyspace.Endpoint]*endpoint, error) {
	ks := in.cfg.Keyspace
	var members *clientv3.GetResponse
	if err := in.retry(ctx, func(ctx context.Context) error {
		var err error
		members, err = in.cfg.Etcd.Get(ctx, ks.MembersPrefix(part), clientv3.WithPrefix(), clientv3.WithKeysOnly())
		return err
	}); err != nil {
		return nil, err
	}
	ids := make([]keyspace.Endpoint, 0, len(members.Kvs))
	for _, kv := range members.Kvs {
		_, id, err := ks.ParseMemberKey(string(kv.Key))
		if err != nil {
			in.log.Warn("ignoring a malformed member key", "key", string(kv.Key), "err", err)
			continue
		}
		ids = append(ids, id)
	}
	out := make(map[keyspace.Endpoint]*endpoint, len(ids))
	for len(ids) > 0 {
		batch := ids[:min(len(ids), in.cfg.MaxTxnOps)]
		ids = ids[len(batch):]
		gets := make([]clientv3.Op, len(batch))
		for k, id := range batch {
			gets[k] = clientv3.OpGet(ks.EndpointKey(id))
		}
		var resp *clientv3.TxnResponse
		if err := in.retry(ctx, func(ctx context.Context) error {
			var err error
			resp, err = in.cfg.Etcd.Txn(ctx).Then(gets...).Commit()
			return err
		}); err != nil {
			return nil, err
		}
		for k, id := range batch {
			kvs := resp.Responses[k].GetResponseRange().GetKvs()
			if len(kvs) == 0 {
				continue // the record went; its member key goes with its lease
			}
			rec, err := keyspace.UnmarshalEndpointRecord(kvs[0].Value)
			if err != nil {
				// Skipped, the endpoint would look new at its next record:
				// its first chunk written over the chunk 0 etcd holds, the
				// other chunks left where no removal reaches them. Loaded
				// without a state instead, so the rebuild lists its chunks
				// and init drops them with the record.
				in.log.Warn("an endpoint record does not decode; dropping the endpoint and its chunks, its next records start it afresh", "key", string(kvs[0].Key), "err", err)
				ep := newEndpoint(ks, part, id)
				ep.inEtcd, ep.dropAtClaim, ep.hashMode = true, "malformed_record", in.cfg.HashMode
				out[id] = ep
				continue
			}
			if rec.Topic != part.Topic || rec.Partition != part.Partition {
				continue
			}
			ep := newEndpoint(ks, part, id)
			ep.fromRecord(&rec)
			out[id] = ep
		}
	}
	return out, nil
}

func (in *Ingester) newWorker(p int32, claimRev int64, eps map[keyspace.Endpoint]*endpoint) *worker {
	part := keyspace.Partition{Topic: in.cfg.Topic, Partition: p}
	log := in.log.With("partition", p)
	win := newWindow()
	ownerKey := in.cfg.Keyspace.OwnerKey(part)
	return &worker{
		cfg:    &in.cfg,
		p:      part,
		log:    log,
		m:      in.m,
		kv:     in.kv,
		leases: in.leases,
		ap: applier{cfg: &in.cfg, p: part, log: log, m: in.m, dec: events.NewDecoder(in.cfg.Mediums), mediums: in.cfg.Mediums.Fingerprint(),
			rule: in.cfg.chunkRule(), eps: eps, win: win, out: in.outage},
		win: win,
		eps: eps,
		pk: &packer{cfg: &in.cfg, log: log, m: in.m, kv: in.kv, leases: in.leases, p: part, b: newTxnBuilder(in.cfg.MaxTxnOps, ownerKey),
			claimRev: claimRev, offsetKey: []byte(in.cfg.Keyspace.OffsetKey(part)), withEngine: in.cfg.HashMode == keyspace.HashModeToken},
		claimRev: claimRev,
		reset:    -1,
	}
}

// init performs an offset reset if one is due, drops the endpoints a
// crashed window left behind and those of the other hash mode, and writes
// the chunks the rebuild changed, before the first record.
func (w *worker) init(ctx context.Context) error {
	// A claim may touch more endpoints than one window's last transaction
	// writes records for (maxDirty): the window is written whenever it
	// holds that many, each time at the stored offset again (idempotent).
	flush := func() error {
		if len(w.win.dirty) < w.maxDirty() {
			return nil
		}
		return w.commit(ctx)
	}
	for _, ep := range w.eps {
		if ep.leasesDirty() {
			w.win.markDirty(ep)
			if w.reset < 0 { // else the reset drops them all, in one window of deletes
				if err := flush(); err != nil {
					return err
				}
			}
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
		// Chunks the rebuild had to change, and the leftovers of a
		// crashed window: written at the state as of the stored offset
		// (deleted when it has none), before any drop below deletes what
		// the state holds.
		for _, f := range ep.fixes {
			w.win.chunkChanged(ep, f.tier, f.seq, ep.chunks[f.tier].chunks[f.seq])
		}
		ep.fixes = nil
		if err := flush(); err != nil {
			return err
		}
	}
	for _, ep := range w.eps {
		switch {
		case ep.dropAtClaim != "":
			w.ap.drop(ep, ep.dropAtClaim, true)
		case ep.base == nil || ep.base.lastRecord.IsZero():
			// Written by a window that crashed before committing, for an
			// endpoint that did not exist at the stored offset.
			w.ap.drop(ep, "stale", true)
		}
		if err := flush(); err != nil {
			return err
		}
	}
	otherMode := 0
	for _, ep := range w.eps {
		if ep.hashMode != w.cfg.HashMode {
			// Its keys are of the other mode: no lookup of this mode could
			// find them, and no removal of this mode reach them. One WARN
			// per claim says it happened; each endpoint is an INFO line.
			if otherMode++; otherMode == 1 {
				w.log.Warn("dropping the blocks of endpoints written in another hash mode (is --hash-mode the fleet's?)", "endpoint", ep.id.String(), "stored", ep.hashMode, "mode", w.cfg.HashMode)
			} else {
				w.log.Info("dropping an endpoint written in another hash mode", "endpoint", ep.id.String(), "stored", ep.hashMode, "mode", w.cfg.HashMode)
			}
			w.ap.drop(ep, "hash_mode", false)
			ep.hashMode = w.cfg.HashMode
			w.win.markDirty(ep) // rewritten in this mode
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if w.ap.tokenMode() {
		w.ap.capMaps()
	}
	w.ap.claimed() // the claim rule of DESIGN semantics 8 (v1.1)
	if w.win.empty() {
		return nil
	}
	return w.commit(ctx)
}

// retry calls fn until it succeeds or ctx ends, backing off between tries.
func (in *Ingester) retry(ctx context.Context, fn func(context.Context) error) error {
	return backoff.Retry(ctx, backoff.New(20*time.Millisecond, time.Second, nil), fn, nil)
}
