package events

import (
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvindex/kvindex/internal/scenario"
	"github.com/kvindex/kvindex/internal/tier"
)

func loadFixtures(t testing.TB) []*scenario.Scenario {
	t.Helper()
	all, err := scenario.Glob(filepath.Join("..", "..", "testdata", "fixtures", "scenarios", "*.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	return all
}

// summary renders a decoded batch in the form of the fixtures' describe
// field, e.g. "dp_rank=0: BlockStored ['e5068d13bba8906f', ...] parent=None
// medium=GPU", so every fixture payload is checked against what its author
// said it holds.
func summary(b Batch) string {
	var parts []string
	for _, ev := range b.Events {
		var s strings.Builder
		s.WriteString(ev.Type.String())
		if ev.Type != AllBlocksCleared {
			s.WriteString(" [")
			for i, h := range ev.BlockHashes {
				if i > 0 {
					s.WriteString(", ")
				}
				s.WriteString("'" + hex16(h) + "'")
			}
			s.WriteString("]")
		}
		if ev.Type == BlockStored {
			if ev.HasParent {
				s.WriteString(" parent=" + hex16(ev.ParentHash))
			} else {
				s.WriteString(" parent=None")
			}
		}
		if ev.Type != AllBlocksCleared {
			m := ev.Medium
			if m == "" {
				m = "None"
			}
			s.WriteString(" medium=" + m)
		}
		parts = append(parts, s.String())
	}
	return "dp_rank=" + itoa(b.Rank) + ": " + strings.Join(parts, "; ")
}

func hex16(h uint64) string {
	const digits = "0123456789abcdef"
	var b [16]byte
	for i := 15; i >= 0; i-- {
		b[i] = digits[h&0xf]
		h >>= 4
	}
	return string(b[:])
}

func itoa(n uint32) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for n > 0 {
		b = append([]byte{byte('0' + n%10)}, b...)
		n /= 10
	}
	return string(b)
}

// TestFixturePayloads decodes every publish payload of every scenario. A
// payload whose describe has the "dp_rank=N: ..." form must decode to
// exactly that; the others are checked by name below.
func TestFixturePayloads(t *testing.T) {
	dec := NewDecoder(nil)
	checked := 0
	for _, s := range loadFixtures(t) {
		for _, st := range s.Steps {
			if st.Kind != scenario.KindPublish {
				continue
			}
			p := st.Publish
			name := s.Name + "/line_" + itoa(uint32(st.Line))
			t.Run(name, func(t *testing.T) {
				if len(p.Value) == 0 {
					if p.Headers["kind"] == "" {
						t.Fatalf("empty value without a kind header")
					}
					return
				}
				b, err := dec.Decode(p.Value)
				if strings.HasPrefix(p.Describe, "dp_rank=") {
					if err != nil {
						t.Fatalf("Decode: %v", err)
					}
					// Large fixtures abbreviate the hash list as "N hashes".
					if want := p.Describe; strings.Contains(want, " hashes") {
						ev := b.Events[0]
						got := "dp_rank=" + itoa(b.Rank) + ": " + ev.Type.String() + " " + itoa(uint32(len(ev.BlockHashes))) + " hashes"
						if !strings.HasPrefix(want, got) {
							t.Fatalf("decoded %q, describe says %q", got, want)
						}
					} else if got := summary(b); got != want {
						t.Fatalf("decoded:\n %s\ndescribe says:\n %s", got, want)
					}
					if len(b.Skipped) != 0 {
						t.Fatalf("unexpected skips: %v", b.Skipped)
					}
					checked++
				}
			})
		}
	}
	if checked < 30 {
		t.Fatalf("checked only %d described payloads", checked)
	}
}

// TestFixtureSpecialPayloads covers the fixture payloads whose describe is
// prose: legacy arrays, byte digests, broken records, sequence records.
func TestFixtureSpecialPayloads(t *testing.T) {
	byDescribe := map[string][]byte{}
	for _, s := range loadFixtures(t) {
		for _, st := range s.Steps {
			if st.Kind == scenario.KindPublish {
				byDescribe[s.Name+": "+st.Publish.Describe] = st.Publish.Value
			}
		}
	}
	get := func(t *testing.T, key string) []byte {
		t.Helper()
		v, ok := byDescribe[key]
		if !ok {
			t.Fatalf("no fixture payload %q", key)
		}
		return v
	}
	dec := NewDecoder(nil)

	t.Run("legacy_12_field_array", func(t *testing.T) {
		b, err := dec.Decode(get(t, "p02_legacy_arrays_and_byte_hashes: 12-field legacy array (extra_keys, group_idx, spec kind, window)"))
		if err != nil {
			t.Fatal(err)
		}
		want := []Event{{Type: BlockStored, BlockHashes: []uint64{0x7820e1ecadb658f7, 0x0baaafa441b0d29b}, BlockSize: 16, Medium: "GPU", Tier: tier.GPU, KVCacheSpecKind: KindFullAttention, HasExtraKeys: true, ExtraKeysLen: 2}}
		if diff := cmp.Diff(want, b.Events, cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".TokenIDs" }, cmp.Ignore())); diff != "" {
			t.Fatalf("events (-want +got):\n%s", diff)
		}
		if len(b.Events[0].TokenIDs) != 32 {
			t.Fatalf("token ids: %d, want 32", len(b.Events[0].TokenIDs))
		}
	})
	t.Run("legacy_remove_by_integer", func(t *testing.T) {
		b, err := dec.Decode(get(t, "p02_legacy_arrays_and_byte_hashes: remove the third block by its integer form"))
		if err != nil {
			t.Fatal(err)
		}
		want := []Event{{Type: BlockRemoved, BlockHashes: []uint64{0x9343e9a751d59191}, Medium: "GPU", Tier: tier.GPU}}
		if diff := cmp.Diff(want, b.Events); diff != "" {
			t.Fatalf("events (-want +got):\n%s", diff)
		}
	})
	t.Run("garbage_bytes", func(t *testing.T) {
		_, err := dec.Decode(get(t, "p08_bad_records_skipped: garbage bytes"))
		if !errors.Is(err, ErrMalformedBatch) {
			t.Fatalf("error = %v, want ErrMalformedBatch", err)
		}
	})
	t.Run("truncated_batch", func(t *testing.T) {
		_, err := dec.Decode(get(t, "p08_bad_records_skipped: truncated batch"))
		if !errors.Is(err, ErrMalformedBatch) || !strings.Contains(err.Error(), "event 0") {
			t.Fatalf("error = %v, want ErrMalformedBatch naming event 0", err)
		}
	})
	t.Run("unknown_type_then_valid_store", func(t *testing.T) {
		b, err := dec.Decode(get(t, "p08_bad_records_skipped: unknown event type, then a valid store"))
		if err != nil {
			t.Fatal(err)
		}
		if len(b.Skipped) != 1 || b.Skipped[0].Reason != SkipUnknownType || b.Skipped[0].Tag != "BlockMoved" || b.Skipped[0].Index != 0 {
			t.Fatalf("skipped = %+v, want one unknown_type BlockMoved at 0", b.Skipped)
		}
		if len(b.Events) != 1 || b.Events[0].Type != BlockStored || b.Events[0].Index != 1 {
			t.Fatalf("events = %+v, want the store at index 1", b.Events)
		}
	})
	t.Run("sequence_records", func(t *testing.T) {
		b, err := dec.Decode(get(t, "p12_sequence_restart_and_duplicates: seq 0, newer ts: engine restarted"))
		if err != nil {
			t.Fatal(err)
		}
		old, err := dec.Decode(get(t, "p12_sequence_restart_and_duplicates: seq 0: store h0,h1"))
		if err != nil {
			t.Fatal(err)
		}
		if !(b.TS > old.TS) {
			t.Fatalf("restart ts %v is not newer than %v", b.TS, old.TS)
		}
	})
}

