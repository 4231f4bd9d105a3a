package ingester

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/keyspace"
)

// BenchmarkDecodeAndKey measures decode plus token-mode keying per block
// (a batch of one BlockStored of 16 blocks of 16 tokens, chained; after
// the first, the blocks are present, so the chunk rule only looks them
// up), with decode alone as the reference in the same run.
func BenchmarkDecodeAndKey(b *testing.B) {
	const blocks, bs = 16, 16
	hashes := make([]uint64, blocks)
	toks := make([]int64, blocks*bs)
	for i := range hashes {
		hashes[i] = uint64(i+1) * 0x9e3779b97f4a7c15
	}
	for i := range toks {
		toks[i] = int64(1000 + i*7)
	}
	payload, err := events.Encode(events.Batch{TS: 1, Events: []events.Event{{Type: events.BlockStored, BlockHashes: hashes, TokenIDs: toks, BlockSize: bs, Medium: "GPU"}}}, events.EncodingArray)
	if err != nil {
		b.Fatal(err)
	}
	dec := events.NewDecoder(nil)
	b.Run("decode", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := dec.Decode(payload); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*blocks), "ns/block")
	})
	b.Run("decode_and_key", func(b *testing.B) {
		cfg := DefaultConfig()
		m, err := newMetrics(prometheus.NewRegistry())
		if err != nil {
			b.Fatal(err)
		}
		a := &applier{cfg: &cfg, m: m, win: newWindow(), eps: map[keyspace.Endpoint]*endpoint{}, rule: chunkRule{size: cfg.ChunkSize, mergeBelow: 16}}
		ep := &endpoint{hashMode: keyspace.HashModeToken}
		for i := 0; i < b.N; i++ {
			batch, err := dec.Decode(payload)
			if err != nil {
				b.Fatal(err)
			}
			a.storedTokens(ep, &batch.Events[0])
			if len(a.win.writes) > 1<<16 {
				a.win.reset()
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*blocks), "ns/block")
	})
}
