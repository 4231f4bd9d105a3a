package client

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"unicode/utf8"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// This file is kvindex's canonical block key (DESIGN "Hashing", token
// mode), specified byte for byte in docs/hashing.md with vectors in
// testdata/fixtures/hashing/token_keys.json. It is the one implementation:
// the ingester keys stored blocks with it, indexd keys token Lookups with
// it, and routers that hash locally call it.

// TokenKeyRoot is the parent key of block 0: XXH3-64 (seed 0) of the 20
// ASCII bytes "kvindex token key v1" (docs/hashing.md, "Root").
const TokenKeyRoot uint64 = 0x40054e7bcc5d3b83

// tokenKeyRootLabel is the input TokenKeyRoot is the XXH3-64 of.
const tokenKeyRootLabel = "kvindex token key v1"

// ExtraKind is the type byte of a block extra (docs/hashing.md, "Extras").
type ExtraKind byte

// The extra kinds. Their values are part of the key's byte layout.
const (
	// ExtraString is text: its UTF-8 bytes (a LoRA name, a cache salt, a
	// multimodal item's hash; msgpack str).
	ExtraString ExtraKind = 1
	// ExtraBytes is a byte string (msgpack bin; for example vLLM's prompt
	// embedding digests).
	ExtraBytes ExtraKind = 2
	// ExtraInt is an integer as 8 bytes little-endian, two's complement
	// (msgpack int and uint; for example a multimodal item's offset
	// relative to the block's first token, which may be negative).
	ExtraInt ExtraKind = 3
)

// String names the kind: "string", "bytes", "int", or "kind(N)".
func (k ExtraKind) String() string {
	switch k {
	case ExtraString:
		return "string"
	case ExtraBytes:
		return "bytes"
	case ExtraInt:
		return "int"
	}
	return fmt.Sprintf("kind(%d)", byte(k))
}

// Extra is one typed extra of a block: what besides its tokens and parent
// makes its key (docs/hashing.md, "Extras"). Data is hashed as given; build
// extras with StringExtra, BytesExtra and IntExtra so Data has the layout
// its Kind promises.
type Extra struct {
	Kind ExtraKind
	Data []byte
}

// StringExtra is the ExtraString of s.
func StringExtra(s string) Extra { return Extra{Kind: ExtraString, Data: []byte(s)} }

// BytesExtra is the ExtraBytes of b (not copied).
func BytesExtra(b []byte) Extra { return Extra{Kind: ExtraBytes, Data: b} }

// IntExtra is the ExtraInt of v: 8 bytes little-endian, two's complement.
func IntExtra(v int64) Extra {
	return Extra{Kind: ExtraInt, Data: binary.LittleEndian.AppendUint64(nil, uint64(v))}
}

// TokenPrompt is a prompt as token ids plus the extras vLLM folds into its
// block hashes (the API's kvindex.v1.TokenPrompt).
type TokenPrompt struct {
	// TokenIDs are the prompt's token ids in order.
	TokenIDs []uint32
	// LoRAName is the LoRA adapter the request runs with; empty for the
	// base model. It is an extra of every block.
	LoRAName string
	// CacheSalt is the request's prefix-cache salt; empty for none. It is
	// an extra of block 0 only.
	CacheSalt string
	// MultiModal are the prompt's multimodal inputs in prompt order (by
	// Offset, spans not overlapping); each is an extra of every block its
	// span overlaps.
	MultiModal []MultiModalItem
}

// MultiModalItem is one multimodal input of a prompt: the engine's
// identifier of its content (vLLM's mm_hash, or the UUID the request gave
// it) and the span of placeholder tokens it occupies, [Offset,
// Offset+Length) in token positions.
type MultiModalItem struct {
	Hash           string
	Offset, Length int
}

// TokenBlockKey is the canonical key of one block (docs/hashing.md,
// "Layout"): XXH3-64, seed 0, over parent (8 bytes little-endian; pass
// TokenKeyRoot for block 0), the token count and each token id (u32
// little-endian each), then the extras count (u32 little-endian) and each
// extra as its kind byte, its data length (u32 little-endian) and its
// data. Extras are hashed in the order given. It allocates only when the
// input is over 1 KiB.
func TokenBlockKey(parent uint64, tokens []uint32, extras []Extra) uint64 {
	var stack [1024]byte
	return xxh3.Hash(appendBlockInput(stack[:0], parent, tokens, extras))
}

// appendBlockInput appends the bytes TokenBlockKey hashes.
func appendBlockInput(b []byte, parent uint64, tokens []uint32, extras []Extra) []byte {
	b = appendBlockHead(b, parent, tokens)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(extras)))
	for _, e := range extras {
		b = appendExtra(b, e.Kind, e.Data)
	}
	return b
}

