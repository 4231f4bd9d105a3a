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

// TestPackBounded: the packer, alone (no etcd), cuts a window whose
// leases are settled into transactions within MaxTxnOps and MaxTxnBytes,
// and into one transaction when it fits; each endpoint new to etcd has its
// record and member key put in the first transaction that puts one of its
// chunks (or before); every chunk the window touched is written exactly
// once; the last transaction alone stores the offset with every touched
// endpoint's record, and deletes the record of the endpoint dropped with
// it.
func TestPackBounded(t *testing.T) {
	for _, maxOps := range []int{8, 16, 128} {
		t.Run(fmt.Sprintf("max_txn_ops_%d", maxOps), func(t *testing.T) {
			cfg := DefaultConfig().withDefaults()
			cfg.MaxTxnOps = maxOps
			part := keyspace.Partition{Topic: "t", Partition: 3}
			pk := &packer{cfg: &cfg, p: part, b: newTxnBuilder(maxOps, cfg.Keyspace.OwnerKey(part)), claimRev: 1,
				offsetKey: []byte(cfg.Keyspace.OffsetKey(part)), withEngine: true}
			win := newWindow()
			rule := chunkRule{size: 4, mergeBelow: 2}
			eps := map[keyspace.Endpoint]*endpoint{}
			var list []*endpoint
			for i := range 3 {
				ep := newEndpoint(cfg.Keyspace, part, keyspace.Endpoint{Model: "m", Pod: fmt.Sprintf("pod-%d", i)})
				ep.lease = clientv3.LeaseID(100 + i)
				ep.tiers[tier.GPU] = []shard{{id: clientv3.LeaseID(200 + i)}}
				ep.leasesChanged()
				eps[ep.id] = ep
				list = append(list, ep)
				win.markDirty(ep)
			}
			for k := range 60 {
				ep := list[k%3]
				if k%7 == 0 {
					removeChunk(rule, ep, tier.GPU, uint64(k-3), win)
				} else {
					storeChunk(rule, ep, tier.GPU, uint64(k), uint64(k)<<8, win)
				}
			}
			// An endpoint etcd has, dropped with its record in the window.
			gone := newEndpoint(cfg.Keyspace, part, keyspace.Endpoint{Model: "m", Pod: "gone"})
			gone.inEtcd, gone.lease = true, 300
			storeChunk(rule, gone, tier.GPU, 1, 1, win)
			dropChunks(gone, tier.GPU, win)
			gone.gone = true
			win.drop(gone, true)

			want := map[string]bool{}
			for _, wr := range win.writes {
				want[cfg.Keyspace.ChunkKey(wr.ep.id, wr.tier, wr.seq)] = true
				if wr.c != nil {
					wr.c.lease = wr.ep.tiers[wr.tier][0].id
				}
			}
			var txns int
			written := map[string]int{}
			deleted := map[string]bool{}
			pos := 0
			for {
				kind, end, err := pk.pack(win, eps, pos, 42)
				if err != nil {
					t.Fatal(err)
				}
				txns++
				b := pk.b
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
						if bytes.Equal(p.Key, pk.offsetKey) {
							hasOffset = true
						}
						if cfg.Keyspace.KindOf(key) == keyspace.KindEndpoint || cfg.Keyspace.KindOf(key) == keyspace.KindMember {
							recorded[key] = true
						}
					} else {
						key = string(op.GetRequestDeleteRange().Key)
						deleted[key] = true
					}
					if cfg.Keyspace.KindOf(key) == keyspace.KindChunk {
						written[key]++
						for _, ep := range list {
							if !ep.inEtcd && strings.HasPrefix(key, ep.chunksPrefix) && op.GetRequestPut() != nil {
								if !recorded[ep.key] || !recorded[ep.memberKey] {
									t.Errorf("transaction %d puts %s before %s's record and member key are in etcd or in it", txns, key, ep.id.Pod)
								}
							}
						}
					}
				}
				final := kind == TxnCommit
				if hasOffset != final {
					t.Errorf("transaction %d: stores the offset %v, is the last %v", txns, hasOffset, final)
				}
				pk.landed()
				if final {
					for _, ep := range list {
						if !recorded[ep.key] {
							t.Errorf("the last transaction does not write %s's record", ep.id.Pod)
						}
					}
					break
				}
				pos = end
			}
			got := map[string]bool{}
			for k, n := range written {
				got[k] = true
				if n != 1 {
					t.Errorf("%s written %d times, want once", k, n)
				}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("chunk keys written (-want +got):\n%s", diff)
			}
			if !deleted[gone.key] || !deleted[gone.memberKey] {
				t.Errorf("the dropped endpoint's record or member key was not deleted (deleted %v)", deleted)
			}
			least := (len(want) + 2*len(list) + 2 + 1 + maxOps - 1) / maxOps
			if txns < least {
				t.Errorf("%d transactions, want at least %d", txns, least)
			}
			if maxOps >= 128 && txns != 1 {
				t.Errorf("%d transactions for a window that fits one", txns)
			}
		})
	}
}
