package client

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
)

// Hasher computes vLLM's prefix-cache block hashes for
// --prefix-caching-hash-algo sha256_cbor with a fixed PYTHONHASHSEED, so a
// router can look up exactly the hashes a vLLM engine publishes in its KV
// events (DESIGN "Hashing", engine-hash mode). Vectors:
// testdata/fixtures/hashing/vllm_sha256_cbor.json.
//
// The scheme (vLLM v1 kv_cache_utils): the root is sha256 of the canonical
// CBOR encoding of the PYTHONHASHSEED string; block i's digest is sha256 of
// the canonical CBOR of the array [parent digest (byte string), the block's
// token ids (array of uints), extra keys (array, or null when none)], the
// parent of block 0 being the root. Events carry the low 64 bits of each
// digest (its last 8 bytes, big-endian). A trailing partial block is not
// hashed.
//
// Extra keys per block are, in vLLM's order, the LoRA adapter's name (every
// block of a LoRA request) and the request's cache salt (the first block
// only). Multimodal inputs add keys this Hasher does not compute.
//
// A Hasher is immutable and safe for concurrent use.
type Hasher struct {
	root      [sha256.Size]byte
	blockSize int
}

// HashExtras are the per-request inputs that change block hashes besides
// the tokens.
type HashExtras struct {
	// LoRAName is the LoRA adapter's name, empty for the base model.
	LoRAName string
	// CacheSalt is the request's cache_salt, empty for none.
	CacheSalt string
}

// ErrInvalidHasher reports a hasher configuration vLLM could not have.
var ErrInvalidHasher = errors.New("kvindex client: invalid hasher config")

// NewHasher returns the hasher of engines started with PYTHONHASHSEED =
// pythonHashSeed (exactly the environment string, e.g. "0") and block size
// blockSize tokens. An empty seed is an error: without PYTHONHASHSEED vLLM
// seeds its root randomly per process, and nobody can reproduce its
// hashes.
func NewHasher(pythonHashSeed string, blockSize int) (*Hasher, error) {
	if pythonHashSeed == "" {
		return nil, fmt.Errorf("%w: PYTHONHASHSEED is required (vLLM's hashes are random without it)", ErrInvalidHasher)
	}
	if blockSize <= 0 {
		return nil, fmt.Errorf("%w: block size %d is not positive", ErrInvalidHasher, blockSize)
	}
	var enc cborEncoder
	enc.text(pythonHashSeed)
	return &Hasher{root: sha256.Sum256(enc.buf), blockSize: blockSize}, nil
}

// BlockSize is the block size in tokens.
func (h *Hasher) BlockSize() int { return h.blockSize }

// BlockHashes returns the 64-bit hashes of the full blocks of tokens, in
// order: what the engine's KV events carry and what Lookup takes.
func (h *Hasher) BlockHashes(tokens []uint32, extras HashExtras) []uint64 {
	return h.AppendBlockHashes(make([]uint64, 0, len(tokens)/h.blockSize), tokens, extras)
}

// AppendBlockHashes appends the 64-bit block hashes of tokens to dst.
func (h *Hasher) AppendBlockHashes(dst []uint64, tokens []uint32, extras HashExtras) []uint64 {
	h.walk(tokens, extras, func(d *[sha256.Size]byte) {
		dst = append(dst, binary.BigEndian.Uint64(d[sha256.Size-8:]))
	})
	return dst
}

// BlockDigests returns the full 32-byte digests of the full blocks.
func (h *Hasher) BlockDigests(tokens []uint32, extras HashExtras) [][sha256.Size]byte {
	out := make([][sha256.Size]byte, 0, len(tokens)/h.blockSize)
	h.walk(tokens, extras, func(d *[sha256.Size]byte) { out = append(out, *d) })
	return out
}

// walk hashes the full blocks in order, reusing one encoding buffer.
func (h *Hasher) walk(tokens []uint32, extras HashExtras, emit func(*[sha256.Size]byte)) {
	var enc cborEncoder
	enc.buf = make([]byte, 0, 64+5*h.blockSize+len(extras.LoRAName)+len(extras.CacheSalt))
	parent := h.root
	for b := 0; (b+1)*h.blockSize <= len(tokens); b++ {
		enc.buf = enc.buf[:0]
		enc.head(majorArray, 3)
		enc.bytes(parent[:])
		enc.head(majorArray, uint64(h.blockSize))
		for _, t := range tokens[b*h.blockSize : (b+1)*h.blockSize] {
			enc.head(majorUint, uint64(t))
		}
		n := 0
		if extras.LoRAName != "" {
			n++
		}
		salt := b == 0 && extras.CacheSalt != ""
		if salt {
			n++
		}
		if n == 0 {
			enc.null()
		} else {
			enc.head(majorArray, uint64(n))
			if extras.LoRAName != "" {
				enc.text(extras.LoRAName)
			}
			if salt {
				enc.text(extras.CacheSalt)
			}
		}
		parent = sha256.Sum256(enc.buf)
		emit(&parent)
	}
}

// cborEncoder writes the few CBOR items vLLM's hash input uses, in
// canonical form (RFC 8949 §4.2.1: shortest heads, definite lengths), as
// Python's cbor2.dumps(..., canonical=True) does for them.
type cborEncoder struct{ buf []byte }

const (
	majorUint  = 0
	majorBytes = 2
	majorText  = 3
	majorArray = 4
)

func (e *cborEncoder) head(major byte, n uint64) {
	m := major << 5
	switch {
	case n < 24:
		e.buf = append(e.buf, m|byte(n))
	case n <= 0xff:
		e.buf = append(e.buf, m|24, byte(n))
	case n <= 0xffff:
		e.buf = append(e.buf, m|25)
		e.buf = binary.BigEndian.AppendUint16(e.buf, uint16(n))
	case n <= 0xffffffff:
		e.buf = append(e.buf, m|26)
		e.buf = binary.BigEndian.AppendUint32(e.buf, uint32(n))
	default:
		e.buf = append(e.buf, m|27)
		e.buf = binary.BigEndian.AppendUint64(e.buf, n)
	}
}

func (e *cborEncoder) bytes(b []byte) {
	e.head(majorBytes, uint64(len(b)))
	e.buf = append(e.buf, b...)
}

func (e *cborEncoder) text(s string) {
	e.head(majorText, uint64(len(s)))
	e.buf = append(e.buf, s...)
}

func (e *cborEncoder) null() { e.buf = append(e.buf, 0xf6) }
