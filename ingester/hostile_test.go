package ingester

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
)

// TestHostileRecords sends records built to break the ingester (found by
// attacking a running stack) between two valid ones, on one partition: each
// must be skipped and counted, the partition must keep committing, and the
// valid records around them must apply.
func TestHostileRecords(t *testing.T) {
	const topic = "hostile"
	e := newEnv(t, 1, []string{topic})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	cfg := e.config(t, topic, "g-hostile", "/kvindex/hostile/")
	reg := prometheus.NewRegistry()
	cfg.Registry = reg
	var logs testutil.LogBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	start(t, cfg)

	t0 := time.Now()
	batch := func(ts any, evs ...any) []byte {
		b, err := msgpack.Marshal([]any{ts, evs, nil})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	stored := func(h uint64) any {
		return map[string]any{"type": "BlockStored", "block_hashes": []uint64{h}, "medium": "GPU"}
	}
	hdr := func(kv ...string) map[string]string {
		m := map[string]string{"model": "m"}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	bad := make([]any, 20000) // one record, 20,000 invalid events
	for i := range bad {
		bad[i] = 5
	}
	recs := []refmodel.Record{
		{Key: "before", Headers: hdr(), Value: batch(1.0, stored(1)), Time: t0},
		// A non-finite batch ts once crashed the ingester on every start
		// (it could not be stored in the endpoint record as JSON).
		{Key: "inf", Headers: hdr("seq", "1"), Value: []byte{0x93, 0xcb, 0x7f, 0xf0, 0, 0, 0, 0, 0, 0, 0x90, 0xc0}, Time: t0},
		// An oversized incarnation once made every commit transaction too
		// large for etcd, stalling the partition forever.
		{Key: "huge-incarnation", Headers: hdr("seq", "0", "incarnation", strings.Repeat("x", 600<<10)), Value: batch(1.0, stored(2)), Time: t0},
		{Key: "bad-utf8-incarnation", Headers: hdr("seq", "0", "incarnation", "a\xffb"), Value: batch(1.0, stored(3)), Time: t0},
		// A producer clock in the year 2200 must not move the partition
		// clock (it would expire every other endpoint).
		{Key: "future", Headers: hdr(), Value: batch(1.0, stored(4)), Time: time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)},
		{Key: "many-bad-events", Headers: hdr(), Value: batch(1.0, bad...), Time: t0},
		{Key: "after", Headers: hdr(), Value: batch(1.0, stored(5)), Time: t0},
	}
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic, ingesttest.Produce(t, ctx, e.prod, topic, recs))

	got := map[string][]uint64{}
	for _, b := range ingesttest.Blocks(t, ctx, e.etcd.Client, cfg.Keyspace) {
		got[b.Endpoint.Pod] = append(got[b.Endpoint.Pod], b.Hash)
	}
	for pod, want := range map[string]uint64{"before": 1, "future": 4, "after": 5} {
		if len(got[pod]) != 1 || got[pod][0] != want {
			t.Errorf("pod %s holds %v, want [%d]", pod, got[pod], want)
		}
	}
	for _, pod := range []string{"inf", "huge-incarnation", "bad-utf8-incarnation"} {
		if len(got[pod]) != 0 {
			t.Errorf("skipped record of pod %s applied: %v", pod, got[pod])
		}
	}
	for reason, want := range map[string]float64{skipMalformed: 1, skipBadIncarnation: 2} {
		if n := testutil.CounterValue(t, reg, "kvindex_ingester_skipped_records_total", map[string]string{"reason": reason}); n != want {
			t.Errorf("skipped records %s = %v, want %v", reason, n, want)
		}
	}
	eps := ingesttest.Endpoints(t, ctx, e.etcd.Client, cfg.Keyspace)
	for id, rec := range eps {
		if rec.LastRecord.After(time.Now()) {
			t.Errorf("endpoint %v last seen in the future: %v", id, rec.LastRecord)
		}
	}
	if n := strings.Count(logs.String(), "events skipped"); n != 1 {
		t.Errorf("%d log lines for one record's 20,000 skipped events, want 1", n)
	}
}

// TestTransactionTooLargeForEtcdStopsLoudly: an ingester allowed bigger
// transactions than etcd accepts must not retry the refused transaction
// forever with its partition stalled; Run fails naming the flags. Run
// lowers MaxTxnOps to etcd's --max-txn-ops itself (TestEtcdTxnLimit), so
// the refusal here is for bytes: etcd's --max-request-bytes is set under
// what a transaction of 10,000 blocks takes (157 chunks of 513 bytes in
// engine-hash mode, about 85 KB).
func TestTransactionTooLargeForEtcdStopsLoudly(t *testing.T) {
	const topic = "toobig"
	e := newEnv(t, 1, []string{topic}, testutil.WithMaxRequestBytes(32<<10))
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	cfg := e.config(t, topic, "g-toobig", "/kvindex/toobig/")
	cfg.MaxTxnOps = 1024 // and MaxTxnBytes 1 MiB: etcd takes 32 KiB
	r := start(t, cfg)
	hs := make([]uint64, 10_000)
	for i := range hs {
		hs[i] = uint64(i + 1)
	}
	v, err := msgpack.Marshal([]any{1.0, []any{map[string]any{"type": "BlockStored", "block_hashes": hs, "medium": "GPU"}}, nil})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.prod.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte("pod"), Value: v, Headers: []kgo.RecordHeader{{Key: "model", Value: []byte("m")}}}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	err = r.wait(ctx)
	if err == nil || !strings.Contains(err.Error(), "--max-txn-bytes") {
		t.Fatalf("Run = %v, want an error naming --max-txn-bytes", err)
	}
}
