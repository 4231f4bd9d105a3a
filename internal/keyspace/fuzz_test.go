package keyspace

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kvindex/kvindex/internal/tier"
)

// FuzzEndpointNames checks that any storable model and pod round-trips
// through every key that carries them, and that no name can escape its
// segment.
func FuzzEndpointNames(f *testing.F) {
	f.Add("meta-llama/Llama-3.1-8B-Instruct", "team-a/vllm 0@10.0.0.5:8000", uint32(0), uint64(0x7b05ab3397532bcc), uint8(1))
	f.Add("m", "%2F", uint32(3), uint64(0), uint8(2))
	f.Add("模型", "pod/../x", uint32(1<<31), uint64(1<<63), uint8(3))
	ks := Default()
	f.Fuzz(func(t *testing.T, model, pod string, rank uint32, hash uint64, tb uint8) {
		ep := Endpoint{Model: model, Pod: pod, Rank: rank}
		if ep.Validate() != nil {
			return
		}
		tr := tier.All[int(tb)%tier.Count]
		key := ks.ChunkKey(ep, tr, hash)
		if !utf8.ValidString(key) {
			t.Fatalf("block key %q is not UTF-8", key)
		}
		if n := strings.Count(key[len(ks.ChunksPrefix()):], "/"); n != 4 {
			t.Fatalf("block key %q has %d separators after the section, want 4", key, n)
		}
		got, err := ks.ParseChunkKey(key)
		if err != nil {
			t.Fatalf("ParseChunkKey(%q): %v", key, err)
		}
		if got != (Chunk{Endpoint: ep, Tier: tr, Seq: hash}) {
			t.Fatalf("ParseChunkKey(%q) = %+v", key, got)
		}
		if gotEp, err := ks.ParseEndpointKey(ks.EndpointKey(ep)); err != nil || gotEp != ep {
			t.Fatalf("ParseEndpointKey = %+v, %v", gotEp, err)
		}
	})
}

// FuzzParseKey feeds arbitrary keys to every parser: none may panic, and
// whatever parses must encode back to exactly the same key.
func FuzzParseKey(f *testing.F) {
	ks := Default()
	f.Add(ks.ChunkKey(Endpoint{Model: "m", Pod: "a b"}, tier.CPU, 42))
	f.Add(ks.EndpointKey(Endpoint{Model: "m/x", Pod: "p", Rank: 2}))
	f.Add(ks.OffsetKey(Partition{Topic: "t", Partition: 1}))
	f.Add(ks.OwnerKey(Partition{Topic: "t", Partition: 1}))
	f.Add(ks.IngesterKey("i"))
	f.Add("/kvindex/v2/chunks/%6D/p/0/gpu/0000000000000001")
	f.Fuzz(func(t *testing.T, key string) {
		if b, err := ks.ParseChunkKey(key); err == nil {
			if again := ks.ChunkKey(b.Endpoint, b.Tier, b.Seq); again != key {
				t.Fatalf("block key %q parsed to %+v which encodes to %q", key, b, again)
			}
		}
		if ep, err := ks.ParseEndpointKey(key); err == nil {
			if again := ks.EndpointKey(ep); again != key {
				t.Fatalf("endpoint key %q encodes back to %q", key, again)
			}
		}
		if p, err := ks.ParseOffsetKey(key); err == nil {
			if again := ks.OffsetKey(p); again != key {
				t.Fatalf("offset key %q encodes back to %q", key, again)
			}
		}
		if p, err := ks.ParseOwnerKey(key); err == nil {
			if again := ks.OwnerKey(p); again != key {
				t.Fatalf("owner key %q encodes back to %q", key, again)
			}
		}
		if id, err := ks.ParseIngesterKey(key); err == nil {
			if again := ks.IngesterKey(id); again != key {
				t.Fatalf("ingester key %q encodes back to %q", key, again)
			}
		}
	})
}
