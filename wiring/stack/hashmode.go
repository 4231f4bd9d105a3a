package stack

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/keyspace"
)

// ErrHashModeChange reports a data dir whose endpoints were written in the
// other hash mode than the stack's ingester runs in. The ingester would
// drop every such endpoint's blocks at its claim (DESIGN semantics: no
// Lookup of one mode finds the other's keys), and keep the endpoints'
// sequence state, so the same records produced again would be skipped as
// duplicates: a stack started once in the wrong mode loses the data dir's
// index for good. So the stack refuses to start instead.
var ErrHashModeChange = errors.New("stack: data dir holds endpoints of the other hash mode")

// checkHashMode returns an error wrapping ErrHashModeChange when an
// endpoint record under ks is of another hash mode than mode, naming how
// many and one of them. A record that does not decode is left to the
// ingester (it drops it, logged).
func checkHashMode(ctx context.Context, cli *clientv3.Client, ks keyspace.Keyspace, mode keyspace.HashMode) error {
	resp, err := cli.Get(ctx, ks.EndpointsPrefix(), clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("stack: reading the endpoint records: %w", err)
	}
	other, example := 0, ""
	for _, kv := range resp.Kvs {
		rec, err := keyspace.UnmarshalEndpointRecord(kv.Value)
		if err != nil || rec.HashMode == mode {
			continue
		}
		if other++; example == "" {
			example = string(kv.Key)
		}
	}
	if other == 0 {
		return nil
	}
	theirs := keyspace.HashModeToken
	if mode == keyspace.HashModeToken {
		theirs = keyspace.HashModeEngine
	}
	return fmt.Errorf("%w: %d of %d endpoints are in %s mode (such as %s), and a stack in %s mode would drop their blocks for good",
		ErrHashModeChange, other, len(resp.Kvs), theirs, example, mode)
}
