package migrate

import (
	"context"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/keyspace"
)

// reader reads key ranges at one revision, page by page.
type reader struct {
	kv   clientv3.KV
	rev  int64
	page int
	// timeout bounds each read (Config.CallTimeout).
	timeout time.Duration
}

// call bounds one etcd call by d (none when d is 0).
func call(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// prefix calls fn for every key under prefix, in key order, at r.rev;
// keysOnly leaves the values out.
func (r *reader) prefix(ctx context.Context, prefix string, keysOnly bool, fn func(*mvccpb.KeyValue) error) error {
	end := keyspace.RangeEnd(prefix)
	key := prefix
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(int64(r.page)), clientv3.WithRev(r.rev)}
		if keysOnly {
			opts = append(opts, clientv3.WithKeysOnly())
		}
		cctx, cancel := call(ctx, r.timeout)
		resp, err := r.kv.Get(cctx, key, opts...)
		cancel()
		if err != nil {
			return err
		}
		for _, kv := range resp.Kvs {
			if err := fn(kv); err != nil {
				return err
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// get returns key at r.rev, or nil when it does not exist.
func (r *reader) get(ctx context.Context, key string) (*mvccpb.KeyValue, error) {
	ctx, cancel := call(ctx, r.timeout)
	defer cancel()
	resp, err := r.kv.Get(ctx, key, clientv3.WithRev(r.rev))
	if err != nil || len(resp.Kvs) == 0 {
		return nil, err
	}
	return resp.Kvs[0], nil
}

// count returns how many keys are under prefix at r.rev.
func (r *reader) count(ctx context.Context, prefix string) (int64, error) {
	ctx, cancel := call(ctx, r.timeout)
	defer cancel()
	resp, err := r.kv.Get(ctx, prefix, clientv3.WithRange(keyspace.RangeEnd(prefix)), clientv3.WithCountOnly(), clientv3.WithRev(r.rev))
	if err != nil {
		return 0, err
	}
	return resp.Count, nil
}
