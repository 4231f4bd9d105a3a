package ingester

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// TestPackBounded: the pack part, alone (no etcd), cuts a window whose
// leases are settled into transactions within MaxTxnOps and MaxTxnBytes;
// each endpoint new to etcd has its record and member key put in the first
// transaction that puts one of its blocks (or before); every live op is
// written exactly once; the last transaction alone stores the offset with
// every touched endpoint's record.
func TestPackBounded(t *testing.T) {
	for _, maxOps := range []int{8, 16, 128} {
		t.Run(fmt.Sprintf("max_txn_ops_%d", maxOps), func(t *testing.T) {
			cfg := DefaultConfig().withDefaults()
			cfg.MaxTxnOps = maxOps
			part := keyspace.Partition{Topic: "t", Partition: 3}
			w := &worker{cfg: &cfg, p: part, win: newWindow(), offsetKey: []byte(cfg.Keyspace.OffsetKey(part)), next: 42}
			w.b = w.idleBuilder()
			var eps []*endpoint
			for i := range 3 {
				ep := newEndpoint(cfg.Keyspace, part, keyspace.Endpoint{Model: "m", Pod: fmt.Sprintf("pod-%d", i)})
				ep.lease = clientv3.LeaseID(100 + i)
				ep.tiers[tier.GPU] = []shard{{id: clientv3.LeaseID(200 + i)}}
				ep.leasesChanged()
				eps = append(eps, ep)
				w.win.markDirty(ep)
			}
			want := map[string]bool{}
			for k := range 60 {
				ep := eps[k%3]
				del := k%7 == 0
				w.win.ops.add(ep, tier.GPU, uint64(k), del)
				want[cfg.Keyspace.BlockKey(ep.id, tier.GPU, uint64(k))] = true
			}
			// A voided op: its endpoint was dropped after it was queued.
			voided := newEndpoint(cfg.Keyspace, part, keyspace.Endpoint{Model: "m", Pod: "voided"})
			w.win.ops.add(voided, tier.GPU, 1, false)
			voided.epoch++
			for k := range w.win.ops.ops {
				if op := &w.win.ops.ops[k]; !op.del && op.live() {
					op.lease = op.ep.tiers[op.tier][0].id
				}
			}

			ops := w.win.ops.ops
			var txns int
			written := map[string]int{}
			i := 0
			for {
				w.b.reset(1)
				j, err := w.fill(ops, i)
				if err != nil {
					t.Fatal(err)
				}
				final := false
				if j == len(ops) {
					if final, err = w.addCommitPart(); err != nil {
						t.Fatal(err)
					}
				}
				txns++
				b := w.b
				if b.n() > maxOps || b.bytes > cfg.MaxTxnBytes {
					t.Fatalf("transaction %d: %d ops, about %d bytes; bounds %d and %d", txns, b.n(), b.bytes, maxOps, cfg.MaxTxnBytes)
				}
				if b.n() == 0 {
					t.Fatalf("transaction %d is empty", txns)
				}
				recorded := map[string]bool{}
				hasOffset := false
				for _, op := range b.request().Success {
					var key string
					if p := op.GetRequestPut(); p != nil {
						key = string(p.Key)
						if bytes.Equal(p.Key, w.offsetKey) {
							hasOffset = true
						}
						if cfg.Keyspace.KindOf(key) == keyspace.KindEndpoint || cfg.Keyspace.KindOf(key) == keyspace.KindMember {
							recorded[key] = true
						}
					} else {
						key = string(op.GetRequestDeleteRange().Key)
					}
					if cfg.Keyspace.KindOf(key) == keyspace.KindBlock {
						written[key]++
						for _, ep := range eps {
							if !ep.inEtcd && strings.HasPrefix(key, ep.blocksPrefix) && op.GetRequestPut() != nil {
								if !recorded[ep.key] || !recorded[ep.memberKey] {
									t.Errorf("transaction %d puts %s before %s's record and member key are in etcd or in it", txns, key, ep.id.Pod)
								}
							}
						}
					}
				}
				if hasOffset != final {
					t.Errorf("transaction %d: stores the offset %v, is the last %v", txns, hasOffset, final)
				}
				if final {
					for _, ep := range eps {
						if !recorded[ep.key] {
							t.Errorf("the last transaction does not write %s's record", ep.id.Pod)
						}
					}
					break
				}
				w.afterTxn(b, ops[i:j])
				i = j
			}
			got := map[string]bool{}
			for k, n := range written {
				got[k] = true
				if n != 1 {
					t.Errorf("%s written %d times, want once", k, n)
				}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("block keys written (-want +got):\n%s", diff)
			}
			if least := (len(want) + 2*len(eps) + 1) / maxOps; txns < least {
				t.Errorf("%d transactions, want at least %d", txns, least)
			}
		})
	}
}
