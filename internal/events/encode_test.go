package events

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvindex/kvindex/internal/tier"
)

// roundTripBatch has every event type, hashes with and without the top
// bit set (the signed form is negative for those), a parent, tokens, an
// offload placeholder (no tokens, block size 0), stores and removals of
// other KV-cache groups, a store with its own kv_cache_spec_kind, tier
// clears with and without a medium, and every field Encode writes.
var roundTripBatch = Batch{
	TS:      1733000000.25,
	Rank:    2,
	HasRank: true,
	Events: []Event{
		{Type: BlockStored, BlockHashes: []uint64{1, 1 << 63, 0xfedcba9876543210}, ParentHash: 0x8000000000000007, HasParent: true, TokenIDs: []int64{5, 6, 7, 8, 9, 10}, BlockSize: 2, Medium: "GPU", Tier: tier.GPU, LoraName: "adapter"},
		{Type: BlockStored, Index: 1, BlockHashes: []uint64{3}, Medium: "CPU", Tier: tier.CPU},
		{Type: BlockRemoved, Index: 2, BlockHashes: []uint64{1, 1 << 63}, Medium: "Disk", Tier: tier.Disk},
		{Type: AllBlocksCleared, Index: 3},
		{Type: BlockStored, Index: 4, BlockHashes: []uint64{}, Tier: tier.GPU},
		{Type: BlockStored, Index: 5, BlockHashes: []uint64{4}, Medium: "GPU", Tier: tier.GPU, GroupIdx: 3, KVCacheSpecKind: "mla_attention"},
		{Type: BlockRemoved, Index: 6, BlockHashes: []uint64{4}, Medium: "cpu_tier2", Tier: tier.Disk, GroupIdx: 2},
		{Type: TierBlocksCleared, Index: 7, Tier: tier.GPU},
		{Type: TierBlocksCleared, Index: 8, Medium: "CPU_PINNED", Tier: tier.CPU},
		{Type: BlockStored, Index: 9, BlockHashes: []uint64{4, 5}, TokenIDs: []int64{1, 2}, BlockSize: 1, Tier: tier.GPU,
			HasExtraKeys: true, ExtraKeysLen: 2, ExtraKeys: [][]Extra{{{Kind: ExtraString, Data: []byte("l")}, {Kind: ExtraBytes, Data: []byte{1}}, {Kind: ExtraInt, Data: le(-2)}}, nil}},
		{Type: BlockStored, Index: 10, BlockHashes: []uint64{6}, TokenIDs: []int64{1}, BlockSize: 1, Tier: tier.GPU, HasExtraKeys: true, ExtraKeysLen: 1},
	},
}

// withKind returns b with kind set on every BlockStored that has none: what
// EncodeOptions.KVCacheSpecKind writes and the decoder reads back.
func withKind(b Batch, kind string) Batch {
	if kind == "" {
		return b
	}
	b.Events = append([]Event(nil), b.Events...)
	for i := range b.Events {
		if b.Events[i].Type == BlockStored && b.Events[i].KVCacheSpecKind == "" {
			b.Events[i].KVCacheSpecKind = kind
		}
	}
	return b
}

// TestEncodeRoundTrip encodes a batch with every combination of options
// and decodes it back with the Decoder: every option must be read back as
// the same batch.
func TestEncodeRoundTrip(t *testing.T) {
	for _, enc := range []struct {
		name string
		e    Encoding
	}{{"map", EncodingMap}, {"array", EncodingArray}} {
		for _, hf := range []struct {
			name string
			h    HashForm
		}{{"uint64", HashUint64}, {"int64", HashInt64}, {"digest", HashDigest}} {
			for _, kind := range []string{"", "full_attention"} {
				for _, batchMap := range []bool{false, true} {
					opts := EncodeOptions{Encoding: enc.e, Hashes: hf.h, KVCacheSpecKind: kind, BatchMap: batchMap}
					name := fmt.Sprintf("%s_%s_hashes", enc.name, hf.name)
					if kind != "" {
						name += "_with_spec_kind"
					}
					if batchMap {
						name += "_map_batch"
					}
					t.Run(name, func(t *testing.T) {
						for _, b := range []Batch{roundTripBatch, {TS: 1.5}, {TS: 2, Events: []Event{{Type: AllBlocksCleared}}}} {
							payload, err := EncodeWith(b, opts)
							if err != nil {
								t.Fatal(err)
							}
							got, err := NewDecoder(nil).Decode(payload)
							if err != nil {
								t.Fatal(err)
							}
							want := withKind(b, kind)
							if want.Events == nil {
								want.Events = []Event{}
							}
							if diff := cmp.Diff(want, got); diff != "" {
								t.Fatalf("round trip (-want +got):\n%s", diff)
							}
						}
					})
				}
			}
		}
	}
}

