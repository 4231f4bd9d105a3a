package index_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/kvindex/kvindex/bench/paired"
	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/internal/index"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// BenchmarkApplyEndpointRecord measures applying a watched endpoints/
// record, as the ingester rewrites one per endpoint in every window it
// commits (block size, hash mode, seq, batch ts, last record time,
// partition, leases), against the reference measured in the same loop:
// json.Valid over the same bytes, the least any reader of the JSON does.
// Metrics: ns/record, valid-ns/record, x-valid.
func BenchmarkApplyEndpointRecord(b *testing.B) {
	ks := keyspace.Default()
	const n = 64
	keys := make([]string, n)
	values := make([][]byte, n)
	for i := range keys {
		ep := keyspace.Endpoint{Model: "meta-llama/Llama-3.1-8B-Instruct", Pod: fmt.Sprintf("default/vllm-%d", i)}
		keys[i] = ks.EndpointKey(ep)
		seq := uint64(1000 + i)
		rec := keyspace.EndpointRecord{BlockSize: 16, HashMode: keyspace.HashModeEngine, Seq: &seq, BatchTS: 1764480000.25,
			LastRecord: time.Date(2026, 11, 30, 7, 0, 0, 0, time.UTC), Topic: "kvindex-events", Partition: int32(i % 4),
			Lease: keyspace.LeaseID(0x694d7a1b2c3d4e5f + i), TierLeases: map[string][]keyspace.LeaseShard{
				"gpu": {{ID: keyspace.LeaseID(0x694d7a1b2c3d4f00 + i), Keys: 4096}},
				"cpu": {{ID: keyspace.LeaseID(0x694d7a1b2c3d5000 + i), Keys: 10000}, {ID: keyspace.LeaseID(0x694d7a1b2c3d5100 + i), Keys: 6384}},
			}}
		var err error
		if values[i], err = rec.Marshal(); err != nil {
			b.Fatal(err)
		}
	}
	ix := index.New(ks)
	var tm paired.Timer
	valid := 0
	for b.Loop() {
		tm.Step(n, func() {
			ix.Write(2, func() {
				for i, k := range keys {
					if _, err := ix.ApplyPut(k, nil, values[i]); err != nil {
						b.Fatal(err)
					}
				}
			})
		}, func() {
			for _, v := range values {
				if json.Valid(v) {
					valid++
				}
			}
		})
	}
	if valid != tm.Units {
		b.Fatalf("%d of %d records valid JSON", valid, tm.Units)
	}
	tm.Report(b, "record", "valid")
}

// BenchmarkLookupTokens measures a token Lookup (LookupTokens: keying the
// prompt with client.AppendTokenKeys at the endpoints' block size, then
// the probe) against the reference measured in the same loop: Lookup of
// the same prompt's keys computed beforehand, as a router that hashes
// locally sends them. The difference is the keying. The prompt has 512
// blocks of 16 tokens (8,192 tokens); "one_endpoint": one endpoint in
// token mode holds all of it; "64_endpoints": 64 hold prefixes of 0 to
// 504 blocks. Metrics: ns/block (per prompt block), hashes-ns/block,
// x-hashes.
func BenchmarkLookupTokens(b *testing.B) {
	for _, tc := range []struct {
		name      string
		endpoints int
		held      func(e int) int // blocks endpoint e holds
		want      int             // endpoints matched
	}{
		{"one_endpoint", 1, func(int) int { return 512 }, 1},
		{"64_endpoints", 64, func(e int) int { return (e * 8) % 512 }, 63},
	} {
		b.Run(tc.name, func(b *testing.B) {
			benchLookupTokens(b, tc.endpoints, tc.held, tc.want)
		})
	}
}

func benchLookupTokens(b *testing.B, endpoints int, held func(int) int, want int) {
	ks := keyspace.Default()
	const (
		model     = "meta-llama/Llama-3.1-8B-Instruct"
		blockSize = 16
		blocks    = 512
	)
	toks := make([]uint32, blockSize*blocks)
	for i := range toks {
		toks[i] = uint32(i*2654435761) % 152000
	}
	p := client.TokenPrompt{TokenIDs: toks}
	keys := client.TokenKeys(p, blockSize)
	ix := index.New(ks)
	rec, err := (&keyspace.EndpointRecord{HashMode: keyspace.HashModeToken, BlockSize: blockSize}).Marshal()
	if err != nil {
		b.Fatal(err)
	}
	ix.Write(1, func() {
		for e := range endpoints {
			ep := keyspace.Endpoint{Model: model, Pod: fmt.Sprintf("default/vllm-%d", e)}
			if _, err := ix.ApplyPut(ks.EndpointKey(ep), nil, rec); err != nil {
				b.Fatal(err)
			}
			for _, k := range keys[:held(e)] {
				if err := ix.Put(ep, tier.All[e%2], k); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	keyer := func(dst []uint64, size int) []uint64 { return client.AppendTokenKeys(dst, p, size) }
	var tok, hash index.Scratch
	var tm paired.Timer
	for b.Loop() {
		tm.Step(blocks, func() {
			ix.LookupTokens(&tok, model, keyer, nil)
		}, func() {
			ix.Lookup(&hash, model, keys, nil)
		})
	}
	if len(tok.Matches) != want || len(hash.Matches) != want || tok.Matches[0].Blocks != hash.Matches[0].Blocks || tok.Matches[0].BlockSize != blockSize {
		b.Fatalf("token Lookup found %d endpoints (longest %+v), hash Lookup %d (longest %+v); want %d each",
			len(tok.Matches), tok.Matches[0], len(hash.Matches), hash.Matches[0], want)
	}
	tm.Report(b, "block", "hashes")
}
