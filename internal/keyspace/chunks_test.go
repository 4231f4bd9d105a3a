package keyspace

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvindex/kvindex/internal/tier"
)

func TestChunkKeyRoundTrip(t *testing.T) {
	ks := Default()
	ep := Endpoint{Model: "meta-llama/Llama-3.1-8B-Instruct", Pod: "team-a/vllm 0@10.0.0.5:8000", Rank: 3}
	key := ks.ChunkKey(ep, tier.CPU, 0x2a)
	want := "/kvindex/v2/chunks/meta-llama%2FLlama-3.1-8B-Instruct/team-a%2Fvllm%200@10.0.0.5:8000/3/cpu/000000000000002a"
	if key != want {
		t.Fatalf("ChunkKey = %q, want %q", key, want)
	}
	if !strings.HasPrefix(key, ks.TierChunksPrefix(ep, tier.CPU)) || !strings.HasPrefix(key, ks.ModelChunksPrefix(ep.Model)) {
		t.Fatalf("%q is not under its tier's and model's prefixes", key)
	}
	got, err := ks.ParseChunkKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Chunk{Endpoint: ep, Tier: tier.CPU, Seq: 0x2a}, got); diff != "" {
		t.Fatalf("ParseChunkKey (-want +got):\n%s", diff)
	}
	prefix, tr, seq, err := ks.SplitChunkKey(key)
	if err != nil || prefix != ks.EndpointChunksPrefix(ep) || tr != tier.CPU || seq != 0x2a {
		t.Fatalf("SplitChunkKey = %q, %v, %d, %v", prefix, tr, seq, err)
	}
	if k := ks.KindOf(key); k != KindChunk {
		t.Fatalf("KindOf = %v, want chunks", k)
	}
}

func TestParseChunkKeyMalformed(t *testing.T) {
	ks := Default()
	for _, key := range []string{
		"/kvindex/v2/chunks/m/p/0/gpu/000000000000001",    // 15 digits
		"/kvindex/v2/chunks/m/p/0/gpu/00000000000000AB",   // upper case
		"/kvindex/v2/chunks/m/p/0/hbm/0000000000000001",   // unknown tier
		"/kvindex/v2/chunks/m/p/01/gpu/0000000000000001",  // leading zero
		"/kvindex/v2/chunks/m/0/gpu/0000000000000001",     // missing pod
		"/kvindex/v2/chunks/m/a/b/0/gpu/0000000000000001", // extra segment
		"/kvindex/v2/blocks/m/p/0/gpu/0000000000000001",   // another section
		"/kvindex/v1/chunks/m/p/0/gpu/0000000000000001",   // another prefix
	} {
		if _, err := ks.ParseChunkKey(key); !errors.Is(err, ErrMalformedKey) {
			t.Errorf("ParseChunkKey(%q) = %v, want ErrMalformedKey", key, err)
		}
	}
}

func TestChunkValue(t *testing.T) {
	entries := []ChunkEntry{{Key: 1, Engine: 0xfedcba9876543210}, {Key: 0xffffffffffffffff, Engine: 2}}
	for _, withEngine := range []bool{true, false} {
		v := AppendChunkValue(nil, entries, withEngine)
		if len(v) != ChunkValueLen(len(entries), withEngine) {
			t.Fatalf("value length %d, ChunkValueLen %d", len(v), ChunkValueLen(len(entries), withEngine))
		}
		c, err := ParseChunkValue(v)
		if err != nil {
			t.Fatal(err)
		}
		want := entries
		if !withEngine {
			want = []ChunkEntry{{Key: 1, Engine: 1}, {Key: 0xffffffffffffffff, Engine: 0xffffffffffffffff}}
		}
		if diff := cmp.Diff(want, c.AppendEntries(nil)); diff != "" {
			t.Errorf("withEngine %v (-want +got):\n%s", withEngine, diff)
		}
		if c.HasEngine() != withEngine || c.Len() != 2 || c.Key(1) != 0xffffffffffffffff {
			t.Errorf("withEngine %v: view %+v", withEngine, c)
		}
	}
	if got := AppendChunkValue(nil, entries[:1], true); string(got) != "\x10\x00\x00\x00\x00\x00\x00\x00\x01\xfe\xdc\xba\x98\x76\x54\x32\x10" {
		t.Fatalf("value bytes %x", got)
	}
}

func TestParseChunkValueMalformed(t *testing.T) {
	big := AppendChunkValue(nil, make([]ChunkEntry, MaxChunkEntries+1), false)
	for name, v := range map[string][]byte{
		"empty":         nil,
		"no entries":    {8},
		"bad width":     append([]byte{7}, make([]byte, 7)...),
		"partial":       append([]byte{16}, make([]byte, 17)...),
		"too many":      big,
		"width only 16": {16},
	} {
		if _, err := ParseChunkValue(v); !errors.Is(err, ErrMalformedValue) {
			t.Errorf("%s: ParseChunkValue = %v, want ErrMalformedValue", name, err)
		}
	}
}