// TestEncodeDefaults checks that Encode is EncodeWith with only the
// encoding set.
func TestEncodeDefaults(t *testing.T) {
	for _, enc := range []Encoding{EncodingMap, EncodingArray} {
		a, err := Encode(roundTripBatch, enc)
		if err != nil {
			t.Fatal(err)
		}
		b, err := EncodeWith(roundTripBatch, EncodeOptions{Encoding: enc})
		if err != nil {
			t.Fatal(err)
		}
		if string(a) != string(b) {
			t.Errorf("encoding %d: Encode and EncodeWith differ", enc)
		}
	}
}

// TestEncodeWireForms reads the encoded batch back with a generic msgpack
// decoder and checks each option shows on the wire as the engines it
// stands for write it: otherwise an option that did nothing would still
// round-trip.
func TestEncodeWireForms(t *testing.T) {
	stored := roundTripBatch.Events[0]
	first, top := stored.BlockHashes[0], stored.BlockHashes[1]
	for _, tc := range []struct {
		name string
		opts EncodeOptions
		// check gets the first event's block_hashes and
		// parent_block_hash, and whether kv_cache_spec_kind was present
		// with its value.
		check func(t *testing.T, hashes []any, parent any, kind any, hasKind bool)
	}{
		{"uint64_hashes", EncodeOptions{}, func(t *testing.T, hashes []any, parent any, kind any, hasKind bool) {
			// A small hash is a positive fixint in every integer form;
			// the top-bit hash is an unsigned 64-bit integer.
			want := []any{int8(first), top}
			if diff := cmp.Diff(want, hashes[:2]); diff != "" {
				t.Errorf("hashes (-want +got):\n%s", diff)
			}
			if hasKind {
				t.Errorf("kv_cache_spec_kind written (%v) without the option", kind)
			}
		}},
		{"int64_hashes", EncodeOptions{Hashes: HashInt64}, func(t *testing.T, hashes []any, parent any, _ any, _ bool) {
			// msgpack writes a non-negative int compactly, as Python's
			// msgpack does for SGLang's hashes; the top-bit hash and the
			// parent are negative.
			want := []any{int8(1), int64(-1 << 63)}
			if diff := cmp.Diff(want, hashes[:2]); diff != "" {
				t.Errorf("hashes (-want +got):\n%s", diff)
			}
			if p, ok := parent.(int64); !ok || uint64(p) != stored.ParentHash {
				t.Errorf("parent = %T %v, want int64 %d", parent, parent, int64(stored.ParentHash))
			}
		}},
		{"digest_hashes", EncodeOptions{Hashes: HashDigest}, func(t *testing.T, hashes []any, parent any, _ any, _ bool) {
			for i, h := range append(hashes[:2:2], parent) {
				d, ok := h.([]byte)
				want := append(stored.BlockHashes[:2:2], stored.ParentHash)[i]
				if !ok || len(d) != DigestLen || binary.BigEndian.Uint64(d[DigestLen-8:]) != want {
					t.Errorf("hash %d = %T %x, want a %d-byte digest ending in %016x", i, h, h, DigestLen, want)
				}
			}
		}},
		{"spec_kind", EncodeOptions{KVCacheSpecKind: "full_attention"}, func(t *testing.T, _ []any, _ any, kind any, hasKind bool) {
			if !hasKind || kind != "full_attention" {
				t.Errorf("kv_cache_spec_kind = %v (present %v), want full_attention", kind, hasKind)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, enc := range []Encoding{EncodingMap, EncodingArray} {
				opts := tc.opts
				opts.Encoding = enc
				payload, err := EncodeWith(roundTripBatch, opts)
				if err != nil {
					t.Fatal(err)
				}
				var raw []any
				if err := msgpack.Unmarshal(payload, &raw); err != nil {
					t.Fatal(err)
				}
				ev := raw[1].([]any)[0]
				var hashes []any
				var parent, kind any
				var hasKind bool
				switch enc {
				case EncodingMap:
					m := ev.(map[string]any)
					hashes, parent = m["block_hashes"].([]any), m["parent_block_hash"]
					kind, hasKind = m["kv_cache_spec_kind"]
				case EncodingArray:
					a := ev.([]any)
					hashes, parent = a[1].([]any), a[2]
					if hasKind = len(a) > 10; hasKind {
						kind = a[10]
					}
				}
				tc.check(t, hashes, parent, kind, hasKind)
			}
		})
	}
}

func TestEncodeErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    Batch
		opts EncodeOptions
	}{
		{"unknown_event_type", Batch{Events: []Event{{Type: 9}}}, EncodeOptions{}},
		{"unknown_encoding", Batch{}, EncodeOptions{Encoding: 7}},
		{"unknown_hash_form", Batch{}, EncodeOptions{Hashes: 7}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := EncodeWith(tc.b, tc.opts); err == nil {
				t.Fatal("EncodeWith succeeded")
			}
		})
	}
}

// le is the canonical bytes of an int extra key.
func le(v int64) []byte { return binary.LittleEndian.AppendUint64(nil, uint64(v)) }
