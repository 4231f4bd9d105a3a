package client

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
	"unicode/utf8"
	"unsafe"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/zeebo/xxh3"
)

// tokenVectorPath is the module's link to the vectors
// scripts/gen_token_vectors.py writes to the repository's
// testdata/fixtures/hashing/token_keys.json (tests run in this package's
// directory).
var tokenVectorPath = filepath.Join("testdata", "hashing", "token_keys.json")

// jsonExtra is an extra as the vector file spells it.
type jsonExtra struct {
	Kind string `json:"kind"`
	Hex  string `json:"hex"`
}

type tokenVectors struct {
	Root struct {
		Label string `json:"label"`
		Key   string `json:"key"`
	} `json:"root"`
	Blocks []struct {
		Name     string      `json:"name"`
		Parent   string      `json:"parent"`
		TokenIDs []uint32    `json:"token_ids"`
		Extras   []jsonExtra `json:"extras"`
		InputHex string      `json:"input_hex"`
		Key      string      `json:"key"`
	} `json:"blocks"`
	Prompts []struct {
		Name        string        `json:"name"`
		BlockSize   int           `json:"block_size"`
		TokenIDs    []uint32      `json:"token_ids"`
		LoRAName    string        `json:"lora_name"`
		CacheSalt   string        `json:"cache_salt"`
		MultiModal  []jsonMMItem  `json:"multimodal"`
		BlockExtras [][]jsonExtra `json:"block_extras"`
		Keys        []string      `json:"keys"`
	} `json:"prompts"`
	Events []struct {
		Name   string          `json:"name"`
		Entry  json.RawMessage `json:"entry"`
		Extras []jsonExtra     `json:"extras"`
	} `json:"events"`
}

type jsonMMItem struct {
	Hash   string `json:"hash"`
	Offset int    `json:"offset"`
	Length int    `json:"length"`
}

func loadTokenVectors(t testing.TB) tokenVectors {
	t.Helper()
	raw, err := os.ReadFile(tokenVectorPath)
	if err != nil {
		t.Fatal(err)
	}
	var v tokenVectors
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Blocks) == 0 || len(v.Prompts) == 0 || len(v.Events) == 0 {
		t.Fatalf("vector file has %d blocks, %d prompts, %d events", len(v.Blocks), len(v.Prompts), len(v.Events))
	}
	return v
}

func parseKey(t testing.TB, s string) uint64 {
	t.Helper()
	if len(s) != 16 {
		t.Fatalf("key %q is not 16 hex digits", s)
	}
	k, err := strconv.ParseUint(s, 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func hexKeys(keys []uint64) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = fmt.Sprintf("%016x", k)
	}
	return out
}

func fromJSONExtras(t testing.TB, in []jsonExtra) []Extra {
	t.Helper()
	var out []Extra
	for _, e := range in {
		data, err := hex.DecodeString(e.Hex)
		if err != nil {
			t.Fatal(err)
		}
		var k ExtraKind
		switch e.Kind {
		case "string":
			k = ExtraString
		case "bytes":
			k = ExtraBytes
		case "int":
			k = ExtraInt
		default:
			t.Fatalf("extra kind %q", e.Kind)
		}
		out = append(out, Extra{Kind: k, Data: data})
	}
	return out
}

func toJSONExtras(in []Extra) []jsonExtra {
	var out []jsonExtra
	for _, e := range in {
		out = append(out, jsonExtra{Kind: e.Kind.String(), Hex: hex.EncodeToString(e.Data)})
	}
	return out
}

func TestTokenKeyRoot(t *testing.T) {
	v := loadTokenVectors(t)
	if v.Root.Label != tokenKeyRootLabel {
		t.Fatalf("vector root label %q, the code's %q", v.Root.Label, tokenKeyRootLabel)
	}
	if got := xxh3.HashString(tokenKeyRootLabel); got != TokenKeyRoot {
		t.Fatalf("XXH3-64(%q) = %016x, TokenKeyRoot = %016x", tokenKeyRootLabel, got, TokenKeyRoot)
	}
	if want := parseKey(t, v.Root.Key); TokenKeyRoot != want {
		t.Fatalf("TokenKeyRoot = %016x, vectors say %016x", TokenKeyRoot, want)
	}
}

