package ingester

import (
	"context"
	"fmt"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/kvindex/kvindex/internal/keyspace"
)

// register keeps ingesters/{ID} on a session lease of LeaseTTL for as long
// as Run runs, rewriting it with the owned partitions whenever the
// assignment changes, so operators see every live ingester and what it
// owns (`etcdctl get --prefix /kvindex/v1/ingesters/`). The key goes away
// with the session: at once on a clean stop, after the TTL on a crash. A
// failure to register is logged and retried, never fatal: the key is for
// people, not for correctness.
func (in *Ingester) register(ctx context.Context) {
	key := in.cfg.Keyspace.IngesterKey(in.cfg.ID)
	host, _ := os.Hostname()
	rec := keyspace.IngesterRecord{Host: host, Started: time.Now().UTC(), Partitions: []string{}}
	for ctx.Err() == nil {
		err := in.registerSession(ctx, key, &rec)
		if ctx.Err() != nil {
			return
		}
		in.log.Warn("ingester registration lost, retrying", "key", key, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// registerSession holds one session: put the record, rewrite it on every
// assignment change, return when the session ends or ctx does.
func (in *Ingester) registerSession(ctx context.Context, key string, rec *keyspace.IngesterRecord) error {
	sess, err := concurrency.NewSession(in.cfg.Etcd, concurrency.WithTTL(int(in.cfg.LeaseTTL/time.Second)), concurrency.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("session lease: %w", err)
	}
	defer sess.Close()
	put := func() error {
		rec.Partitions = rec.Partitions[:0]
		for _, p := range in.Partitions() {
			rec.Partitions = append(rec.Partitions, keyspace.Partition{Topic: in.cfg.Topic, Partition: p}.String())
		}
		v, err := rec.Marshal()
		if err != nil {
			return err
		}
		_, err = in.cfg.Etcd.Put(ctx, key, string(v), clientv3.WithLease(sess.Lease()))
		return err
	}
	if err := put(); err != nil {
		return fmt.Errorf("putting %s: %w", key, err)
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-sess.Done():
			return fmt.Errorf("session lease of %s expired", key)
		case <-in.assigned:
			if err := put(); err != nil {
				return fmt.Errorf("updating %s: %w", key, err)
			}
		}
	}
}
