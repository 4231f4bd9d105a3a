package bench

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/logging"
	"github.com/kvindex/kvindex/internal/tier"
)

// tinyStream is two records of pod p on one partition: blocks 1, 2, 3
// stored in GPU, then 2 removed and 4 stored after 3.
func tinyStream(t *testing.T) (*Stream, []placement) {
	t.Helper()
	batches := [][]events.Event{
		{{Type: events.BlockStored, BlockHashes: []uint64{1, 2, 3}, BlockSize: 16, Medium: "GPU", Tier: tier.GPU}},
		{{Type: events.BlockRemoved, BlockHashes: []uint64{2}, Medium: "GPU", Tier: tier.GPU},
			{Type: events.BlockStored, BlockHashes: []uint64{4}, ParentHash: 3, HasParent: true, BlockSize: 16, Medium: "GPU", Tier: tier.GPU}},
	}
	s := &Stream{}
	for i, evs := range batches {
		v, err := events.Encode(events.Batch{TS: float64(i + 1), Events: evs}, events.EncodingMap)
		if err != nil {
			t.Fatal(err)
		}
		s.Records = append(s.Records, Record{Pod: "p", Seq: uint64(i + 1), Value: v})
	}
	return s, []placement{{0, 0}, {0, 1}}
}

// txnShape renders a transaction's ops as "put KEY" / "del KEY", keys
// relative to the keyspace prefix, the endpoint's sections shortened.
func txnShape(ks keyspace.Keyspace, t *pb.TxnRequest) []string {
	var out []string
	for _, op := range t.Success {
		k, del := opKey(op)
		s := strings.TrimPrefix(string(k), ks.Prefix())
		s = strings.ReplaceAll(strings.ReplaceAll(s, "bench%2Fmooncake/p/0", ""), "//", "/")
		if del {
			out = append(out, "del "+s)
		} else {
			out = append(out, "put "+s)
		}
	}
	return out
}

func TestBuildV1Txns(t *testing.T) {
	ks := keyspace.Default()
	hash := func(h uint64) string { return string(keyspace.AppendHash(nil, h)) }
	b := func(h uint64) string { return "blocks/gpu/" + hash(h) }
	for _, tc := range []struct {
		name      string
		windowOps int
		maxTxnOps int
		want      [][]string
		counts    v1Counts
	}{
		{
			name: "one_window", windowOps: 100, maxTxnOps: 100,
			// 2 is put then deleted: one op, a delete, in the put's place.
			want:   [][]string{{"put members/t/0/", "put endpoints/", "put " + b(1), "del " + b(2), "put " + b(3), "put " + b(4), "put endpoints/", "put offsets/t/0"}},
			counts: v1Counts{Windows: 1, Txns: 1, Ops: 8, BlockOps: 4},
		},
		{
			name: "window_per_record", windowOps: 3, maxTxnOps: 100,
			want: [][]string{
				{"put members/t/0/", "put endpoints/", "put " + b(1), "put " + b(2), "put " + b(3), "put endpoints/", "put offsets/t/0"},
				{"del " + b(2), "put " + b(4), "put endpoints/", "put offsets/t/0"},
			},
			counts: v1Counts{Windows: 2, Txns: 2, Ops: 11, BlockOps: 5},
		},
		{
			name: "split_at_the_op_bound", windowOps: 100, maxTxnOps: 4,
			want: [][]string{
				{"put members/t/0/", "put endpoints/", "put " + b(1), "del " + b(2)},
				{"put " + b(3), "put " + b(4), "put endpoints/", "put offsets/t/0"},
			},
			counts: v1Counts{Windows: 1, Txns: 2, Ops: 8, BlockOps: 4},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, at := tinyStream(t)
			c, counts, err := buildV1Txns(s, at, v1Options{ks: ks, topic: "t", mode: keyspace.HashModeEngine, windowOps: tc.windowOps, maxTxnOps: tc.maxTxnOps})
			if err != nil {
				t.Fatal(err)
			}
			var got [][]string
			for _, txn := range c.txns[0] {
				got = append(got, txnShape(ks, txn))
				if len(txn.Compare) != 1 || string(txn.Compare[0].Key) != ks.OwnerKey(keyspace.Partition{Topic: "t"}) {
					t.Errorf("transaction guard %v: want the owner key's revision", txn.Compare)
				}
			}
			if diff := gocmp.Diff(tc.want, got); diff != "" {
				t.Errorf("transactions (-want +got):\n%s", diff)
			}
			if diff := gocmp.Diff(tc.counts, counts); diff != "" {
				t.Errorf("counts (-want +got):\n%s", diff)
			}
			cc := c.counts()
			if cc.Layout != "v1" || cc.DataOps != int64(counts.BlockOps) || cc.Ops != int64(counts.Ops) || cc.Txns != int64(counts.Txns) {
				t.Errorf("capture counts %+v disagree with the writer's %+v", cc, counts)
			}
		})
	}
}

