package keyspace

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/bench/paired"
	"github.com/kvindex/kvindex/internal/tier"
)

// The block key benchmarks time kvindex's key code against the obvious
// standard-library version of the same work, batch by batch in one loop
// (paired.Timer): ns/key, then the reference's ns/key and the ratio.

const benchBatch = 1024

func benchKeys(ks Keyspace) (ep Endpoint, hashes []uint64, keys []string) {
	ep = Endpoint{Model: "meta-llama/Llama-3.1-8B-Instruct", Pod: "team-a/vllm 0@10.0.0.5:8000", Rank: 1}
	for i := range benchBatch {
		h := uint64(i+1) * 0x9e3779b97f4a7c15
		hashes = append(hashes, h)
		keys = append(keys, ks.ChunkKey(ep, tier.All[i%tier.Count], h))
	}
	return ep, hashes, keys
}

// BenchmarkBlockKey: AppendChunkKey (the ingester's path, endpoint prefix
// computed once) against fmt.Appendf of the same key (x-fmt).
func BenchmarkBlockKey(b *testing.B) {
	ks := Default()
	ep, hashes, keys := benchKeys(ks)
	prefix := ks.EndpointChunksPrefix(ep)
	buf := make([]byte, 0, 256)
	for i, h := range hashes {
		t := tier.All[i%tier.Count]
		if got, ref := string(AppendChunkKey(buf[:0], prefix, t, h)), string(fmt.Appendf(buf[:0], "%s%s/%016x", prefix, t, h)); got != keys[i] || ref != keys[i] {
			b.Fatalf("keys differ: %q, reference %q, want %q", got, ref, keys[i])
		}
	}
	var tm paired.Timer
	var n int
	for b.Loop() {
		tm.Step(benchBatch, func() {
			for i, h := range hashes {
				buf = AppendChunkKey(buf[:0], prefix, tier.All[i%tier.Count], h)
				n += len(buf)
			}
		}, func() {
			for i, h := range hashes {
				buf = fmt.Appendf(buf[:0], "%s%s/%016x", prefix, tier.All[i%tier.Count], h)
				n += len(buf)
			}
		})
	}
	if n == 0 {
		b.Fatal("no keys built")
	}
	tm.Report(b, "key", "fmt")
}

// refSplit is the standard-library reference for SplitChunkKey: split on
// '/', parse the tier and the hash.
func refSplit(key string) (string, tier.Tier, uint64, error) {
	parts := strings.Split(key, "/")
	if len(parts) < 3 {
		return "", tier.Unknown, 0, ErrMalformedKey
	}
	t, ok := tier.Parse(parts[len(parts)-2])
	if !ok {
		return "", tier.Unknown, 0, ErrMalformedKey
	}
	h, err := strconv.ParseUint(parts[len(parts)-1], 16, 64)
	if err != nil {
		return "", tier.Unknown, 0, err
	}
	return strings.Join(parts[:len(parts)-2], "/") + "/", t, h, nil
}

// BenchmarkSplitChunkKey: SplitChunkKey (indexd's path for every watched
// block key) against strings.Split + strconv of the same keys (x-split).
func BenchmarkSplitChunkKey(b *testing.B) {
	ks := Default()
	_, hashes, keys := benchKeys(ks)
	for i, k := range keys {
		p1, t1, h1, err1 := ks.SplitChunkKey(k)
		p2, t2, h2, err2 := refSplit(k)
		if err1 != nil || err2 != nil || p1 != p2 || t1 != t2 || h1 != h2 || h1 != hashes[i] {
			b.Fatalf("%q: %q %v %x %v, reference %q %v %x %v", k, p1, t1, h1, err1, p2, t2, h2, err2)
		}
	}
	var tm paired.Timer
	var sum uint64
	for b.Loop() {
		tm.Step(benchBatch, func() {
			for _, k := range keys {
				_, _, h, _ := ks.SplitChunkKey(k)
				sum += h
			}
		}, func() {
			for _, k := range keys {
				_, _, h, _ := refSplit(k)
				sum += h
			}
		})
	}
	if sum == 1 {
		b.Log("unlikely") // keeps the parses from being optimised away
	}
	tm.Report(b, "key", "split")
}

// refParse is the standard-library reference for ParseChunkKey.
func refParse(ks Keyspace, key string) (Chunk, error) {
	rest, ok := strings.CutPrefix(key, ks.ChunksPrefix())
	if !ok {
		return Chunk{}, ErrMalformedKey
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 5 {
		return Chunk{}, ErrMalformedKey
	}
	model, err := url.PathUnescape(parts[0])
	if err != nil {
		return Chunk{}, err
	}
	pod, err := url.PathUnescape(parts[1])
	if err != nil {
		return Chunk{}, err
	}
	rank, err := strconv.ParseUint(parts[2], 10, 32)
	if err != nil {
		return Chunk{}, err
	}
	t, ok := tier.Parse(parts[3])
	if !ok {
		return Chunk{}, ErrMalformedKey
	}
	h, err := strconv.ParseUint(parts[4], 16, 64)
	if err != nil {
		return Chunk{}, err
	}
	return Chunk{Endpoint: Endpoint{Model: model, Pod: pod, Rank: uint32(rank)}, Tier: t, Seq: h}, nil
}

// BenchmarkParseChunkKey: the strict ParseChunkKey (endpoint segments
// unescaped and validated) against strings.Split, url.PathUnescape and
// strconv (x-split).
func BenchmarkParseChunkKey(b *testing.B) {
	ks := Default()
	_, _, keys := benchKeys(ks)
	for _, k := range keys {
		got, err1 := ks.ParseChunkKey(k)
		ref, err2 := refParse(ks, k)
		if err1 != nil || err2 != nil || got != ref {
			b.Fatalf("%q: %+v %v, reference %+v %v", k, got, err1, ref, err2)
		}
	}
	var tm paired.Timer
	var sum uint64
	for b.Loop() {
		tm.Step(benchBatch, func() {
			for _, k := range keys {
				blk, _ := ks.ParseChunkKey(k)
				sum += blk.Seq
			}
		}, func() {
			for _, k := range keys {
				blk, _ := refParse(ks, k)
				sum += blk.Seq
			}
		})
	}
	if sum == 1 {
		b.Log("unlikely")
	}
	tm.Report(b, "key", "split")
}
