package bench

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
)

// readState returns every (endpoint, tier, block) etcd holds under ks, in
// either layout: the v2 chunks (read through internal/keyspace) and the
// v1 block keys (v1layout.go), sorted as refmodel sorts them. A block in
// two chunks of one tier, or a malformed key or value, is an error.
func readState(ctx context.Context, cli *clientv3.Client, ks keyspace.Keyspace) ([]keyspace.Block, error) {
	var out []keyspace.Block
	seen := map[keyspace.Block]bool{}
	add := func(b keyspace.Block) error {
		if seen[b] {
			return fmt.Errorf("block %x of %s in %s is held twice", b.Hash, b.Endpoint, b.Tier)
		}
		seen[b] = true
		out = append(out, b)
		return nil
	}
	resp, err := cli.Get(ctx, ks.ChunksPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	for _, kv := range resp.Kvs {
		c, err := ks.ParseChunkKey(string(kv.Key))
		if err != nil {
			return nil, err
		}
		v, err := keyspace.ParseChunkValue(kv.Value)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", kv.Key, err)
		}
		for i := range v.Len() {
			if err := add(keyspace.Block{Endpoint: c.Endpoint, Tier: c.Tier, Hash: v.Key(i)}); err != nil {
				return nil, err
			}
		}
	}
	if resp, err = cli.Get(ctx, v1BlocksPrefix(ks), clientv3.WithPrefix(), clientv3.WithKeysOnly()); err != nil {
		return nil, err
	}
	for _, kv := range resp.Kvs {
		b, err := parseV1BlockKey(ks, string(kv.Key))
		if err != nil {
			return nil, err
		}
		if err := add(b); err != nil {
			return nil, err
		}
	}
	refmodel.SortBlocks(out)
	return out, nil
}