func encode(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func digest(last uint64) []byte {
	b := make([]byte, 32)
	for i := range 24 {
		b[i] = 0xaa
	}
	for i := 0; i < 8; i++ {
		b[31-i] = byte(last >> (8 * i))
	}
	return b
}

func TestDecodeShapes(t *testing.T) {
	stored := func(extra map[string]any) map[string]any {
		m := map[string]any{"type": "BlockStored", "block_hashes": []any{uint64(1), uint64(2)}, "parent_block_hash": nil, "token_ids": []int{1, 2}, "block_size": 1, "medium": "GPU"}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	tests := []struct {
		name    string
		batch   any
		events  []Event
		skipped []SkipReason
		rank    uint32
		hasRank bool
		ts      float64
	}{
		{
			name:   "map_event_float64_ts_nil_rank",
			batch:  []any{1.5, []any{stored(nil)}, nil},
			events: []Event{{Type: BlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: []int64{1, 2}, BlockSize: 1, Medium: "GPU", Tier: tier.GPU}},
			ts:     1.5,
		},
		{
			name:    "float32_ts_int_rank",
			batch:   []any{float32(2.5), []any{[]any{"AllBlocksCleared"}}, 3},
			events:  []Event{{Type: AllBlocksCleared}},
			ts:      2.5,
			rank:    3,
			hasRank: true,
		},
		{
			name:   "two_element_batch",
			batch:  []any{7, []any{}},
			events: []Event{},
			ts:     7,
		},
		{
			name:   "signed_and_byte_hashes",
			batch:  []any{1.0, []any{[]any{"BlockRemoved", []any{int64(-1), digest(0x0102030405060708)}, "CPU_TIER2"}}},
			events: []Event{{Type: BlockRemoved, BlockHashes: []uint64{0xffffffffffffffff, 0x0102030405060708}, Medium: "CPU_TIER2", Tier: tier.Disk}},
			ts:     1,
		},
		{
			name:   "parent_as_bytes_unknown_fields_ignored",
			batch:  []any{1.0, []any{stored(map[string]any{"parent_block_hash": digest(9), "future_field": map[string]any{"x": []any{1, 2}}})}},
			events: []Event{{Type: BlockStored, BlockHashes: []uint64{1, 2}, ParentHash: 9, HasParent: true, TokenIDs: []int64{1, 2}, BlockSize: 1, Medium: "GPU", Tier: tier.GPU}},
			ts:     1,
		},
		{
			name:   "missing_trailing_fields_are_nil",
			batch:  []any{1.0, []any{[]any{"BlockStored", []any{5}}, []any{"BlockRemoved", []any{5}}}},
			events: []Event{{Type: BlockStored, BlockHashes: []uint64{5}, Tier: tier.GPU}, {Type: BlockRemoved, Index: 1, BlockHashes: []uint64{5}, Tier: tier.GPU}},
			ts:     1,
		},
		{
			name:    "skips_are_per_event",
			batch:   []any{1.0, []any{stored(map[string]any{"medium": "HBM"}), stored(map[string]any{"group_idx": -1}), stored(map[string]any{"block_hashes": "nope"}), []any{"BlockMoved", 1}, "not an event", stored(map[string]any{"block_size": -1}), map[string]any{"block_hashes": []any{1}}, stored(nil), map[string]any{"type": "TierBlocksCleared", "medium": "HBM"}, []any{"TierBlocksCleared", 7}}},
			events:  []Event{{Type: BlockStored, Index: 7, BlockHashes: []uint64{1, 2}, TokenIDs: []int64{1, 2}, BlockSize: 1, Medium: "GPU", Tier: tier.GPU}},
			skipped: []SkipReason{SkipUnknownMedium, SkipInvalid, SkipInvalid, SkipUnknownType, SkipInvalid, SkipInvalid, SkipInvalid, SkipUnknownMedium, SkipInvalid},
			ts:      1,
		},
		{
			name:    "short_byte_hash_is_invalid",
			batch:   []any{1.0, []any{[]any{"BlockRemoved", []any{[]byte{1, 2, 3}}, nil}}},
			events:  []Event{},
			skipped: []SkipReason{SkipInvalid},
			ts:      1,
		},
		{
			name:   "extra_batch_elements_ignored",
			batch:  []any{1.0, []any{}, 0, "future", []any{1}},
			events: []Event{},
			ts:     1, hasRank: true,
		},
	}
	dec := NewDecoder(nil)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := dec.Decode(encode(t, tc.batch))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if diff := cmp.Diff(tc.events, b.Events); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
			var reasons []SkipReason
			for _, s := range b.Skipped {
				reasons = append(reasons, s.Reason)
				if s.Detail == "" {
					t.Errorf("skip %+v has no detail", s)
				}
			}
			if diff := cmp.Diff(tc.skipped, reasons); diff != "" {
				t.Errorf("skip reasons (-want +got):\n%s\n%v", diff, b.Skipped)
			}
			if b.TS != tc.ts || b.Rank != tc.rank || b.HasRank != tc.hasRank {
				t.Errorf("ts, rank, hasRank = %v, %v, %v; want %v, %v, %v", b.TS, b.Rank, b.HasRank, tc.ts, tc.rank, tc.hasRank)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name    string
		payload []byte
		want    string
	}{
		{name: "empty", payload: nil, want: "empty payload"},
		{name: "not_array_or_map", payload: encode(t, "batch"), want: "batch is string"},
		{name: "map_without_ts", payload: encode(t, map[string]any{"events": []any{}, "a": 1}), want: `batch map has no "ts"`},
		{name: "map_without_events", payload: encode(t, map[string]any{"ts": 1.0}), want: `batch map has no "events"`},
		{name: "map_ts_nan", payload: encode(t, map[string]any{"ts": math.NaN(), "events": []any{}}), want: "want a finite number"},
		{name: "map_rank_string", payload: encode(t, map[string]any{"ts": 1.0, "events": []any{}, "data_parallel_rank": "1"}), want: "data_parallel_rank is string"},
		{name: "map_repeated_key", payload: []byte{0x83, 0xa2, 't', 's', 0x01, 0xa6, 'e', 'v', 'e', 'n', 't', 's', 0x90, 0xa2, 't', 's', 0x02}, want: `batch map repeats "ts"`},
		{name: "huge_batch_map_header", payload: []byte{0xdf, 0xff, 0xff, 0xff, 0xff}, want: "claims 4294967295 entries"},
		{name: "one_element", payload: encode(t, []any{1.0}), want: "at least 2"},
		{name: "ts_string", payload: encode(t, []any{"x", []any{}}), want: "ts is string"},
		{name: "events_not_array", payload: encode(t, []any{1.0, 5}), want: "events is int"},
		{name: "negative_rank", payload: encode(t, []any{1.0, []any{}, -1}), want: "data_parallel_rank -1"},
		{name: "rank_string", payload: encode(t, []any{1.0, []any{}, "0"}), want: "data_parallel_rank is string"},
		{name: "infinite_ts", payload: encode(t, []any{math.Inf(1), []any{}}), want: "want a finite number"},
		{name: "nan_ts", payload: encode(t, []any{math.NaN(), []any{}}), want: "want a finite number"},
		{name: "trailing_bytes", payload: append(encode(t, []any{1.0, []any{}}), 0x01), want: "1 trailing bytes"},
		{name: "huge_array_header", payload: []byte{0xdd, 0xff, 0xff, 0xff, 0xff}, want: "claims 4294967295 elements"},
		{name: "huge_events_header", payload: append([]byte{0x92, 0x01}, 0xdd, 0xff, 0xff, 0xff, 0xff), want: "claims 4294967295 elements"},
		{name: "huge_bin_hash", payload: append(encode(t, []any{1.0})[:0], 0x92, 0x01, 0x91, 0x92, 0xac, 'B', 'l', 'o', 'c', 'k', 'R', 'e', 'm', 'o', 'v', 'e', 'd', 0x91, 0xc6, 0xff, 0xff, 0xff, 0xff), want: "claims 4294967295 bytes"},
		{name: "huge_map_header", payload: []byte{0x92, 0x01, 0x91, 0xdf, 0xff, 0xff, 0xff, 0xff}, want: "claims 4294967295 entries"},
		{name: "deep_nesting", payload: append(append([]byte{0x92, 0x01, 0x91, 0x82, 0xa4, 't', 'y', 'p', 'e', 0xa1, 'x', 0xa1, 'z'}, repeat(0x91, 100)...), 0x01), want: "nests deeper"},
	}
	dec := NewDecoder(nil)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := dec.Decode(tc.payload)
			if !errors.Is(err, ErrMalformedBatch) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want ErrMalformedBatch containing %q", err, tc.want)
			}
		})
	}
}

