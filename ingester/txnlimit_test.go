package ingester

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
)

// TestEtcdTxnLimit: the probe finds min(want, etcd's --max-txn-ops),
// also for a limit that is no power of two, and refuses an etcd below
// minTxnOps; the probes leave etcd's revision where it was (they are
// read-only).
func TestEtcdTxnLimit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		etcd    uint
		want    int
		got     int
		refused bool
	}{
		{etcd: 1024, want: 1024, got: 1024},
		{etcd: 1024, want: 64, got: 64},
		{etcd: 128, want: 1024, got: 128},
		{etcd: 300, want: 1024, got: 300},
		{etcd: 8, want: 1024, got: 8},
		{etcd: 129, want: 1024, got: 129},
		{etcd: 100, want: 1024, got: 100},
		{etcd: 4, want: 1024, refused: true},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("etcd_%d_want_%d", tt.etcd, tt.want), func(t *testing.T) {
			e := testutil.StartEtcd(t, testutil.WithMaxTxnOps(tt.etcd))
			ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
			defer cancel()
			before, err := e.Client.Get(ctx, "x")
			if err != nil {
				t.Fatal(err)
			}
			got, err := etcdTxnLimit(ctx, clientv3.RetryKVClient(e.Client), []byte("/kvindex/v2/offsets/"), tt.want)
			if tt.refused {
				if !errors.Is(err, errEtcdTxnLimit) {
					t.Fatalf("got %d, %v; want errEtcdTxnLimit", got, err)
				}
				return
			}
			if err != nil || got != tt.got {
				t.Fatalf("got %d, %v; want %d", got, err, tt.got)
			}
			after, err := e.Client.Get(ctx, "x")
			if err != nil {
				t.Fatal(err)
			}
			if after.Header.Revision != before.Header.Revision {
				t.Errorf("the probes moved etcd's revision from %d to %d", before.Header.Revision, after.Header.Revision)
			}
		})
	}
}

// TestIngesterSizesTxnsToEtcd: an ingester configured for bigger
// transactions than its etcd takes writes transactions etcd accepts (the
// ingest goes through instead of stopping on a refused transaction), and
// reports the bound it packs to.
func TestIngesterSizesTxnsToEtcd(t *testing.T) {
	const topic = "txnlimit"
	e := newEnv(t, 1, []string{topic}, testutil.WithMaxTxnOps(32))
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(60*time.Second))
	defer cancel()
	cfg := e.config(t, topic, "g-"+topic, "/kvindex/"+topic+"/")
	reg := prometheus.NewRegistry()
	cfg.Registry = reg
	cfg.MaxTxnOps = 1024
	start(t, cfg)
	hashes := chain(500, 7)
	rec := batchRecord(t, "m", "pod", time.Now(), events.Event{Type: events.BlockStored, BlockHashes: hashes, Medium: "GPU"})
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic, ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{rec}))
	if n := blockCount(t, ctx, e, cfg.Keyspace, keyspace.Endpoint{Model: "m", Pod: "pod"}); n != len(hashes) {
		t.Errorf("%d block keys, want %d", n, len(hashes))
	}
	if got := testutil.GaugeValue(t, reg, "kvindex_ingester_txn_ops_limit", nil); got != 32 {
		t.Errorf("kvindex_ingester_txn_ops_limit = %v, want etcd's 32", got)
	}
}
