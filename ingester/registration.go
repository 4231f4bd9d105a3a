package ingester

import (
	"context"
	"fmt"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/backoff"
	"github.com/kvindex/kvindex/internal/keyspace"
)

// maxUnregister bounds how long a stopping ingester waits for etcd to
// revoke its registration lease.
const maxUnregister = 5 * time.Second

// register keeps ingesters/{ID} on a lease of LeaseTTL (granted and kept
// alive by the lease manager) for as long as Run runs, rewriting it with
// the owned partitions whenever the assignment changes, so operators see
// every live ingester and what it owns (`etcdctl get --prefix
// /kvindex/v2/ingesters/`). When ctx ends (a clean stop, or a fatal
// error) the lease is revoked, so the key goes at once; after a crash it
// goes with the lease, a TTL later. A failure to register is logged and
// retried, never fatal: the key is for people, not for correctness.
func (in *Ingester) register(ctx context.Context) {
	key := in.cfg.Keyspace.IngesterKey(in.cfg.ID)
	host, _ := os.Hostname()
	rec := keyspace.IngesterRecord{Host: host, Started: time.Now().UTC(), Partitions: []string{}}
	bo := backoff.New(time.Second, 30*time.Second, nil)
	for ctx.Err() == nil {
		err := in.registerLease(ctx, key, &rec)
		if ctx.Err() != nil {
			return
		}
		d := bo.Next()
		in.log.Warn("ingester registration lost, retrying", "key", key, "err", err, "backoff", d)
		_ = backoff.Sleep(ctx, nil, d)
	}
}

// registerLease holds one registration lease: put the record, rewrite it
// on every assignment change, return when the lease expires or ctx ends,
// revoking it in the last case.
func (in *Ingester) registerLease(ctx context.Context, key string, rec *keyspace.IngesterRecord) error {
	id, err := in.leases.grant(ctx)
	if err != nil {
		return fmt.Errorf("registration lease: %w", err)
	}
	lost := in.leases.watch(id)
	defer in.unregister(ctx, id)
	put := func() error {
		rec.Partitions = rec.Partitions[:0]
		for _, p := range in.Partitions() {
			rec.Partitions = append(rec.Partitions, keyspace.Partition{Topic: in.cfg.Topic, Partition: p}.String())
		}
		v, err := rec.Marshal()
		if err != nil {
			return err
		}
		// The put is bounded but not cut by ctx: an assignment change
		// comes with every stop (the group revokes the partitions), and a
		// put abandoned mid-flight is logged by the etcd client. The
		// revoke after the loop deletes the key either way.
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(maxUnregister, in.cfg.LeaseTTL))
		defer cancel()
		_, err = in.cfg.Etcd.Put(pctx, key, string(v), clientv3.WithLease(id))
		return err
	}
	if err := put(); err != nil {
		return fmt.Errorf("putting %s: %w", key, err)
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-lost:
			return fmt.Errorf("registration lease of %s expired", key)
		case <-in.assigned:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err := put(); err != nil {
				return fmt.Errorf("updating %s: %w", key, err)
			}
		}
	}
}

// unregister revokes the registration lease id, which deletes ingesters/{ID}.
// It runs once ctx (Run's) has ended, so it revokes on a context of its
// own, bounded by maxUnregister and LeaseTTL: a revoke sent on the ended
// context would be abandoned (and logged by the etcd client), leaving the
// key for a whole TTL.
func (in *Ingester) unregister(ctx context.Context, id clientv3.LeaseID) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(maxUnregister, in.cfg.LeaseTTL))
	defer cancel()
	if err := in.leases.revokeOne(rctx, id); err != nil {
		in.log.Warn("revoking the registration lease failed; the key goes when it expires", "lease", keyspaceLease(id), "err", err)
	}
}
