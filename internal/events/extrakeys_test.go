package events

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kvindex/kvindex/internal/tier"
)

func TestExtraKeys(t *testing.T) {
	stored := func(extra any) map[string]any {
		return map[string]any{"type": "BlockStored", "block_hashes": []any{uint64(1), uint64(2)}, "token_ids": []int{1, 2}, "block_size": 1, "medium": "GPU", "extra_keys": extra}
	}
	base := Event{Type: BlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: []int64{1, 2}, BlockSize: 1, Medium: "GPU", Tier: tier.GPU}
	with := func(f func(*Event)) Event { e := base; f(&e); return e }
	tests := []struct {
		name  string
		event any
		want  Event
	}{
		{name: "nil", event: stored(nil), want: base},
		{name: "all_blocks_nil", event: stored([]any{nil, nil}), want: with(func(e *Event) { e.HasExtraKeys, e.ExtraKeysLen = true, 2 })},
		{
			name:  "str_bin_int_in_order",
			event: stored([]any{[]any{"lora-a", "salt"}, []any{[]byte{7, 8}, -3, uint64(1) << 40}}),
			want: with(func(e *Event) {
				e.HasExtraKeys, e.ExtraKeysLen = true, 2
				e.ExtraKeys = [][]Extra{
					{{Kind: ExtraString, Data: []byte("lora-a")}, {Kind: ExtraString, Data: []byte("salt")}},
					{{Kind: ExtraBytes, Data: []byte{7, 8}}, {Kind: ExtraInt, Data: le(-3)}, {Kind: ExtraInt, Data: le(1 << 40)}},
				}
			}),
		},
		{
			name:  "nil_then_keys",
			event: stored([]any{nil, []any{"mm-hash"}}),
			want: with(func(e *Event) {
				e.HasExtraKeys, e.ExtraKeysLen = true, 2
				e.ExtraKeys = [][]Extra{nil, {{Kind: ExtraString, Data: []byte("mm-hash")}}}
			}),
		},
		{
			name:  "array_encoded_event",
			event: []any{"BlockStored", []any{uint64(1)}, nil, []int{1}, 1, nil, "GPU", "lora-a", []any{[]any{"lora-a"}}},
			want: Event{Type: BlockStored, BlockHashes: []uint64{1}, TokenIDs: []int64{1}, BlockSize: 1, Medium: "GPU", Tier: tier.GPU, LoraName: "lora-a",
				HasExtraKeys: true, ExtraKeysLen: 1, ExtraKeys: [][]Extra{{{Kind: ExtraString, Data: []byte("lora-a")}}}},
		},
		{
			// Unreadable extra keys leave the event valid (engine-hash
			// mode does not need them) and say why.
			name:  "not_an_array",
			event: stored("nope"),
			want:  with(func(e *Event) { e.BadExtraKeys = "field extra_keys is string, want array or nil" }),
		},
		{
			name:  "mm_tuples_flatten",
			event: stored([]any{[]any{"lora", []any{"mm-1", -4}}, []any{[]any{[]any{"x"}}}}),
			want: with(func(e *Event) {
				e.HasExtraKeys, e.ExtraKeysLen = true, 2
				e.ExtraKeys = [][]Extra{
					{{Kind: ExtraString, Data: []byte("lora")}, {Kind: ExtraString, Data: []byte("mm-1")}, {Kind: ExtraInt, Data: le(-4)}},
					{{Kind: ExtraString, Data: []byte("x")}},
				}
			}),
		},
		{
			name:  "big_uint_keeps_its_bits",
			event: stored([]any{[]any{^uint64(0)}, nil}),
			want: with(func(e *Event) {
				e.HasExtraKeys, e.ExtraKeysLen = true, 2
				e.ExtraKeys = [][]Extra{{{Kind: ExtraInt, Data: le(-1)}}, nil}
			}),
		},
		{
			name:  "too_deep",
			event: stored([]any{[]any{[]any{[]any{[]any{[]any{"x"}}}}}, nil}),
			want: with(func(e *Event) {
				e.HasExtraKeys, e.ExtraKeysLen = true, 2
				e.ExtraKeys = [][]Extra{{}, nil}
				e.BadExtraKeys = "field extra_keys[0] nests deeper than 4 levels"
			}),
		},
		{
			name:  "nil_inside_an_entry",
			event: stored([]any{[]any{"a", nil}, nil}),
			want: with(func(e *Event) {
				e.HasExtraKeys, e.ExtraKeysLen = true, 2
				e.ExtraKeys = [][]Extra{{{Kind: ExtraString, Data: []byte("a")}}, nil}
				e.BadExtraKeys = "field extra_keys[0] holds nil, want str, bin, int or an array of them"
			}),
		},
		{
			name:  "float_key",
			event: stored([]any{[]any{1.5}, nil}),
			want: with(func(e *Event) {
				e.HasExtraKeys, e.ExtraKeysLen = true, 2
				e.ExtraKeys = [][]Extra{{}, nil}
				e.BadExtraKeys = "field extra_keys[0] holds float, want str, bin, int or an array of them"
			}),
		},
		{
			name:  "block_entry_not_an_array",
			event: stored([]any{"x", nil}),
			want: with(func(e *Event) {
				e.HasExtraKeys, e.ExtraKeysLen = true, 2
				e.BadExtraKeys = "field extra_keys[0] is string, want array or nil"
			}),
		},
	}
	dec := NewDecoder(nil)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := dec.Decode(encode(t, []any{1.0, []any{tc.event, []any{"AllBlocksCleared"}}}))
			if err != nil {
				t.Fatal(err)
			}
			want := []Event{tc.want, {Type: AllBlocksCleared, Index: 1}}
			if diff := cmp.Diff(want, b.Events); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRemovalCarriesNoExtraKeys(t *testing.T) {
	dec := NewDecoder(nil)
	b, err := dec.Decode(encode(t, []any{1.0, []any{map[string]any{"type": "BlockRemoved", "block_hashes": []any{1}, "extra_keys": []any{[]any{"x"}}}}}))
	if err != nil {
		t.Fatal(err)
	}
	want := []Event{{Type: BlockRemoved, BlockHashes: []uint64{1}, Tier: tier.GPU}}
	if diff := cmp.Diff(want, b.Events); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

// TestExtraKeysVectors decodes every extra_keys entry of the hashing
// vectors (client/testdata/hashing/token_keys.json, generated by a
// Python script independently of this decoder) and compares the typed
// extras with the ones the vectors name.
func TestExtraKeysVectors(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "client", "testdata", "hashing", "token_keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Events []struct {
			Name   string          `json:"name"`
			Entry  json.RawMessage `json:"entry"`
			Extras []struct {
				Kind string `json:"kind"`
				Hex  string `json:"hex"`
			} `json:"extras"`
		} `json:"events"`
	}
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Events) == 0 {
		t.Fatal("no event vectors")
	}
	kinds := map[string]ExtraKind{"string": ExtraString, "bytes": ExtraBytes, "int": ExtraInt}
	dec := NewDecoder(nil)
	for _, v := range file.Events {
		t.Run(v.Name, func(t *testing.T) {
			entry, err := untag(v.Entry)
			if err != nil {
				t.Fatal(err)
			}
			ev := map[string]any{"type": "BlockStored", "block_hashes": []any{1}, "token_ids": []int{1}, "block_size": 1, "extra_keys": []any{entry}}
			b, err := dec.Decode(encode(t, []any{1.0, []any{ev}}))
			if err != nil || len(b.Events) != 1 {
				t.Fatalf("Decode: %v, %d events", err, len(b.Events))
			}
			got := b.Events[0]
			if got.BadExtraKeys != "" {
				t.Fatalf("extra keys unkeyable: %s", got.BadExtraKeys)
			}
			want := []Extra{}
			for _, x := range v.Extras {
				data, err := hex.DecodeString(x.Hex)
				if err != nil {
					t.Fatal(err)
				}
				want = append(want, Extra{Kind: kinds[x.Kind], Data: data})
			}
			var keys []Extra
			if got.ExtraKeys != nil {
				keys = got.ExtraKeys[0]
			}
			if keys == nil {
				keys = []Extra{}
			}
			if diff := cmp.Diff(want, keys, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("extras (-want +got):\n%s", diff)
			}
		})
	}
}

// untag turns a vector's tagged JSON value (null, {"array": [...]},
// {"str": s}, {"bin": hex}, {"int": n}) into what the msgpack encoder
// writes as that type.
func untag(raw json.RawMessage) (any, error) {
	if string(raw) == "null" {
		return nil, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	for k, v := range m {
		switch k {
		case "array":
			var elems []json.RawMessage
			if err := json.Unmarshal(v, &elems); err != nil {
				return nil, err
			}
			out := []any{}
			for _, e := range elems {
				x, err := untag(e)
				if err != nil {
					return nil, err
				}
				out = append(out, x)
			}
			return out, nil
		case "str":
			var s string
			err := json.Unmarshal(v, &s)
			return s, err
		case "bin":
			var s string
			if err := json.Unmarshal(v, &s); err != nil {
				return nil, err
			}
			return hex.DecodeString(s)
		case "int":
			var n json.Number
			if err := json.Unmarshal(v, &n); err != nil {
				return nil, err
			}
			if i, err := n.Int64(); err == nil {
				return i, nil
			}
			return strconv.ParseUint(n.String(), 10, 64)
		}
	}
	return nil, fmt.Errorf("untagged vector value %s", raw)
}
