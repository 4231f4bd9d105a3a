package events

import (
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// TestFieldsOfAnotherType: a map event is judged only by the fields that
// belong to its type; a bad value in a field of another type is ignored,
// as an unknown field is, in the map encoding as in the array one. Before,
// every known field name was checked whatever the type, so a clear or a
// removal carrying, say, "block_hashes": nil or a mistyped token_ids was
// skipped as invalid and its blocks stayed in the index as ghost hits.
func TestFieldsOfAnotherType(t *testing.T) {
	applied := []struct {
		name  string
		event map[string]any
		want  string // summary of the one event decoded
	}{
		{"clear with nil hashes", map[string]any{"type": "AllBlocksCleared", "block_hashes": nil}, "AllBlocksCleared"},
		{"clear with a mistyped medium", map[string]any{"type": "AllBlocksCleared", "medium": 5}, "AllBlocksCleared"},
		{"tier clear with nil hashes", map[string]any{"type": "TierBlocksCleared", "medium": "CPU", "block_hashes": nil}, "TierBlocksCleared [] medium=CPU"},
		{"tier clear with a negative group", map[string]any{"type": "TierBlocksCleared", "medium": "CPU", "group_idx": -1}, "TierBlocksCleared [] medium=CPU"},
		{"removal with string token ids", map[string]any{"type": "BlockRemoved", "block_hashes": []any{1}, "token_ids": "x"}, "BlockRemoved ['0000000000000001'] medium=None"},
		{"removal with bad token ids", map[string]any{"type": "BlockRemoved", "block_hashes": []any{1}, "token_ids": []any{"x"}}, "BlockRemoved ['0000000000000001'] medium=None"},
		{"removal with a string parent", map[string]any{"type": "BlockRemoved", "block_hashes": []any{1}, "parent_block_hash": "x"}, "BlockRemoved ['0000000000000001'] medium=None"},
		{"removal with a negative block size", map[string]any{"type": "BlockRemoved", "block_hashes": []any{1}, "block_size": -1}, "BlockRemoved ['0000000000000001'] medium=None"},
		{"removal with an int lora name", map[string]any{"type": "BlockRemoved", "block_hashes": []any{1}, "lora_name": 5}, "BlockRemoved ['0000000000000001'] medium=None"},
		{"removal with an int spec kind", map[string]any{"type": "BlockRemoved", "block_hashes": []any{1}, "kv_cache_spec_kind": 5}, "BlockRemoved ['0000000000000001'] medium=None"},
	}
	for _, tc := range applied {
		t.Run(tc.name, func(t *testing.T) {
			b, err := NewDecoder(nil).Decode(encode(t, []any{1.0, []any{tc.event}}))
			if err != nil {
				t.Fatal(err)
			}
			if len(b.Skipped) != 0 || len(b.Events) != 1 {
				t.Fatalf("events %+v, skipped %+v; want the event applied", b.Events, b.Skipped)
			}
			if got := strings.TrimPrefix(summary(b), "dp_rank=0: "); got != tc.want {
				t.Fatalf("decoded %q, want %q", got, tc.want)
			}
		})
	}

	// Fields that belong to the type are still checked.
	refused := []struct {
		name   string
		event  map[string]any
		detail string
	}{
		{"removal with nil hashes", map[string]any{"type": "BlockRemoved", "block_hashes": nil}, "block_hashes"},
		{"removal with a negative group", map[string]any{"type": "BlockRemoved", "block_hashes": []any{1}, "group_idx": -1}, "group_idx"},
		{"tier clear with a mistyped medium", map[string]any{"type": "TierBlocksCleared", "medium": 5}, "medium"},
		{"store with bad token ids", map[string]any{"type": "BlockStored", "block_hashes": []any{1}, "token_ids": "x", "block_size": 16}, "token_ids"},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			b, err := NewDecoder(nil).Decode(encode(t, []any{1.0, []any{tc.event}}))
			if err != nil {
				t.Fatal(err)
			}
			if len(b.Events) != 0 || len(b.Skipped) != 1 || b.Skipped[0].Reason != SkipInvalid || !strings.Contains(b.Skipped[0].Detail, tc.detail) {
				t.Fatalf("events %+v, skipped %+v; want one invalid event naming %s", b.Events, b.Skipped, tc.detail)
			}
		})
	}
}

// TestRepeatedField: a field of the event's type given twice in one map is
// refused, not settled by its last value (a second medium would remove the
// blocks from another tier); a repeated field of another type is ignored.
func TestRepeatedField(t *testing.T) {
	str := func(s string) []byte {
		b, err := msgpack.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	event := func(kv ...string) []byte {
		b := []byte{0x80 | byte(len(kv)/2+1)}
		b = append(b, str("block_hashes")...)
		b = append(b, 0x91, 0x01)
		for _, s := range kv {
			b = append(b, str(s)...)
		}
		return append([]byte{0x92, 0x01, 0x91}, b...)
	}

	b, err := NewDecoder(nil).Decode(event("type", "BlockRemoved", "medium", "GPU", "medium", "CPU"))
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Events) != 0 || len(b.Skipped) != 1 || b.Skipped[0].Reason != SkipInvalid || !strings.Contains(b.Skipped[0].Detail, "medium is given more than once") {
		t.Fatalf("events %+v, skipped %+v; want one invalid event naming the repeated medium", b.Events, b.Skipped)
	}

	b, err = NewDecoder(nil).Decode(event("type", "BlockRemoved", "lora_name", "a", "lora_name", "b"))
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Skipped) != 0 || len(b.Events) != 1 || b.Events[0].Type != BlockRemoved {
		t.Fatalf("events %+v, skipped %+v; want the removal applied", b.Events, b.Skipped)
	}
}