func TestTokenBlockKeyVectors(t *testing.T) {
	for _, b := range loadTokenVectors(t).Blocks {
		t.Run(b.Name, func(t *testing.T) {
			parent := parseKey(t, b.Parent)
			extras := fromJSONExtras(t, b.Extras)
			if got := hex.EncodeToString(appendBlockInput(nil, parent, b.TokenIDs, extras)); got != b.InputHex {
				t.Fatalf("hashed bytes\n got %s\nwant %s", got, b.InputHex)
			}
			if got, want := TokenBlockKey(parent, b.TokenIDs, extras), parseKey(t, b.Key); got != want {
				t.Fatalf("TokenBlockKey = %016x, want %016x", got, want)
			}
		})
	}
}

func TestTokenKeysVectors(t *testing.T) {
	for _, p := range loadTokenVectors(t).Prompts {
		t.Run(p.Name, func(t *testing.T) {
			prompt := TokenPrompt{TokenIDs: p.TokenIDs, LoRAName: p.LoRAName, CacheSalt: p.CacheSalt}
			for _, it := range p.MultiModal {
				prompt.MultiModal = append(prompt.MultiModal, MultiModalItem(it))
			}
			if diff := gocmp.Diff(p.Keys, hexKeys(TokenKeys(prompt, p.BlockSize))); diff != "" {
				t.Errorf("TokenKeys (-vectors +got):\n%s", diff)
			}
			// Block by block: the request rule's extras, chained through
			// TokenBlockKey, give the same keys.
			parent := TokenKeyRoot
			var chained []uint64
			for blk := range len(p.Keys) {
				extras := TokenBlockExtras(prompt, p.BlockSize, blk)
				if diff := gocmp.Diff(p.BlockExtras[blk], toJSONExtras(extras), cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("TokenBlockExtras of block %d (-vectors +got):\n%s", blk, diff)
				}
				parent = TokenBlockKey(parent, p.TokenIDs[blk*p.BlockSize:(blk+1)*p.BlockSize], extras)
				chained = append(chained, parent)
			}
			if diff := gocmp.Diff(p.Keys, hexKeys(chained)); diff != "" {
				t.Errorf("TokenBlockKey chain (-vectors +got):\n%s", diff)
			}
		})
	}
}