// appendBlockHead appends the parent, the token count and the tokens,
// growing b once (appending token by token was most of the keying cost).
func appendBlockHead(b []byte, parent uint64, tokens []uint32) []byte {
	n := len(b)
	b = slices.Grow(b, 12+4*len(tokens))[:n+12+4*len(tokens)]
	binary.LittleEndian.PutUint64(b[n:], parent)
	binary.LittleEndian.PutUint32(b[n+8:], uint32(len(tokens)))
	out := b[n+12:]
	if nativeLittleEndian && len(tokens) > 0 {
		// The token ids' memory already is their little-endian encoding.
		copy(out, unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), 4*len(tokens)))
		return b
	}
	for _, t := range tokens {
		binary.LittleEndian.PutUint32(out, t)
		out = out[4:]
	}
	return b
}

// nativeLittleEndian says whether this machine stores a uint32 as its
// little-endian bytes, so token ids can be copied into a key's input
// instead of encoded one by one.
var nativeLittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// appendExtra appends one extra: kind byte, u32 length, data.
func appendExtra[T string | []byte](b []byte, k ExtraKind, data T) []byte {
	b = append(b, byte(k))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(data)))
	return append(b, data...)
}

// appendIntExtra appends an ExtraInt of v.
func appendIntExtra(b []byte, v int64) []byte {
	b = append(b, byte(ExtraInt))
	b = binary.LittleEndian.AppendUint32(b, 8)
	return binary.LittleEndian.AppendUint64(b, uint64(v))
}

// TokenKeys returns the canonical keys of p's full blocks of blockSize
// tokens, block 0 first, each chained on the one before (block 0 on
// TokenKeyRoot), with each block's extras built by vLLM's rule
// (TokenBlockExtras). A trailing partial block is not keyed, so a prompt
// shorter than one block, or a blockSize below 1, gives none.
func TokenKeys(p TokenPrompt, blockSize int) []uint64 {
	if blockSize <= 0 {
		return nil
	}
	return AppendTokenKeys(make([]uint64, 0, len(p.TokenIDs)/blockSize), p, blockSize)
}

// AppendTokenKeys appends TokenKeys(p, blockSize) to dst: with a dst of
// enough capacity and blocks of at most 200 tokens without long extras it
// allocates nothing.
func AppendTokenKeys(dst []uint64, p TokenPrompt, blockSize int) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	n := len(p.TokenIDs) / blockSize
	if n == 0 {
		return dst
	}
	var stack [1024]byte
	buf := stack[:0]
	mm := p.MultiModal
	ordered := multiModalOrdered(mm)
	first := 0 // with ordered items: the first item not wholly before the block
	parent := TokenKeyRoot
	for blk := range n {
		start, end := blk*blockSize, (blk+1)*blockSize
		buf = appendBlockHead(buf[:0], parent, p.TokenIDs[start:end])
		countAt := len(buf)
		buf = append(buf, 0, 0, 0, 0)
		count := uint32(0)
		if p.LoRAName != "" {
			buf = appendExtra(buf, ExtraString, p.LoRAName)
			count++
		}
		if ordered {
			for first < len(mm) && mm[first].Offset+mm[first].Length <= start {
				first++
			}
			for i := first; i < len(mm) && mm[i].Offset < end; i++ {
				buf = appendExtra(buf, ExtraString, mm[i].Hash)
				buf = appendIntExtra(buf, int64(mm[i].Offset-start))
				count += 2
			}
		} else {
			for _, it := range mm {
				if overlaps(it, start, end) {
					buf = appendExtra(buf, ExtraString, it.Hash)
					buf = appendIntExtra(buf, int64(it.Offset-start))
					count += 2
				}
			}
		}
		if blk == 0 && p.CacheSalt != "" {
			buf = appendExtra(buf, ExtraString, p.CacheSalt)
			count++
		}
		binary.LittleEndian.PutUint32(buf[countAt:], count)
		parent = xxh3.Hash(buf)
		dst = append(dst, parent)
	}
	return dst
}

// overlaps says whether item it's span meets the tokens [start, end).
func overlaps(it MultiModalItem, start, end int) bool {
	return it.Length > 0 && it.Offset < end && it.Offset+it.Length > start
}

// multiModalOrdered says whether items are in prompt order with
// non-empty, non-overlapping spans, so AppendTokenKeys may walk them with
// one moving index instead of testing every item against every block.
func multiModalOrdered(items []MultiModalItem) bool {
	prevEnd := math.MinInt
	for _, it := range items {
		if it.Length <= 0 || it.Offset < prevEnd {
			return false
		}
		prevEnd = it.Offset + it.Length
	}
	return true
}