func repeat(b byte, n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = b
	}
	return out
}

func TestCustomMediums(t *testing.T) {
	m := DefaultMediums()
	m["HBM"] = tier.GPU
	delete(m, "DISK")
	dec := NewDecoder(m)
	b, err := dec.Decode(encode(t, []any{1.0, []any{[]any{"BlockRemoved", []any{1}, "HBM"}, []any{"BlockRemoved", []any{1}, "Disk"}}}))
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Events) != 1 || b.Events[0].Tier != tier.GPU || len(b.Skipped) != 1 || b.Skipped[0].Reason != SkipUnknownMedium {
		t.Fatalf("events %+v skipped %+v", b.Events, b.Skipped)
	}
}

// TestTokenIDs covers the raw integer fast path of token_ids: every integer
// width and sign, the hand-over to the slow path at a non-integer or an
// out-of-range element, and truncation.
func TestTokenIDs(t *testing.T) {
	ev := func(tokens any) []byte {
		return encode(t, []any{1.0, []any{map[string]any{"type": "BlockStored", "block_hashes": []any{1}, "token_ids": tokens}}})
	}
	tests := []struct {
		name    string
		payload []byte
		want    []int64
		skip    bool
	}{
		{name: "every_width", payload: ev([]any{int8(-5), 7, uint8(200), uint16(60000), uint32(4294967295), uint64(1 << 40), int16(-300), int32(-70000), int64(-1 << 40)}), want: []int64{-5, 7, 200, 60000, 4294967295, 1 << 40, -300, -70000, -1 << 40}},
		{name: "non_integer_element", payload: ev([]any{1, "x", 3}), skip: true},
		{name: "out_of_range_element", payload: ev([]any{1, uint64(1 << 63)}), skip: true},
		{name: "nil", payload: ev(nil)},
	}
	dec := NewDecoder(nil)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := dec.Decode(tc.payload)
			if err != nil {
				t.Fatal(err)
			}
			if tc.skip {
				if len(b.Skipped) != 1 || b.Skipped[0].Reason != SkipInvalid || !strings.Contains(b.Skipped[0].Detail, "token_ids") {
					t.Fatalf("skipped = %+v, want one invalid token_ids", b.Skipped)
				}
				return
			}
			if len(b.Events) != 1 {
				t.Fatalf("events %+v skipped %+v", b.Events, b.Skipped)
			}
			if diff := cmp.Diff(tc.want, b.Events[0].TokenIDs); diff != "" {
				t.Fatalf("token ids (-want +got):\n%s", diff)
			}
		})
	}
	// A uint32 whose last bytes are missing, inside the token list.
	truncated := append(encode(t, []any{1.0})[:0], 0x92, 0x01, 0x91, 0x81, 0xa9, 't', 'o', 'k', 'e', 'n', '_', 'i', 'd', 's', 0x92, 0x01, 0xce, 0x00)
	if _, err := dec.Decode(truncated); !errors.Is(err, ErrMalformedBatch) || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("truncated token: %v", err)
	}
}