// decodeTagged turns the vector file's tagged JSON into the values a
// generic msgpack decoder returns.
func decodeTagged(t *testing.T, raw json.RawMessage) any {
	t.Helper()
	if string(raw) == "null" {
		return nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	for tag, v := range m {
		switch tag {
		case "array":
			var elems []json.RawMessage
			if err := json.Unmarshal(v, &elems); err != nil {
				t.Fatal(err)
			}
			out := []any{}
			for _, e := range elems {
				out = append(out, decodeTagged(t, e))
			}
			return out
		case "str":
			var s string
			if err := json.Unmarshal(v, &s); err != nil {
				t.Fatal(err)
			}
			return s
		case "bin":
			var s string
			if err := json.Unmarshal(v, &s); err != nil {
				t.Fatal(err)
			}
			b, err := hex.DecodeString(s)
			if err != nil {
				t.Fatal(err)
			}
			return b
		case "int":
			if n, err := strconv.ParseInt(string(v), 10, 64); err == nil {
				return n
			}
			n, err := strconv.ParseUint(string(v), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		t.Fatalf("tag %q", tag)
	}
	t.Fatalf("empty tagged value %s", raw)
	return nil
}

func TestEventExtrasVectors(t *testing.T) {
	for _, e := range loadTokenVectors(t).Events {
		t.Run(e.Name, func(t *testing.T) {
			got, err := EventExtras(decodeTagged(t, e.Entry))
			if err != nil {
				t.Fatal(err)
			}
			if diff := gocmp.Diff(e.Extras, toJSONExtras(got), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("EventExtras (-vectors +got):\n%s", diff)
			}
		})
	}
}

func TestEventExtrasIntWidths(t *testing.T) {
	want := []Extra{IntExtra(-3), IntExtra(200)}
	for _, tc := range []struct {
		name  string
		entry []any
	}{
		{"int", []any{int(-3), int(200)}},
		{"int8_uint8", []any{int8(-3), uint8(200)}},
		{"int16_uint16", []any{int16(-3), uint16(200)}},
		{"int32_uint32", []any{int32(-3), uint32(200)}},
		{"int64_uint64", []any{int64(-3), uint64(200)}},
		{"uint", []any{int64(-3), uint(200)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := EventExtras(tc.entry)
			if err != nil {
				t.Fatal(err)
			}
			if diff := gocmp.Diff(want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestEventExtrasRefused(t *testing.T) {
	deep := []any{[]any{[]any{[]any{[]any{"x"}}}}} // five levels
	for _, tc := range []struct {
		name  string
		entry any
	}{
		{"scalar_entry", "sql-lora"},
		{"nil_inside", []any{"a", nil}},
		{"bool", []any{true}},
		{"float", []any{1.5}},
		{"map", []any{map[string]any{"a": 1}}},
		{"invalid_utf8", []any{"\xff\xfe"}},
		{"too_deep", deep},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := EventExtras(tc.entry)
			if !errors.Is(err, ErrInvalidExtra) {
				t.Fatalf("EventExtras = %v, %v; want ErrInvalidExtra", got, err)
			}
		})
	}
	// Four levels, the entry's included, are still keyed.
	if _, err := EventExtras([]any{[]any{[]any{[]any{"x"}}}}); err != nil {
		t.Fatalf("four levels: %v", err)
	}
}

// TestTokenKeysMultiModalOrder checks that items out of prompt order, or
// overlapping, are keyed by the general rule (TokenBlockExtras), not the
// ordered fast path.
func TestTokenKeysMultiModalOrder(t *testing.T) {
	toks := make([]uint32, 24)
	for i := range toks {
		toks[i] = uint32(i)
	}
	for _, tc := range []struct {
		name  string
		items []MultiModalItem
	}{
		{"ordered", []MultiModalItem{{"a", 1, 6}, {"b", 9, 2}, {"c", 11, 9}}},
		{"reversed", []MultiModalItem{{"c", 11, 9}, {"b", 9, 2}, {"a", 1, 6}}},
		{"overlapping", []MultiModalItem{{"a", 1, 10}, {"b", 5, 2}}},
		{"empty_span", []MultiModalItem{{"a", 4, 0}, {"b", 5, 2}}},
		{"negative_offset", []MultiModalItem{{"a", -2, 4}}},
		{"beyond_prompt", []MultiModalItem{{"a", 30, 4}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := TokenPrompt{TokenIDs: toks, LoRAName: "l", CacheSalt: "s", MultiModal: tc.items}
			const bs = 4
			var want []uint64
			parent := TokenKeyRoot
			for blk := range len(toks) / bs {
				parent = TokenBlockKey(parent, toks[blk*bs:(blk+1)*bs], TokenBlockExtras(p, bs, blk))
				want = append(want, parent)
			}
			if diff := gocmp.Diff(want, TokenKeys(p, bs)); diff != "" {
				t.Errorf("(-block by block +TokenKeys):\n%s", diff)
			}
		})
	}
}

func TestTokenKeysEdges(t *testing.T) {
	p := TokenPrompt{TokenIDs: []uint32{1, 2, 3, 4, 5}}
	for _, tc := range []struct {
		name      string
		blockSize int
		want      int
	}{
		{"zero_block_size", 0, 0},
		{"negative_block_size", -4, 0},
		{"longer_than_prompt", 6, 0},
		{"exact", 5, 1},
		{"partial_tail", 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := len(TokenKeys(p, tc.blockSize)); got != tc.want {
				t.Fatalf("%d keys, want %d", got, tc.want)
			}
		})
	}
	// A key differs from its parent's and depends on the parent: the chain
	// is what makes a block's key name its whole prefix.
	a := TokenBlockKey(TokenKeyRoot, []uint32{1, 2}, nil)
	if b := TokenBlockKey(a, []uint32{1, 2}, nil); a == b {
		t.Fatal("same key for a block and its identical child")
	}
}

func TestTokenKeysAllocs(t *testing.T) {
	toks := make([]uint32, 1024)
	for i := range toks {
		toks[i] = uint32(i * 7)
	}
	p := TokenPrompt{TokenIDs: toks, LoRAName: "sql-lora", CacheSalt: "t", MultiModal: []MultiModalItem{{"img", 40, 100}}}
	dst := make([]uint64, 0, 64)
	if n := testing.AllocsPerRun(100, func() { dst = AppendTokenKeys(dst[:0], p, 16) }); n != 0 {
		t.Fatalf("AppendTokenKeys allocates %.0f times per call", n)
	}
	if n := testing.AllocsPerRun(100, func() { _ = TokenBlockKey(TokenKeyRoot, toks[:16], nil) }); n != 0 {
		t.Fatalf("TokenBlockKey allocates %.0f times per call", n)
	}
}

// BenchmarkTokenKeys measures keying per block (AppendTokenKeys over a
// prompt of 256 blocks) against two references measured in the same loop,
// batch after batch, both bare XXH3-64 calls over the very bytes TokenKeys
// hashes for each block, prepared beforehand: independent calls (xxh3,
// which the CPU overlaps), and calls chained as the key is, each block's
// parent written from the hash before (chain: each waits for the last).
// x-chain is what building the canonical input costs on top of hashing a
// chain. A third reference (copy) also writes each block's token ids into
// its prepared input before hashing it, chained: the least any
// implementation of this layout does, since the hash reads one contiguous
// input and the parent comes first; x-copy is what the rest of the
// assembly costs. Metrics: ns/block, xxh3-ns/block, x-xxh3,
// chain-ns/block, x-chain, copy-ns/block, x-copy.
func BenchmarkTokenKeys(b *testing.B) {
	for _, tc := range []struct {
		name string
		bs   int
		lora string
	}{
		{"bs16", 16, ""},
		{"bs16_lora", 16, "sql-lora"},
		{"bs64", 64, ""},
	} {
		b.Run(tc.name, func(b *testing.B) {
			if !nativeLittleEndian {
				b.Skip("the copy reference copies token memory as little-endian bytes")
			}
			const blocks = 256
			toks := make([]uint32, tc.bs*blocks)
			for i := range toks {
				toks[i] = uint32(i*2654435761) % 152000
			}
			p := TokenPrompt{TokenIDs: toks, LoRAName: tc.lora}
			keys := TokenKeys(p, tc.bs)
			inputs := make([][]byte, blocks)
			parent := TokenKeyRoot
			for i := range inputs {
				inputs[i] = appendBlockInput(nil, parent, toks[i*tc.bs:(i+1)*tc.bs], TokenBlockExtras(p, tc.bs, i))
				if xxh3.Hash(inputs[i]) != keys[i] {
					b.Fatalf("block %d: the reference's bytes are not what TokenKeys hashes", i)
				}
				parent = keys[i]
			}
			dst := make([]uint64, 0, blocks)
			var measured, bare, chained, copied time.Duration
			var sink, last uint64
			units := 0
			for b.Loop() {
				t0 := time.Now()
				dst = AppendTokenKeys(dst[:0], p, tc.bs)
				t1 := time.Now()
				for _, in := range inputs {
					sink ^= xxh3.Hash(in)
				}
				t2 := time.Now()
				parent := TokenKeyRoot
				for _, in := range inputs {
					binary.LittleEndian.PutUint64(in, parent)
					parent = xxh3.Hash(in)
				}
				last = parent
				t3 := time.Now()
				parent = TokenKeyRoot
				for i, in := range inputs {
					binary.LittleEndian.PutUint64(in, parent)
					block := toks[i*tc.bs : (i+1)*tc.bs]
					copy(in[12:], unsafe.Slice((*byte)(unsafe.Pointer(&block[0])), 4*len(block)))
					parent = xxh3.Hash(in)
				}
				t4 := time.Now()
				measured += t1.Sub(t0)
				bare += t2.Sub(t1)
				chained += t3.Sub(t2)
				copied += t4.Sub(t3)
				units += blocks
			}
			if sink == math.MaxUint64 || dst[blocks-1] != keys[blocks-1] || last != keys[blocks-1] || parent != keys[blocks-1] {
				b.Fatal("keys changed between runs")
			}
			per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(units) }
			b.ReportMetric(per(measured), "ns/block")
			b.ReportMetric(per(bare), "xxh3-ns/block")
			b.ReportMetric(per(measured)/per(bare), "x-xxh3")
			b.ReportMetric(per(chained), "chain-ns/block")
			b.ReportMetric(per(measured)/per(chained), "x-chain")
			b.ReportMetric(per(copied), "copy-ns/block")
			b.ReportMetric(per(measured)/per(copied), "x-copy")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// FuzzTokenKeys keys arbitrary prompts (token ids, LoRA name, salt, one
// multimodal item, block size from the input) and arbitrary extra_keys
// shapes: nothing may panic, TokenKeys has one key per full block and
// equals the block-by-block chain of TokenBlockKey over TokenBlockExtras.
func FuzzTokenKeys(f *testing.F) {
	f.Add([]byte{1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0}, uint8(2), "sql-lora", "salt", "img", 1, 2)
	f.Add([]byte{}, uint8(0), "", "", "", 0, 0)
	f.Add(make([]byte, 400), uint8(16), "", "", "x", -3, 40)
	f.Fuzz(func(t *testing.T, raw []byte, bs uint8, lora, salt, mmHash string, mmOff, mmLen int) {
		toks := make([]uint32, len(raw)/4)
		for i := range toks {
			toks[i] = binary.LittleEndian.Uint32(raw[4*i:])
		}
		p := TokenPrompt{TokenIDs: toks, LoRAName: lora, CacheSalt: salt}
		if mmHash != "" {
			p.MultiModal = []MultiModalItem{{Hash: mmHash, Offset: mmOff % 1000, Length: mmLen % 1000}}
		}
		size := int(bs)
		keys := TokenKeys(p, size)
		if size <= 0 {
			if len(keys) != 0 {
				t.Fatalf("block size %d gave %d keys", size, len(keys))
			}
			return
		}
		if len(keys) != len(toks)/size {
			t.Fatalf("%d tokens at block size %d gave %d keys", len(toks), size, len(keys))
		}
		parent := TokenKeyRoot
		for blk, k := range keys {
			parent = TokenBlockKey(parent, toks[blk*size:(blk+1)*size], TokenBlockExtras(p, size, blk))
			if parent != k {
				t.Fatalf("block %d: TokenKeys %016x, block by block %016x", blk, k, parent)
			}
		}
		// The same bytes as an extra_keys entry must map without a panic.
		if _, err := EventExtras([]any{lora, []byte(salt), []any{mmHash, int64(mmOff)}}); err != nil && utf8.ValidString(lora) && utf8.ValidString(mmHash) {
			t.Fatalf("EventExtras of a keyable entry: %v", err)
		}
	})
}
