package ingester

import (
	"log/slog"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvindex/kvindex/bench/paired"
	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/sim/fleetsim"
)

// fleetRecords serves the first n requests of the bundled conversation
// trace on a 16-endpoint fleetsim fleet and returns its batches as the
// Kafka records a bridge produces (key the pod, headers model and seq),
// and their block ops.
func fleetRecords(tb testing.TB, n int) ([]*kgo.Record, int) {
	tb.Helper()
	trace, err := fleetsim.LoadTrace(filepath.Join("..", "testdata", "mooncake", "conversation_trace.jsonl"))
	if err != nil {
		tb.Fatal(err)
	}
	f, err := fleetsim.New(fleetsim.Config{Endpoints: 16, GPUBlocks: 4096, CPUBlocks: 16384})
	if err != nil {
		tb.Fatal(err)
	}
	seq := make([]uint64, 16)
	var recs []*kgo.Record
	ops := 0
	for k, req := range trace[:min(n, len(trace))] {
		i, evs := f.Serve(req)
		if len(evs) == 0 {
			continue
		}
		v, err := events.Encode(events.Batch{TS: float64(k) / 1000, Events: evs}, events.EncodingMap)
		if err != nil {
			tb.Fatal(err)
		}
		seq[i]++
		for _, ev := range evs {
			ops += len(ev.BlockHashes)
		}
		recs = append(recs, &kgo.Record{Key: []byte(f.Pod(i)), Value: v, Offset: int64(len(recs)),
			Timestamp: time.Unix(0, int64(k)*int64(time.Millisecond)),
			Headers:   []kgo.RecordHeader{{Key: "model", Value: []byte("m")}, {Key: "seq", Value: []byte(strconv.FormatUint(seq[i], 10))}}})
	}
	return recs, ops
}

// BenchmarkApplyFleet measures the applier (decode, token-mode keying,
// the chunk rule, the window's chunk writes) on the fleet stream the
// ingest benchmark produces, with windows of WindowOps block ops: ns per
// block op. No etcd: what the ingester's own CPU costs per block op before
// the transaction is built. The reference, timed in the same loop
// (bench/paired), is the least an ingester of these records could do:
// msgpack's generic decoder on each record and each block hash set in,
// or deleted from, a plain Go map per endpoint.
func BenchmarkApplyFleet(b *testing.B) {
	recs, ops := fleetRecords(b, 4000)
	cfg := DefaultConfig()
	cfg.Clock = clockwork.NewRealClock()
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	apply := func() {
		win := newWindow()
		a := &applier{cfg: &cfg, log: slog.New(slog.DiscardHandler), m: m, dec: events.NewDecoder(cfg.Mediums), mediums: cfg.Mediums.Fingerprint(),
			rule: cfg.chunkRule(), eps: map[keyspace.Endpoint]*endpoint{}, win: win}
		for _, r := range recs {
			a.record(r, false)
			if win.blockOps >= cfg.WindowOps {
				for _, ep := range win.dirty {
					ep.dirty = false
				}
				win.reset()
			}
		}
	}
	var refOps int
	reference := func() {
		sets := map[string]map[uint64]struct{}{}
		refOps = 0
		for _, r := range recs {
			var v []any // [ts, events, rank]: vLLM's array_like batch
			if err := msgpack.Unmarshal(r.Value, &v); err != nil || len(v) < 2 {
				b.Fatalf("generic decode: %v", err)
			}
			set := sets[string(r.Key)]
			if set == nil {
				set = map[uint64]struct{}{}
				sets[string(r.Key)] = set
			}
			evs, _ := v[1].([]any)
			for _, e := range evs {
				ev, _ := e.(map[string]any)
				hashes, _ := ev["block_hashes"].([]any)
				for _, h := range hashes {
					hash := anyUint64(h)
					if ev["type"] == "BlockRemoved" {
						delete(set, hash)
					} else {
						set[hash] = struct{}{}
					}
					refOps++
				}
			}
		}
	}
	var t paired.Timer
	for b.Loop() {
		t.Step(ops, apply, reference)
		if refOps != ops {
			b.Fatalf("the reference applied %d block ops, the stream has %d", refOps, ops)
		}
	}
	t.Report(b, "blockop", "msgpack-map")
}

// anyUint64 is a generically decoded msgpack integer as a uint64.
func anyUint64(v any) uint64 {
	switch n := v.(type) {
	case uint64:
		return n
	case int64:
		return uint64(n)
	case uint32:
		return uint64(n)
	case int32:
		return uint64(n)
	case uint16:
		return uint64(n)
	case int16:
		return uint64(n)
	case uint8:
		return uint64(n)
	case int8:
		return uint64(n)
	}
	return 0
}