// TestTwoTypeFields: a map event naming its type twice is invalid, whatever
// the two say (it once applied as the first one).
func TestTwoTypeFields(t *testing.T) {
	payload := []byte{0x93, 0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0, 0x91, 0x82}
	payload = append(payload, 0xa4, 't', 'y', 'p', 'e', 0xb0)
	payload = append(payload, "AllBlocksCleared"...)
	payload = append(payload, 0xa4, 't', 'y', 'p', 'e', 0xa5, 'B', 'o', 'g', 'u', 's', 0xc0)
	b, err := NewDecoder(nil).Decode(payload)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Events) != 0 || len(b.Skipped) != 1 || b.Skipped[0].Reason != SkipInvalid || !strings.Contains(b.Skipped[0].Detail, "more than one") {
		t.Fatalf("events %+v, skipped %+v; want one invalid event", b.Events, b.Skipped)
	}
}

// TestDecodeV11Shapes covers what DESIGN v1.1 added to the wire format:
// batches as maps (rank present, omitted or nil, keys in any order,
// unknown keys of any type ignored), TierBlocksCleared in both encodings,
// and stores and removals of every KV-cache group with their spec kinds.
func TestDecodeV11Shapes(t *testing.T) {
	store := func(h uint64, group any, kind any) map[string]any {
		return map[string]any{"type": "BlockStored", "block_hashes": []any{h}, "parent_block_hash": nil, "token_ids": []int{1}, "block_size": 1, "medium": "GPU", "group_idx": group, "kv_cache_spec_kind": kind}
	}
	stored := func(idx int, h uint64, group int64, kind string) Event {
		return Event{Type: BlockStored, Index: idx, BlockHashes: []uint64{h}, TokenIDs: []int64{1}, BlockSize: 1, Medium: "GPU", Tier: tier.GPU, GroupIdx: group, KVCacheSpecKind: kind}
	}
	// rawMap writes a map with its keys in the given order (msgpack.Marshal
	// of a Go map would pick its own).
	rawMap := func(t *testing.T, kv ...any) []byte {
		t.Helper()
		out := []byte{0x80 | byte(len(kv)/2)}
		for _, x := range kv {
			out = append(out, encode(t, x)...)
		}
		return out
	}
	tests := []struct {
		name    string
		payload func(t *testing.T) []byte
		events  []Event
		skipped []SkipReason
		ts      float64
		rank    uint32
		hasRank bool
	}{
		{
			name: "map_batch_with_rank",
			payload: func(t *testing.T) []byte {
				return rawMap(t, "ts", 1.5, "events", []any{store(1, 0, "full_attention")}, "data_parallel_rank", 2)
			},
			events: []Event{stored(0, 1, 0, "full_attention")},
			ts:     1.5, rank: 2, hasRank: true,
		},
		{
			name:    "map_batch_rank_omitted",
			payload: func(t *testing.T) []byte { return rawMap(t, "ts", 2.5, "events", []any{store(1, nil, nil)}) },
			events:  []Event{stored(0, 1, 0, "")},
			ts:      2.5,
		},
		{
			name:    "map_batch_rank_nil",
			payload: func(t *testing.T) []byte { return rawMap(t, "ts", 3.0, "events", []any{}, "data_parallel_rank", nil) },
			events:  []Event{},
			ts:      3,
		},
		{
			name: "map_batch_keys_reversed",
			payload: func(t *testing.T) []byte {
				return rawMap(t, "data_parallel_rank", 7, "events", []any{[]any{"AllBlocksCleared"}}, "ts", float32(4.5))
			},
			events: []Event{{Type: AllBlocksCleared}},
			ts:     4.5, rank: 7, hasRank: true,
		},
		{
			name: "map_batch_unknown_keys_ignored",
			payload: func(t *testing.T) []byte {
				return rawMap(t, "schema", "v2", "ts", 5.0, 17, []any{1, 2}, "events", []any{store(9, 0, nil)}, "extra", map[string]any{"a": []any{nil}}, "data_parallel_rank", 0)
			},
			events: []Event{stored(0, 9, 0, "")},
			ts:     5, hasRank: true,
		},
		{
			name: "tier_clears_both_encodings",
			payload: func(t *testing.T) []byte {
				return encode(t, []any{6.0, []any{
					map[string]any{"type": "TierBlocksCleared", "medium": "GPU"},
					[]any{"TierBlocksCleared", "cpu_tier2"},
					map[string]any{"type": "TierBlocksCleared", "medium": nil, "ownership": "kvcr"},
					[]any{"TierBlocksCleared"},
					[]any{"TierBlocksCleared", "CPU", "future"},
					map[string]any{"type": "TierBlocksCleared", "medium": "HBM"},
				}})
			},
			events: []Event{
				{Type: TierBlocksCleared, Medium: "GPU", Tier: tier.GPU},
				{Type: TierBlocksCleared, Index: 1, Medium: "cpu_tier2", Tier: tier.Disk},
				{Type: TierBlocksCleared, Index: 2, Tier: tier.GPU},
				{Type: TierBlocksCleared, Index: 3, Tier: tier.GPU},
				{Type: TierBlocksCleared, Index: 4, Medium: "CPU", Tier: tier.CPU},
			},
			skipped: []SkipReason{SkipUnknownMedium},
			ts:      6,
		},
		{
			name: "hybrid_groups_kept_with_kinds",
			payload: func(t *testing.T) []byte {
				return encode(t, []any{7.0, []any{
					store(1, 0, "mamba"), store(2, 1, "mamba"), store(3, 3, "mla_attention"),
					[]any{"BlockStored", []any{4}, nil, []any{1}, 1, nil, "GPU", nil, []any{nil}, 2, "sliding_window", 128},
					map[string]any{"type": "BlockRemoved", "block_hashes": []any{3}, "group_idx": 3},
					[]any{"BlockRemoved", []any{2}, nil, 1},
				}})
			},
			events: []Event{
				stored(0, 1, 0, "mamba"), stored(1, 2, 1, "mamba"), stored(2, 3, 3, "mla_attention"), func() Event {
					e := stored(3, 4, 2, "sliding_window")
					e.HasExtraKeys, e.ExtraKeysLen = true, 1
					return e
				}(),
				{Type: BlockRemoved, Index: 4, BlockHashes: []uint64{3}, Tier: tier.GPU, GroupIdx: 3},
				{Type: BlockRemoved, Index: 5, BlockHashes: []uint64{2}, Tier: tier.GPU, GroupIdx: 1},
			},
			ts: 7,
		},
		{
			name: "bad_group_and_kind_are_invalid",
			payload: func(t *testing.T) []byte {
				return encode(t, []any{8.0, []any{store(1, -2, nil), store(1, "0", nil), store(1, 0, 5)}})
			},
			events:  []Event{},
			skipped: []SkipReason{SkipInvalid, SkipInvalid, SkipInvalid},
			ts:      8,
		},
	}
	dec := NewDecoder(nil)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := dec.Decode(tc.payload(t))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if diff := cmp.Diff(tc.events, b.Events); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
			var reasons []SkipReason
			for _, s := range b.Skipped {
				reasons = append(reasons, s.Reason)
			}
			if diff := cmp.Diff(tc.skipped, reasons); diff != "" {
				t.Errorf("skip reasons (-want +got):\n%s\n%v", diff, b.Skipped)
			}
			if b.TS != tc.ts || b.Rank != tc.rank || b.HasRank != tc.hasRank {
				t.Errorf("ts, rank, hasRank = %v, %v, %v; want %v, %v, %v", b.TS, b.Rank, b.HasRank, tc.ts, tc.rank, tc.hasRank)
			}
		})
	}
}