// TokenBlockExtras returns the extras of block blk (tokens [blk×blockSize,
// (blk+1)×blockSize)) of p by vLLM's rule (docs/hashing.md, "A request's
// extras"): the LoRA name (ExtraString) when set; then, for each
// multimodal item whose span overlaps the block, in the order given, its
// hash (ExtraString) and its offset relative to the block's first token
// (ExtraInt, negative when the item began in an earlier block); then, on
// block 0 only, the cache salt (ExtraString) when set. TokenKeys hashes
// exactly these; it is exported for writers and tests that key a block at
// a time with TokenBlockKey.
func TokenBlockExtras(p TokenPrompt, blockSize, blk int) []Extra {
	var out []Extra
	if p.LoRAName != "" {
		out = append(out, StringExtra(p.LoRAName))
	}
	start, end := blk*blockSize, (blk+1)*blockSize
	for _, it := range p.MultiModal {
		if overlaps(it, start, end) {
			out = append(out, StringExtra(it.Hash), IntExtra(int64(it.Offset-start)))
		}
	}
	if blk == 0 && p.CacheSalt != "" {
		out = append(out, StringExtra(p.CacheSalt))
	}
	return out
}

// ErrInvalidExtra reports an event's extra key that has no canonical
// encoding (EventExtras).
var ErrInvalidExtra = errors.New("kvindex client: extra key has no canonical encoding")

// maxExtraDepth bounds the nesting EventExtras flattens: a block's entry
// (1) holding vLLM's (mm_hash, offset) tuples (2), with room to spare.
const maxExtraDepth = 4

// EventExtras converts one element of a BlockStored event's extra_keys (a
// block's entry, as a generic msgpack decoder returns it) into the typed
// extras that block is keyed with (docs/hashing.md, "From an event"):
//
//   - nil: no extras (a block vLLM hashed without any).
//   - an array ([]any): its elements in order, each mapped below; a
//     nested array (vLLM's (mm_hash, offset) tuple) contributes its own
//     elements in order, flattened, up to 4 levels of nesting in all.
//   - str (string): ExtraString of its bytes, which must be valid UTF-8.
//   - bin ([]byte): ExtraBytes.
//   - int and uint of any width: ExtraInt (a uint above 2^63-1 keeps its
//     64 bits, so it shares its bytes with a negative int).
//
// A scalar entry is not an array and errs, as do nil inside an array,
// bool, float, map and extension values: they wrap ErrInvalidExtra, and
// the writer skips and counts the store rather than guess its key.
func EventExtras(entry any) ([]Extra, error) {
	if entry == nil {
		return nil, nil
	}
	arr, ok := entry.([]any)
	if !ok {
		return nil, fmt.Errorf("%w: a block's entry is %T, not an array or nil", ErrInvalidExtra, entry)
	}
	return appendEventExtras(nil, arr, 1)
}

func appendEventExtras(out []Extra, arr []any, depth int) ([]Extra, error) {
	for i, v := range arr {
		var err error
		switch v := v.(type) {
		case []any:
			if depth >= maxExtraDepth {
				return nil, fmt.Errorf("%w: element %d nests deeper than %d levels", ErrInvalidExtra, i, maxExtraDepth)
			}
			if out, err = appendEventExtras(out, v, depth+1); err != nil {
				return nil, err
			}
		case string:
			if !utf8.ValidString(v) {
				return nil, fmt.Errorf("%w: element %d is a str that is not valid UTF-8", ErrInvalidExtra, i)
			}
			out = append(out, StringExtra(v))
		case []byte:
			out = append(out, Extra{Kind: ExtraBytes, Data: append([]byte(nil), v...)})
		case int:
			out = append(out, IntExtra(int64(v)))
		case int8:
			out = append(out, IntExtra(int64(v)))
		case int16:
			out = append(out, IntExtra(int64(v)))
		case int32:
			out = append(out, IntExtra(int64(v)))
		case int64:
			out = append(out, IntExtra(v))
		case uint:
			out = append(out, IntExtra(int64(v)))
		case uint8:
			out = append(out, IntExtra(int64(v)))
		case uint16:
			out = append(out, IntExtra(int64(v)))
		case uint32:
			out = append(out, IntExtra(int64(v)))
		case uint64:
			out = append(out, IntExtra(int64(v)))
		default:
			return nil, fmt.Errorf("%w: element %d is %T (only str, bin, int and arrays of them are keyed)", ErrInvalidExtra, i, v)
		}
	}
	return out, nil
}