func TestBuildV1TxnsRefusesOtherEvents(t *testing.T) {
	v, err := events.Encode(events.Batch{TS: 1, Events: []events.Event{{Type: events.AllBlocksCleared}}}, events.EncodingMap)
	if err != nil {
		t.Fatal(err)
	}
	s := &Stream{Records: []Record{{Pod: "p", Seq: 1, Value: v}}}
	if _, _, err := buildV1Txns(s, []placement{{0, 0}}, v1Options{ks: keyspace.Default(), topic: "t"}); err == nil {
		t.Fatal("a clear event was accepted; the v1 writer does not implement clears")
	}
	if _, _, err := buildV1Txns(s, nil, v1Options{ks: keyspace.Default(), topic: "t"}); err == nil {
		t.Fatal("records without placements were accepted")
	}
}

func TestV1BlockKeyRoundTrip(t *testing.T) {
	ks := keyspace.Default()
	want := keyspace.Block{Endpoint: keyspace.Endpoint{Model: "m/x", Pod: "ns/pod 0", Rank: 3}, Tier: tier.CPU, Hash: 0xdeadbeef}
	key := string(appendV1BlockKey(nil, v1EndpointPrefix(ks, want.Endpoint), want.Tier, want.Hash))
	if key != ks.Prefix()+"blocks/m%2Fx/ns%2Fpod%200/3/cpu/00000000deadbeef" {
		t.Fatalf("key %q", key)
	}
	got, err := parseV1BlockKey(ks, key)
	if err != nil || got != want {
		t.Fatalf("parse %q = %+v, %v; want %+v", key, got, err, want)
	}
	for _, bad := range []string{ks.Prefix() + "blocks/m/p/0/gpu", ks.Prefix() + "blocks/m/p/x/gpu/00000000deadbeef",
		ks.Prefix() + "chunks/m/p/0/gpu/00000000deadbeef", ks.Prefix() + "blocks/m/p/0/tape/00000000deadbeef"} {
		if _, err := parseV1BlockKey(ks, bad); err == nil {
			t.Errorf("parse %q: no error", bad)
		}
	}
}

// TestV1WriterReproducesStream checks the v1-layout reference on a fleet
// stream: its transactions, written straight to a fresh etcd, leave
// exactly the blocks the stream describes (the reference model's answer),
// in both hash modes, with transactions split at a small op bound; with a
// window per record, its block ops are exactly the distinct (tier, block)
// of each record, counted here from the decoded events.
func TestV1WriterReproducesStream(t *testing.T) {
	trace := loadTestTrace(t)
	s, err := BuildStream(trace, StreamConfig{Endpoints: 4, GPUBlocks: 32, CPUBlocks: 64, Requests: 300})
	if err != nil {
		t.Fatal(err)
	}
	// Two partitions by pod, offsets in stream order.
	at := make([]placement, len(s.Records))
	next := map[int32]int64{}
	for i, r := range s.Records {
		p := int32(r.Pod[len(r.Pod)-1]) % 2
		at[i] = placement{partition: p, offset: next[p]}
		next[p]++
	}
	for _, mode := range []keyspace.HashMode{keyspace.HashModeEngine, keyspace.HashModeToken} {
		t.Run(string(mode), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			const maxTxnOps = 64
			c, counts, err := buildV1Txns(s, at, v1Options{ks: keyspace.Default(), topic: "t", mode: mode, maxTxnOps: maxTxnOps})
			if err != nil {
				t.Fatal(err)
			}
			if counts.Unkeyed != 0 {
				t.Fatalf("%d blocks not keyed", counts.Unkeyed)
			}
			for p, txns := range c.txns {
				for i, txn := range txns {
					if len(txn.Success) > maxTxnOps {
						t.Fatalf("partition %d transaction %d has %d ops, over %d", p, i, len(txn.Success), maxTxnOps)
					}
				}
			}
			node, err := startEtcd(ctx, logging.Discard(), etcdOptions{noFsync: true})
			if err != nil {
				t.Fatal(err)
			}
			defer node.close()
			if _, err := c.rawWrite(ctx, node.cli, "t", DefaultTxnsInFlight); err != nil {
				t.Fatal(err)
			}
			checkState(t, ctx, node, s, "t", mode)
		})
	}
	t.Run("window_per_record", func(t *testing.T) {
		_, counts, err := buildV1Txns(s, at, v1Options{ks: keyspace.Default(), topic: "t", mode: keyspace.HashModeEngine, windowOps: 1})
		if err != nil {
			t.Fatal(err)
		}
		dec := events.NewDecoder(nil)
		want, records := 0, 0
		for _, r := range s.Records {
			b, err := dec.Decode(r.Value)
			if err != nil {
				t.Fatal(err)
			}
			distinct := map[string]bool{}
			for _, ev := range b.Events {
				for _, h := range ev.BlockHashes {
					distinct[fmt.Sprint(ev.Tier, h)] = true
				}
			}
			want += len(distinct)
			if len(distinct) > 0 {
				records++
			}
		}
		if counts.BlockOps != want || counts.Windows != records {
			t.Fatalf("%d block ops in %d windows; want %d in %d", counts.BlockOps, counts.Windows, want, records)
		}
	})
}