func TestAttention(t *testing.T) {
	for _, tc := range []struct {
		ev   Event
		want bool
	}{
		{Event{Type: BlockStored, KVCacheSpecKind: "full_attention"}, true},
		{Event{Type: BlockStored, KVCacheSpecKind: "mla_attention"}, true},
		{Event{Type: BlockStored, KVCacheSpecKind: "Full_Attention"}, false},
		{Event{Type: BlockStored, KVCacheSpecKind: "sliding_window"}, false},
		{Event{Type: BlockStored, KVCacheSpecKind: "mamba"}, false},
		{Event{Type: BlockStored}, false},
		{Event{Type: BlockRemoved, KVCacheSpecKind: "full_attention"}, false},
	} {
		if got := tc.ev.Attention(); got != tc.want {
			t.Errorf("%v kind %q: Attention() = %v, want %v", tc.ev.Type, tc.ev.KVCacheSpecKind, got, tc.want)
		}
	}
}

// TestOutOfRangeNamesTheValue: an integer field past its range is skipped
// with its value as sent, unsigned values above 2^63 included (they once
// printed as negative).
func TestOutOfRangeNamesTheValue(t *testing.T) {
	for _, tc := range []struct {
		field string
		value any
		want  string
	}{
		{"block_size", uint64(math.MaxUint64), "block_size 18446744073709551615 is out of range"},
		{"block_size", int64(-3), "block_size -3 is out of range"},
		{"group_idx", uint64(math.MaxUint64), "group_idx 18446744073709551615 is out of range"},
	} {
		ev := map[string]any{"type": "BlockStored", "block_hashes": []any{uint64(1)}, "token_ids": []any{}, "block_size": uint64(16), "medium": "GPU"}
		ev[tc.field] = tc.value
		b, err := NewDecoder(nil).Decode(encode(t, []any{1.0, []any{ev}, nil}))
		if err != nil {
			t.Fatal(err)
		}
		if len(b.Skipped) != 1 || !strings.Contains(b.Skipped[0].Detail, tc.want) {
			t.Errorf("%s %v: skipped %+v, want one naming %q", tc.field, tc.value, b.Skipped, tc.want)
		}
	}
}
